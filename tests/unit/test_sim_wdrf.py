"""The simulator drives the controller's real `compute_plan`; its shortcuts change nothing.

- Tick skipping: only ticks after a change or at an aging step are evaluated; evaluating every
  tick gives identical admissions and writes.
- Incremental planning: only workloads whose inputs moved are re-planned, admitted work is
  summarised per team; planning everything every tick gives identical results.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

import controller.policy
from controller.config import Settings, with_overrides
from controller.domain import (
    GPU,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    Admission,
    ClusterQueue,
    ClusterSnapshot,
    Container,
    KueueApiVersion,
    LocalQueue,
    PodSet,
    ResourceQuota,
    Workload,
    frozen_resources,
)
from controller.sim import trace as tr
from controller.sim.engine import SimConfig, Simulation
from controller.sim.policies import Wdrf

EPOCH = datetime(2017, 10, 1, tzinfo=UTC)


def _jobs(seed: int) -> list[tr.SimJob]:
    trace = tr.generate_trace(seed, 350, teams=5, span=tr.DAY / 3)
    spec = tr.LabelSpec(seed=seed, urgent_share=0.1, approved_share=0.2, fractional_share=0.4)
    return tr.label_jobs(trace.jobs, spec)


def _run(jobs: list[tr.SimJob], settings: Settings, exact: bool, incremental: bool):  # type: ignore[no-untyped-def]
    cfg = SimConfig(nodes=4, exact_ticks=exact, check_invariants=True)
    return Simulation(jobs, cfg, Wdrf(settings, EPOCH, incremental=incremental)).run()


@pytest.mark.parametrize(
    "settings",
    [Settings(), with_overrides(Settings(), aging_coefficient=0.2),
     with_overrides(Settings(), usage_half_life=1800.0)],
    ids=["default", "aging0.2", "halflife"],
)
@pytest.mark.parametrize("seed", [1, 2])
def test_skipping_and_incremental_planning_change_nothing(settings: Settings, seed: int) -> None:
    jobs = _jobs(seed)
    exact = _run(jobs, settings, exact=True, incremental=False)
    fast = _run(jobs, settings, exact=False, incremental=True)
    full_plan = _run(jobs, settings, exact=False, incremental=False)
    assert exact.writes > 0
    for r in (fast, full_plan):
        assert r.admit == exact.admit
        assert r.writes == exact.write_times.__len__() == len(r.write_times)
        assert r.write_times == exact.write_times
    # The shortcuts are what make the full trace affordable.
    assert fast.ticks_evaluated <= exact.ticks_evaluated
    assert fast.extra["plan_workloads_mean"] < full_plan.extra["plan_workloads_mean"]


def test_calls_the_controllers_compute_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = controller.policy.compute_plan

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(a[2])
        return real(*a, **kw)

    monkeypatch.setattr("controller.sim.policies.compute_plan", spy)
    _run(_jobs(1)[:50], Settings(), exact=False, incremental=True)
    assert calls and all(isinstance(c, datetime) for c in calls)


def _workload(ns: str, name: str, gpus: int, pct: int | None, admitted: bool) -> Workload:
    res = {GPU: Decimal(gpus)}
    if pct is not None:
        res[GPUCORES] = Decimal(pct)
        res[GPUMEM_PERCENTAGE] = Decimal(pct)
    return Workload(
        namespace=ns, name=name, uid=name, api_version=KueueApiVersion.V1BETA2,
        queue_name="default", created=EPOCH,
        pod_sets=(PodSet("main", 1, (Container("main", frozen_resources(res)),)),),
        quota_reserved=admitted, admitted=admitted,
        admission=Admission("gpu", frozen_resources({GPU: Decimal(gpus)})) if admitted else None,
    )


def test_team_summary_has_the_same_usage_as_its_workloads() -> None:
    """The per-team admitted summary (GPU-percent as 1 % GPUs) gives the same shares."""
    cq = ClusterQueue("gpu", KueueApiVersion.V1BETA2,
                      quotas=(ResourceQuota("f", GPU, Decimal(16)),))
    lqs = (LocalQueue("a", "default", "gpu"), LocalQueue("b", "default", "gpu"))
    pending = (_workload("a", "p1", 1, None, False), _workload("b", "p2", 1, 25, False))
    admitted = (
        _workload("a", "w1", 2, None, True), _workload("a", "w2", 1, 25, True),
        _workload("a", "w3", 1, 50, True), _workload("b", "w4", 4, None, True),
    )
    w = Wdrf(Settings(), EPOCH)
    summary = (w._aggregate("a", 200 + 25 + 50), w._aggregate("b", 400))
    now = EPOCH + timedelta(hours=1)
    full = controller.policy.compute_plan(
        ClusterSnapshot(pending + admitted, (cq,), lqs), Settings(), now)
    short = controller.policy.compute_plan(
        ClusterSnapshot(pending + summary, (cq,), lqs), Settings(), now)
    assert [d.target_priority for d in full.decisions] == [
        d.target_priority for d in short.decisions
    ]
    for t in ("a", "b"):
        assert full.teams[t].dominant_share == short.teams[t].dominant_share
