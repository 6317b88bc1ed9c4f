"""Garbage in never crashes the parser or the policy: it becomes InputProblems."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.config import Settings
from controller.parse import build_snapshot
from controller.policy import compute_plan
from controller.render import render
from tests.support.builders import (
    NOW,
    as_list,
    cluster_queue_dict,
    job_dict,
    json_paths,
    local_queue_dict,
    set_at,
    workload_dict,
)

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["1Gi", "8Gi", "true", "yes", "-5", "1e12", "0.5", ""]),
)
junk = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


BASES = [
    workload_dict("w", annotations={"wdrf.x-k8s.io/urgent": "true"}, owner_job="j"),
    workload_dict("adm", admitted_to="cq", count=2),
    cluster_queue_dict(preemption={"withinClusterQueue": "LowerPriority"}),
    local_queue_dict("team-a"),
    job_dict("j", annotations={"wdrf.x-k8s.io/gpu-fraction": "0.5"}),
]


@FUZZ
@given(st.integers(0, len(BASES) - 1), st.data(), junk)
def test_mutated_objects_never_crash(which: int, data: st.DataObject, value: Any) -> None:
    obj = copy.deepcopy(BASES[which])
    paths = json_paths(obj)
    path = data.draw(st.sampled_from(paths))
    set_at(obj, path, value)
    others = [copy.deepcopy(b) for i, b in enumerate(BASES) if i != which]
    snap = build_snapshot([as_list(obj, *others)])
    # Every problem is a named field, not the parser's last-resort catch-all.
    assert not [p for p in snap.problems if p.field == "(object)"], snap.problems
    plan = compute_plan(snap, Settings(), NOW)
    render(plan, "table", Settings())
    render(plan, "json")


@FUZZ
@given(st.lists(junk, max_size=4))
def test_arbitrary_documents_never_crash(docs: list[Any]) -> None:
    snap = build_snapshot(docs)
    compute_plan(snap, Settings(), NOW)
