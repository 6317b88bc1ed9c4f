"""HAMi decisions: source order, validation against what HAMi accepts, GPU fractions."""

from __future__ import annotations

import pytest

from controller.config import HamiRule, Settings, valid_gpu_policy
from controller.domain import (
    GPU_FRACTION_ANNOTATION,
    HAMI_GPU_POLICY_ANNOTATION,
    HAMI_NODE_POLICY_ANNOTATION,
    SCHEDULING_POLICY_ANNOTATION,
    URGENT_ANNOTATION,
)
from controller.hami import parse_fraction, parse_scheduling_policy
from controller.plan import WorkloadDecision
from controller.policy import compute_plan
from tests.support.builders import NOW, job, snapshot, wl
from tests.support.builders import settings as make_settings

FRACTIONAL = {"nvidia.com/gpucores": "25", "nvidia.com/gpumem-percentage": "25"}


def decide(w, s: Settings | None = None, jobs=()) -> WorkloadDecision:  # type: ignore[no-untyped-def]
    plan = compute_plan(snapshot([w], jobs=tuple(jobs)), s or Settings(), NOW)
    return plan.decisions[0]


@pytest.mark.parametrize(
    ("value", "pct"),
    [("0.5", 50), ("0.25", 25), ("1", 100), ("1.0", 100), (".75", 75), ("0.01", 1)],
)
def test_fraction_valid(value: str, pct: int) -> None:
    assert parse_fraction(value) == pct


@pytest.mark.parametrize("value", ["2", "abc", "0", "0.0", "-0.5", "0.333", "1.5", " 0.5",
                                   "50%", "1e-1", ""])
def test_fraction_invalid(value: str) -> None:
    assert parse_fraction(value) is None


@pytest.mark.parametrize("value", ["2", "abc", "0.333"])
def test_bad_fraction_is_a_problem_and_nothing_is_written(value: str) -> None:
    d = decide(wl("p", annotations={GPU_FRACTION_ANNOTATION: value}))
    assert not d.leave_unchanged and d.hami is None  # hint ignored, class still followed
    assert d.problems[0].field == f"metadata.annotations[{GPU_FRACTION_ANNOTATION}]"


def test_fraction_sets_cores_and_memory() -> None:
    d = decide(wl("p", annotations={GPU_FRACTION_ANNOTATION: "0.5"}))
    assert d.hami is not None and (d.hami.gpucores, d.hami.gpumem_percentage) == (50, 50)
    assert any("gpucores" in c for c in d.hami.changes)
    # fractional -> default rule packs it
    assert (d.hami.node_policy, d.hami.gpu_policy) == ("binpack", "binpack")


def test_fraction_on_cpu_only_workload_is_a_problem() -> None:
    d = decide(wl("p", gpu=None, resources={"cpu": "1"},
                  annotations={GPU_FRACTION_ANNOTATION: "0.5"}))
    assert not d.leave_unchanged and "requests no" in d.problems[0].message


def test_fraction_from_owner_job() -> None:
    d = decide(wl("p", owner="j"), jobs=[job("j", annotations={GPU_FRACTION_ANNOTATION: "0.25"})])
    assert d.hami is not None and d.hami.gpucores == 25


def test_own_valid_hami_annotations_are_kept() -> None:
    w = wl("p", resources=FRACTIONAL, owner="j")
    d = decide(w, jobs=[job("j", template_annotations={HAMI_NODE_POLICY_ANNOTATION: "spread",
                                                      HAMI_GPU_POLICY_ANNOTATION: "spread"})])
    assert d.hami is not None
    assert (d.hami.node_policy, d.hami.gpu_policy) == ("spread", "spread")
    assert d.hami.changes == ()  # already there: nothing to write


@pytest.mark.parametrize(
    ("key", "value"),
    [(HAMI_NODE_POLICY_ANNOTATION, "Spread"), (HAMI_NODE_POLICY_ANNOTATION, "topology-aware"),
     (HAMI_GPU_POLICY_ANNOTATION, "fastest"), (HAMI_GPU_POLICY_ANNOTATION, "binpack,binpack")],
)
def test_invalid_own_hami_annotation_is_a_problem(key: str, value: str) -> None:
    d = decide(wl("p", annotations={key: value}))
    assert not d.leave_unchanged and d.hami is None  # hint ignored, class still followed
    assert d.problems[0].field == f"metadata.annotations[{key}]" and "HAMi" in d.problems[0].message


def test_scheduling_policy_annotation_beats_rules() -> None:
    d = decide(wl("p", resources=FRACTIONAL, annotations={SCHEDULING_POLICY_ANNOTATION: "spread"}))
    assert d.hami is not None and (d.hami.node_policy, d.hami.gpu_policy) == ("spread", "spread")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("binpack", ("binpack", "binpack")), ("topology-aware", (None, "topology-aware")),
     ("node=spread;gpu=binpack,numa", ("spread", "binpack,numa")), ("gpu=mutex", (None, "mutex")),
     ("yes", None), ("node=fast", None), ("node=spread;node=binpack", None), (" binpack", None)],
)
def test_parse_scheduling_policy(value: str, expected: object) -> None:
    assert parse_scheduling_policy(value, "v2.10") == expected


def test_gpu_policies_depend_on_hami_version() -> None:
    assert valid_gpu_policy("binpack,numa", "v2.10")
    assert not valid_gpu_policy("binpack,numa", "v2.9")
    assert valid_gpu_policy("topology-aware", "v2.7")
    assert not valid_gpu_policy("topology-aware", "v2.6")


def test_rules_by_class_and_queue_and_defaults() -> None:
    s = make_settings(
        hami_rules=(HamiRule(priority_class="urgent", node_policy="spread"),
                    HamiRule(local_queue="default", gpu_policy="topology-aware")),
        hami_default_node_policy="binpack",
    )
    urgent = decide(wl("p", annotations={URGENT_ANNOTATION: "true"}), s)
    normal = decide(wl("p"), s)
    assert urgent.hami is not None and normal.hami is not None
    assert (urgent.hami.node_policy, urgent.hami.gpu_policy) == ("spread", "topology-aware")
    assert (normal.hami.node_policy, normal.hami.gpu_policy) == ("binpack", "topology-aware")
    assert "HAMI_RULES[0]" in urgent.hami.reason


def test_whole_gpu_workload_gets_no_default_decision() -> None:
    assert decide(wl("p")).hami is None
    assert decide(wl("p", resources=FRACTIONAL)).hami is not None


def test_cpu_only_workload_has_no_hami_decision() -> None:
    assert decide(wl("p", gpu=None, resources={"cpu": "2"})).hami is None


def test_the_plan_says_when_a_fraction_must_not_be_written() -> None:
    """Kueue's quota check is part of the snapshot: under BlockUndeclared (its default) a
    fraction the ClusterQueue does not cover is blocked in the plan itself; unknown (an offline
    snapshot) or IgnoreUndeclared: written."""
    import dataclasses

    from controller.domain import QuotaCheck

    w = wl("p", annotations={GPU_FRACTION_ANNOTATION: "0.25"})  # the ClusterQueue: gpu, cpu

    def blocked(quota: QuotaCheck | None) -> str:
        snap = dataclasses.replace(snapshot([w]), quota_check=quota)
        hami = compute_plan(snap, Settings(), NOW).decisions[0].hami
        assert hami is not None and hami.gpucores == 25
        return hami.fraction_blocked

    assert blocked(None) == ""
    assert blocked(QuotaCheck(ignore_undeclared=True)) == ""
    assert blocked(QuotaCheck(transformed=frozenset(
        {"nvidia.com/gpucores", "nvidia.com/gpumem-percentage"}))) == ""
    reason = blocked(QuotaCheck())
    assert reason.startswith("ClusterQueue cq does not cover nvidia.com/gpucores, "
                             "nvidia.com/gpumem-percentage; with Kueue's quotaCheckStrategy "
                             "BlockUndeclared"), reason
