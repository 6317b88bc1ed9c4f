"""Rendering plans and explain text."""

from __future__ import annotations

import json

import yaml
from wdrf_build import NOW, snapshot, wl

from controller.config import Settings
from controller.domain import (
    GPU_FRACTION_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
)
from controller.policy import compute_plan
from controller.render import explain, plan_dict, render


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
    text = render(plan, "table", Settings())
    rows = [line.split()[1] for line in text.splitlines()
            if line[:1].isdigit() or line.startswith("- ")]
    assert rows == [d.key for d in plan.decisions]
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "UNCHANGED" in text and "Problems (1)" in text and "'TRUE'" in text
    assert "cores=25" in text and "override 5" in text
    assert "Starvation bound" in text


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
