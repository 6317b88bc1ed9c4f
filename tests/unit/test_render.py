"""Rendering plans and explain text."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest
import yaml

from controller.config import Settings
from controller.domain import (
    GPU_FRACTION_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
)
from controller.policy import compute_plan
from controller.render import _amount, breakdown_dict, explain, json_text, plan_dict, render
from tests.support.builders import NOW, snapshot, wl


def _plan():  # type: ignore[no-untyped-def]
    items = [
        wl("run", "team-b", admitted=True, resources={"cpu": "8"}),
        wl("u", annotations={URGENT_ANNOTATION: "true"}, wait=60),
        wl("n", wait=3600),
        wl("f", "team-b", wait=60, annotations={GPU_FRACTION_ANNOTATION: "0.25"}),
        wl("bad", annotations={URGENT_ANNOTATION: "TRUE"}),
        wl("o", annotations={PRIORITY_OVERRIDE_ANNOTATION: "5"}),
    ]
    return compute_plan(snapshot(items), Settings(), NOW)


def test_table_has_every_decision_in_order_and_the_problems() -> None:
    plan = _plan()
    text = render(plan, "table", Settings(), width=120)
    rows = [line.split()[1] for line in text.splitlines()
            if line[:1].isdigit() or line.startswith("- ")]
    assert rows == [d.key for d in plan.decisions]
    assert max(len(line) for line in text.splitlines()) <= 120
    words = " ".join(text.split())
    assert "left unchanged, bad metadata.annotations[wdrf.x-k8s.io/urgent]" in words
    assert "Problems (1)" in text and "'TRUE'" in text
    assert "cores=25" in text and "override 5" in text
    assert "Starvation bound" in text


def test_table_says_terms_in_words_and_positions_from_one() -> None:
    plan = _plan()
    text = render(plan, "table", Settings(), width=120)
    pending = [d for d in plan.decisions if not d.admitted]
    positions = [line.split()[0] for line in text.splitlines() if line[:1].isdigit()]
    assert positions == [str(d.rank + 1) for d in pending] and positions[0] == "1"
    n = next(d for d in plan.decisions if d.key == "team-a/n")
    assert n.breakdown is not None
    row = next(line for line in text.splitlines() if " team-a/n " in line)
    assert row.split()[2:4] == ["normal", "1h"]  # class and wait in words
    assert f"{n.breakdown.dominant_share:.2f}" in row
    # the encoded terms are not in the table; they are in the JSON and in explain
    assert str(n.breakdown.aging_term) not in text and "age " not in text
    assert str(n.breakdown.aging_term) in render(plan, "json")
    assert str(n.breakdown.aging_term) in explain(plan, "team-a/n", Settings())
    assert sum(1 for line in text.splitlines() if line.startswith("POS 1 = ")) == 1


def test_table_fills_the_width_and_never_cuts_a_key() -> None:
    plan = _plan()
    key = "metadata.annotations[wdrf.x-k8s.io/urgent]"
    wide = render(plan, "table", Settings(), width=220)
    narrow = render(plan, "table", Settings(), width=80)
    assert max(len(line) for line in wide.splitlines()) > 120  # uses a wide terminal
    assert len(wide.splitlines()) < len(narrow.splitlines())
    for text in (wide, narrow):
        assert key in text and "~" not in text
        assert all(d.key in text for d in plan.decisions)
    # every line of the narrow table fits, except a single word longer than the width
    assert all(len(line) <= 80 or " " not in line.strip() for line in narrow.splitlines())


def test_terms_the_renderer_does_not_know_are_shown_not_dropped() -> None:
    plan = _plan()
    d = next(x for x in plan.decisions if x.key == "team-a/n")
    odd = replace(d, terms=d.terms + " state=exposed for=team-b")
    text = render(replace(plan, decisions=(odd,)), "table", Settings(), width=160)
    row = next(line for line in text.splitlines() if " team-a/n " in line)
    assert "exposed" in row and "for team-b" in row


def test_breakdown_dict_has_every_field() -> None:
    plan = _plan()
    b = next(d for d in plan.decisions if d.breakdown is not None).breakdown
    assert b is not None
    doc = breakdown_dict(b, plan.now)
    assert len(doc) == len(fields(b)) + 1 and doc["class"] == b.priority_class.value
    assert doc["waitSeconds"] == (plan.now - b.queued_since).total_seconds()
    assert doc["queuedSince"] == b.queued_since.isoformat() and "agingTerm" in doc


def test_memory_of_a_flavor_is_in_gibibytes() -> None:
    assert _amount("h100:memory", 128 * 2**30) == "128Gi"
    assert _amount("memory", 1.5 * 2**30) == "1.5Gi"
    assert _amount("h100:nvidia.com/gpu", 4) == "4 GPU"


def test_json_and_yaml_are_the_same_document() -> None:
    plan = _plan()
    a = json.loads(render(plan, "json"))
    b = yaml.safe_load(render(plan, "yaml"))
    assert a == b == json.loads(json.dumps(plan_dict(plan)))
    assert [d["rank"] for d in a["decisions"]] == list(range(len(plan.decisions)))
    assert json.loads(render(plan, "json"), parse_constant=_no_constants)


def _no_constants(name: str) -> None:
    raise AssertionError(f"not strict JSON: {name}")


def test_explain_neighbours_and_units() -> None:
    plan = _plan()
    first = plan.decisions[0].key
    text = explain(plan, first, Settings())
    assert "First in its ClusterQueue" in text and "Ahead of" in text
    text = explain(plan, "team-b/f", Settings())
    assert "share cpu: 8 / 64" in text and "1 GPU / 8 GPU" in text and "Behind" in text
    assert "gpucores=25" in text
    assert "not a Workload this plan decides" in explain(plan, "x/y", Settings())


def test_empty_plan_renders() -> None:
    plan = compute_plan(snapshot([]), Settings(), NOW)
    assert "(no pending workloads)" in render(plan, "table", Settings())
    assert json.loads(render(plan, "json"))["decisions"] == []


def test_json_is_the_text_json_dumps_gives() -> None:
    """Written piece by piece (memory), the same text as `json.dumps` to the byte."""
    plan = _plan()
    assert render(plan, "json") == json.dumps(plan_dict(plan), indent=2, allow_nan=False)
    doc = {"b": [1, 2.5, None, True, {"é": "ü", "n": []}], "a": NOW, "e": {}}
    assert json_text(doc, default=str) == json.dumps(doc, indent=2, allow_nan=False,
                                                     default=str)
    with pytest.raises(ValueError):
        json_text({"x": float("nan")})
