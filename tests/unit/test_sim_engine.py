"""Simulator invariants on small generated traces: every job admitted exactly once, no GPU ever
over-committed, GPU-time conserved, BestEffortFIFO semantics, determinism."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from controller.config import Settings
from controller.domain import PriorityClass
from controller.sim import trace as tr
from controller.sim.engine import SimConfig, SimResult, Simulation
from controller.sim.metrics import compute
from controller.sim.policies import AfsModel, DrfIdeal, Fifo, Policy, StaticClasses, Wdrf

EPOCH = datetime(2017, 10, 1, tzinfo=UTC)


def _policies() -> list[Policy]:
    return [Fifo(), StaticClasses(), AfsModel(half_life=3600.0), DrfIdeal(),
            Wdrf(Settings(), EPOCH)]


def _jobs(seed: int, n: int = 300) -> list[tr.SimJob]:
    trace = tr.generate_trace(seed, n, teams=4, span=tr.DAY / 4)
    spec = tr.LabelSpec(seed=seed, urgent_share=0.1, approved_share=0.2, fractional_share=0.4)
    return tr.label_jobs(trace.jobs, spec)


def _run(jobs: list[tr.SimJob], policy: Policy, nodes: int = 4, **kw: object) -> SimResult:
    cfg = SimConfig(nodes=nodes, check_invariants=True, **kw)  # type: ignore[arg-type]
    return Simulation(jobs, cfg, policy).run()


@pytest.mark.parametrize("policy", _policies(), ids=lambda p: p.name)
@pytest.mark.parametrize("seed", [1, 2])
def test_invariants(policy: Policy, seed: int) -> None:
    jobs = _jobs(seed)
    r = _run(jobs, policy)
    # Every job admitted exactly once, after it was submitted, and ran for its duration.
    assert r.admissions == [1] * len(jobs)
    for j in jobs:
        assert r.admit[j.job_id] >= j.submit
        assert r.end[j.job_id] == pytest.approx(r.admit[j.job_id] + j.duration)
    # No GPU over-committed: cluster.check() ran after every event (it raises otherwise).
    assert r.overcommit_checks > len(jobs)
    # Conservation of GPU-time: what jobs asked for == the integral of what was allocated.
    asked = sum(j.need * j.duration for j in jobs)
    assert sum(r.series.total) == pytest.approx(asked, rel=1e-12)
    assert sum(sum(row) for row in r.series.alloc) == pytest.approx(asked, rel=1e-12)
    m = compute(r, tr.Period(0, tr.DAY / 4))
    assert m.admitted_once and m.gpu_time_error < 1e-12
    # Utilisation never above 1 in any window.
    assert max(m.util_series) <= 1.0 + 1e-12


def test_fractional_jobs_share_gpus_and_count_as_fractions() -> None:
    # Eight quarter-GPU jobs on a 1-node x 2-GPU cluster: all run at once on 2 cards.
    jobs = [tr.SimJob(i, 0.0, 100.0, "a", PriorityClass.NORMAL, 1, 1, 25) for i in range(8)]
    r = _run(jobs, Fifo(), nodes=1, node_gpus=2)
    assert all(a == 0.0 for a in r.admit)
    assert r.max_tenants == 4
    assert sum(r.series.total) == pytest.approx(8 * 25 * 100.0)  # 2 GPU-equivalents x 100 s


def test_best_effort_fifo_skips_a_head_that_does_not_fit() -> None:
    n = PriorityClass.NORMAL
    jobs = [
        tr.SimJob(0, 0.0, 100.0, "a", n, 1, 1, 100),  # takes one of two GPUs
        tr.SimJob(1, 1.0, 100.0, "a", n, 1, 2, 100),  # head: needs both GPUs, does not fit
        tr.SimJob(2, 2.0, 100.0, "b", n, 1, 1, 100),  # fits: admitted past the head
    ]
    r = _run(jobs, Fifo(), nodes=1, node_gpus=2)
    assert r.admit == [0.0, 102.0, 2.0]


def test_static_classes_admit_urgent_first() -> None:
    u, n = PriorityClass.URGENT, PriorityClass.NORMAL
    jobs = [
        tr.SimJob(0, 0.0, 50.0, "a", n, 1, 1, 100),  # occupies the only GPU
        tr.SimJob(1, 1.0, 50.0, "a", n, 1, 1, 100),
        tr.SimJob(2, 2.0, 50.0, "b", u, 1, 1, 100),
    ]
    assert _run(jobs, Fifo(), nodes=1, node_gpus=1).admit == [0.0, 50.0, 100.0]
    assert _run(jobs, StaticClasses(), nodes=1, node_gpus=1).admit == [0.0, 100.0, 50.0]


def test_wdrf_orders_by_plan_priority() -> None:
    """WDRF puts the urgent job first too, but only from its first controller cycle on."""
    u, n = PriorityClass.URGENT, PriorityClass.NORMAL
    jobs = [
        tr.SimJob(0, 0.0, 50.0, "a", n, 1, 1, 100),
        tr.SimJob(1, 1.0, 50.0, "a", n, 1, 1, 100),
        tr.SimJob(2, 2.0, 50.0, "b", u, 1, 1, 100),
    ]
    r = _run(jobs, Wdrf(Settings(), EPOCH), nodes=1, node_gpus=1)
    assert r.admit == [0.0, 100.0, 50.0]
    # Each waiting job got its boost written at the first cycle; job 1's again when its team's
    # usage (and so its fairness term) dropped at t=50.
    assert r.writes == 3
    assert r.extra["plan_calls"] >= 1


def test_drf_serves_the_team_with_the_lower_share() -> None:
    n = PriorityClass.NORMAL
    jobs = [
        tr.SimJob(0, 0.0, 100.0, "a", n, 1, 1, 100),
        tr.SimJob(1, 0.0, 50.0, "b", n, 1, 1, 100),
        tr.SimJob(2, 1.0, 100.0, "a", n, 1, 1, 100),  # earlier, but team a holds a GPU
        tr.SimJob(3, 2.0, 100.0, "b", n, 1, 1, 100),
    ]
    assert _run(jobs, DrfIdeal(), nodes=1, node_gpus=2).admit[3] == 50.0
    assert _run(jobs, Fifo(), nodes=1, node_gpus=2).admit[2] == 50.0


@pytest.mark.parametrize("policy_factory", [Fifo, DrfIdeal, lambda: Wdrf(Settings(), EPOCH)])
def test_deterministic(policy_factory) -> None:  # type: ignore[no-untyped-def]
    jobs = _jobs(3)
    a = _run(jobs, policy_factory())
    b = _run(_jobs(3), policy_factory())
    assert a.admit == b.admit and a.end == b.end and a.writes == b.writes
    assert a.series.total == b.series.total


def test_a_job_bigger_than_the_cluster_is_refused() -> None:
    big = [tr.SimJob(0, 0.0, 1.0, "a", PriorityClass.NORMAL, 2, 8, 100)]
    with pytest.raises(ValueError, match="capacity"):
        Simulation(big, SimConfig(nodes=1), Fifo())


def test_nothing_left_pending() -> None:
    r = _run(_jobs(4), StaticClasses())
    assert not any(math.isnan(a) for a in r.admit)
