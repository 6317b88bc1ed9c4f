"""The Kueue model (evaluation/kueue.py), mechanism by mechanism, against Kueue's documented
behaviour (Kueue concepts "Preemption", "Cluster Queue", "Setup All-or-nothing with
waitForPodsReady"; docs/evaluation.md, "The Kueue model"), plus the conservation and completed-once
invariants with preemption."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from controller.domain import PriorityClass
from evaluation import trace as tr
from evaluation.engine import SimConfig, SimResult
from evaluation.kueue import (
    COHORT,
    FINAL_SHARE,
    INITIAL_SHARE,
    PLACEMENT,
    PODS_READY_TIMEOUT,
    PREEMPTED,
    KueueConfig,
    KueueSim,
)
from evaluation.policies import AfsModel, DrfIdeal, Fifo, Policy, StaticClasses

U, A, N = PriorityClass.URGENT, PriorityClass.APPROVED, PriorityClass.NORMAL


def job(i: int, submit: float, duration: float, gpus: int = 1, team: str = "a",
        cls: PriorityClass = N, pct: int = 100) -> tr.SimJob:
    pods, per_pod = tr.pod_layout(gpus, 8)
    return tr.SimJob(i, submit, duration, team, cls, pods, per_pod, pct)


def run(jobs: Sequence[tr.SimJob], k: KueueConfig, policy: Policy | None = None,
        nodes: int = 1) -> SimResult:
    cfg = SimConfig(nodes=nodes, check_invariants=True)
    return KueueSim(jobs, cfg, k, policy or StaticClasses()).run()


def conserved(r: SimResult) -> bool:
    need = sum(j.need * j.duration for j in r.jobs)
    return abs(sum(r.series.total) - need - r.lost) <= 1e-6 * need


# -- admission on quota, the scheduler, waitForPodsReady -----------------------------------------

def fragmented() -> list[tr.SimJob]:
    # Eight half-GPU jobs spread one per card (HAMi GPU policy spread) take 4 GPUs of quota
    # but leave no whole card: a 4-GPU job fits the quota, not the node.
    jobs = [job(i, 0.0, 1000.0, pct=50) for i in range(8)]
    jobs.append(job(8, 10.0, 500.0, gpus=4, team="b"))
    return jobs


def test_quota_admission_waits_for_pods_then_times_out_with_kueue_backoff() -> None:
    r = run(fragmented(), KueueConfig())
    ev = [(e.time, e.reason) for e in r.evictions if e.job_id == 8]
    # Admitted at 10 on quota; not running 300 s later -> evicted; requeued after 60 s
    # (backoffBaseSeconds), admitted at 370, evicted at 670, requeued after 120 s (x 2^(n-1)),
    # admitted at 790: its pods run when the fractions end at 1000, inside the timeout.
    assert ev == [(310.0, PODS_READY_TIMEOUT), (670.0, PODS_READY_TIMEOUT)]
    assert r.quota_admissions[8] == 3
    assert r.admit[8] == 1000.0
    assert r.evictions and all(e.lost == 0 for e in r.evictions)  # never ran: nothing lost
    assert conserved(r)


def test_pods_start_as_soon_as_gpus_free_within_the_timeout() -> None:
    jobs = [job(i, 0.0, 100.0, pct=50) for i in range(8)] + [job(8, 10.0, 50.0, gpus=4)]
    r = run(jobs, KueueConfig())
    assert r.evictions == []
    assert r.admit[8] == 100.0  # admitted at 10, its pods run when the fractions end


def test_placement_admission_admits_only_what_the_scheduler_can_place() -> None:
    r = run(fragmented(), KueueConfig(admission=PLACEMENT))
    assert r.evictions == []
    assert r.quota_admissions[8] == 1
    assert r.admit[8] == 1000.0


def test_requeue_timestamp_creation_keeps_the_queue_position() -> None:
    k = KueueConfig(requeue_timestamp="Creation")
    sim = KueueSim(fragmented(), SimConfig(nodes=1), k, Fifo())
    sim.run()
    assert sim.qts[8] == 10.0
    sim = KueueSim(fragmented(), SimConfig(nodes=1), KueueConfig(), Fifo())
    sim.run()
    assert sim.qts[8] > 10.0  # Eviction (Kueue's default): the eviction time


# -- queueing strategies ---------------------------------------------------------------------------

def test_best_effort_fifo_skips_a_head_that_does_not_fit_strict_fifo_blocks() -> None:
    jobs = [job(0, 0.0, 100.0, gpus=4), job(1, 1.0, 100.0, gpus=8), job(2, 2.0, 100.0, gpus=2)]
    best = run(jobs, KueueConfig(admission=PLACEMENT))
    assert best.admit[2] == 2.0
    strict = run(jobs, KueueConfig(admission=PLACEMENT, queueing_strategy="StrictFIFO"))
    assert strict.admit[1] == 100.0 and strict.admit[2] == 200.0


# -- preemption within a ClusterQueue ------------------------------------------------------------

def test_lower_priority_preempts_strictly_lower_priority_only() -> None:
    jobs = [job(0, 0.0, 1000.0, gpus=8), job(1, 100.0, 500.0, gpus=8, cls=U),
            job(2, 200.0, 100.0, gpus=8, cls=U)]
    r = run(jobs, KueueConfig(within_cluster_queue="LowerPriority"))
    assert [(e.time, e.job_id, e.reason, e.by) for e in r.evictions] == [
        (100.0, 0, PREEMPTED, 1)
    ]  # urgent job 2 does not preempt urgent job 1 (equal priority)
    assert r.admit[1] == 100.0 and r.admit[2] == 600.0
    assert r.evictions[0].lost == 100.0 * 800  # no checkpoint within 100 s: all of it lost
    assert r.end[0] == 700.0 + 1000.0  # resumed from scratch after both urgent jobs
    assert conserved(r)
    never = run(jobs, KueueConfig())
    assert never.evictions == [] and never.admit[1] == 1000.0


def test_lower_or_newer_equal_priority_preempts_a_newer_equal_workload() -> None:
    # x (4 GPUs) runs; o (6 GPUs) waits; n (4 GPUs, created after o) fits and runs. When x
    # ends, o may preempt n (same priority, newer) only under LowerOrNewerEqualPriority.
    jobs = [job(0, 0.0, 100.0, gpus=4), job(1, 10.0, 5000.0, gpus=6),
            job(2, 20.0, 5000.0, gpus=4)]
    lower = run(jobs, KueueConfig(within_cluster_queue="LowerPriority"))
    assert lower.evictions == [] and lower.admit[1] == 5020.0
    newer = run(jobs, KueueConfig(within_cluster_queue="LowerOrNewerEqualPriority"))
    assert [(e.time, e.job_id, e.by) for e in newer.evictions] == [(100.0, 2, 1)]
    assert newer.admit[1] == 100.0


def test_victims_lowest_priority_then_most_recent_and_minimal_set() -> None:
    sim = KueueSim([job(0, 0.0, 1e4, gpus=4), job(1, 0.0, 1e4, gpus=2),
                    job(2, 0.0, 1e4, gpus=2, cls=A), job(3, 0.0, 1e4, gpus=4, cls=U)],
                   SimConfig(nodes=1), KueueConfig(within_cluster_queue="LowerPriority"),
                   StaticClasses())
    sim.policy.reset(sim)
    cq = sim.cqs["gpu"]
    for jid, t in ((0, 0.0), (1, 10.0), (2, 20.0)):
        sim.now = t
        sim._enqueue(sim.jobs[jid])
        sim._reserve(sim.jobs[jid], cq)
    sim.now = 30.0
    cands = sim._candidates(sim.jobs[3], cq, borrowing=False)
    assert [j for j, _ in cands] == [1, 0, 2]  # normal before approved; newest normal first
    targets = sim._classic_targets(sim.jobs[3], cq)
    assert targets is not None and [j for j, _ in targets] == [0]  # 1 dropped when minimising


def test_checkpoint_interval_bounds_the_lost_work() -> None:
    jobs = [job(0, 0.0, 10000.0, gpus=8), job(1, 4000.0, 100.0, gpus=8, cls=U)]
    r = run(jobs, KueueConfig(within_cluster_queue="LowerPriority", checkpoint_interval=1800.0))
    (e,) = r.evictions
    assert e.lost == 400.0 * 800  # 4000 s ran, 3600 s checkpointed
    assert r.end[0] == 4100.0 + (10000.0 - 3600.0)
    assert conserved(r)


# -- cohorts -------------------------------------------------------------------------------------

def borrowed_cohort() -> list[tr.SimJob]:
    # Team a fills the cluster (8 x 1 GPU; nominal 4 each): it borrows 4 of b's quota.
    jobs = [job(i, float(i), 5000.0, team="a") for i in range(8)]
    jobs.append(job(8, 100.0, 100.0, gpus=4, team="b"))
    return jobs


def test_nominal_quotas_follow_team_weights_and_add_up() -> None:
    jobs = [job(0, 0.0, 1.0, team="a"), job(1, 0.0, 1.0, team="b"), job(2, 0.0, 1.0, team="c")]
    sim = KueueSim(jobs, SimConfig(nodes=1), KueueConfig(
        topology=COHORT, team_weights={"a": 4.0, "b": 2.0, "c": 1.0}), Fifo())
    quotas = {c.name: c.nominal for c in sim.cqs.values()}
    assert sum(quotas.values()) == 800
    assert quotas["cq-a"] == 457 and quotas["cq-b"] == 229 and quotas["cq-c"] == 114


def test_borrowing_and_reclaim_within_cohort() -> None:
    jobs = borrowed_cohort()
    never = run(jobs, KueueConfig(topology=COHORT))
    assert [r for r in never.admit[:8]] == [float(i) for i in range(8)]  # borrows freely
    assert never.admit[8] == 5003.0 and never.evictions == []
    reclaim = run(jobs, KueueConfig(topology=COHORT, reclaim_within_cohort="Any"))
    assert reclaim.admit[8] == 100.0
    # four of a's workloads, the most recently admitted first
    assert sorted(e.job_id for e in reclaim.evictions) == [4, 5, 6, 7]
    assert all(e.by == 8 for e in reclaim.evictions)
    assert conserved(reclaim)


def test_reclaim_lower_priority_needs_a_lower_priority_victim() -> None:
    r = run(borrowed_cohort(), KueueConfig(topology=COHORT, reclaim_within_cohort="LowerPriority"))
    assert r.evictions == []


def test_a_borrowing_preemptor_needs_borrow_within_cohort() -> None:
    # Nominal quotas a 2, b 2, c 4 GPUs; c idle (lends). a runs 6 GPUs (borrows 4), b its 2;
    # b's urgent 2-GPU job would borrow: only borrowWithinCohort lets it preempt a.
    jobs = [job(0, 0.0, 1.0, team="c")]
    jobs += [job(1 + i, 10.0 + i, 5000.0, team="a") for i in range(6)]
    jobs += [job(7 + i, 20.0 + i, 5000.0, team="b") for i in range(2)]
    jobs.append(job(9, 100.0, 100.0, gpus=2, team="b", cls=U))
    w = {"c": 2.0}
    base = KueueConfig(topology=COHORT, reclaim_within_cohort="Any", team_weights=w)
    assert run(jobs, base).evictions == []  # it would borrow: reclaim alone does not allow it
    borrow = KueueConfig(topology=COHORT, reclaim_within_cohort="Any",
                         borrow_within_cohort="LowerPriority", team_weights=w)
    r = run(jobs, borrow)
    assert sorted(e.job_id for e in r.evictions) == [5, 6] and r.admit[9] == 100.0
    capped = KueueConfig(topology=COHORT, reclaim_within_cohort="Any",
                         borrow_within_cohort="LowerPriority", borrow_max_priority=0,
                         team_weights=w)
    assert run(jobs, capped).evictions == []  # victims above maxPriorityThreshold


def test_reclaim_stops_at_a_queue_that_no_longer_borrows() -> None:
    # a borrows 1 GPU; b (within nominal) needs 2 with nothing free: taking a second GPU from a
    # would take a below its nominal quota, which Kueue never does.
    jobs = [job(i, float(i), 5000.0, team="a") for i in range(5)]
    jobs += [job(5 + i, 10.0 + i, 5000.0, team="b") for i in range(3)]
    jobs.append(job(8, 100.0, 100.0, gpus=2, team="b", cls=U))
    r = run(jobs, KueueConfig(topology=COHORT, reclaim_within_cohort="Any"))
    assert r.evictions == []


def test_classical_admission_prefers_non_borrowing_then_priority() -> None:
    # One free GPU: a (borrowing) and b (within nominal) both want it at the same instant.
    jobs = [job(i, 0.0, 1000.0, team="a") for i in range(4)]
    jobs += [job(4 + i, 0.0, 1000.0, team="b") for i in range(3)]
    jobs += [job(7, 10.0, 100.0, team="a", cls=U), job(8, 10.0, 100.0, team="b")]
    r = run(jobs, KueueConfig(topology=COHORT))
    assert r.admit[8] == 10.0 and r.admit[7] == 110.0


def test_fair_sharing_orders_by_share_and_reclaims_by_strategy() -> None:
    # a borrows 4 GPUs of b's; c (weight 1) idle at first.
    jobs = [job(i, float(i), 5000.0, team="a") for i in range(6)]
    jobs += [job(6 + i, 10.0, 5000.0, team="c") for i in range(2)]
    jobs.append(job(8, 100.0, 100.0, team="b", gpus=2))
    fs = KueueConfig(topology=COHORT, fair_sharing=True, within_cluster_queue="LowerPriority",
                     reclaim_within_cohort="Any")
    sim = KueueSim(jobs, SimConfig(nodes=1, check_invariants=True), fs, StaticClasses())
    r = sim.run()
    # b (within nominal 2.67 GPUs) reclaims from a, whose share is the highest (borrowing most)
    assert r.admit[8] == 100.0
    assert {e.job_id for e in r.evictions} <= set(range(6))
    assert conserved(r)
    # The share value: usage above nominal over the cohort's lendable quota, x1000 / weight.
    cq = sim.cqs["cq-a"]
    cq.used = cq.nominal + 80
    assert sim.share(cq) == pytest.approx(80 * 1000 / 800)



def test_fair_sharing_share_is_zero_within_nominal_and_divided_by_the_weight() -> None:
    """fairness-anchors.md, Kueue: a ClusterQueue's share counts only usage above its nominal
    quota, over what the cohort can lend, divided by its fairSharing.weight; zero within
    quota."""
    jobs = [job(0, 0.0, 1.0, team="a"), job(1, 0.0, 1.0, team="b")]
    sim = KueueSim(jobs, SimConfig(nodes=1), KueueConfig(
        topology=COHORT, fair_sharing=True, team_weights={"a": 3.0, "b": 1.0}), Fifo())
    a, b = sim.cqs["cq-a"], sim.cqs["cq-b"]
    assert (a.nominal, b.nominal) == (600, 200)  # 8 GPUs (in GPU percent) by weight 3:1
    a.used = 600
    assert sim.share(a) == 0.0  # at nominal: lends nothing, borrows nothing
    assert sim.share(a, 100) == pytest.approx(100 * 1000 / 800 / 3.0)  # above: / weight 3
    b.used = 300
    assert sim.share(b) == pytest.approx(100 * 1000 / 800 / 1.0)


def reclaim_by_share() -> list[tr.SimJob]:
    """8 GPUs, three teams of weight 1 (nominal 2.67 GPUs each): a runs one 5-GPU job, b three
    1-GPU jobs, c is idle; then b asks for one more GPU. With it b is 1.33 GPUs above its
    nominal; a is 2.33 above before losing its job and 0 after."""
    jobs = [job(0, 0.0, 1.0, team="c"), job(1, 2.0, 5000.0, gpus=5, team="a")]
    jobs += [job(2 + i, 3.0 + i, 5000.0, team="b") for i in range(3)]
    jobs.append(job(5, 100.0, 100.0, team="b"))
    return jobs


@pytest.mark.parametrize(("strategies", "reclaims"), [
    ((FINAL_SHARE,), False),  # b would end above a (1.33 > 0): not allowed
    ((FINAL_SHARE, INITIAL_SHARE), True),  # then: b with it (1.33) below a before (2.33)
    ((INITIAL_SHARE,), True),
])
def test_fair_sharing_reclaims_by_final_then_initial_share(
    strategies: tuple[str, ...], reclaims: bool,
) -> None:
    """fairness-anchors.md, Kueue: `LessThanOrEqualToFinalShare` lets a reclaim through only
    where it leaves the reclaimer at or below the victim's share after it; then
    `LessThanInitialShare` only where the reclaimer (with its workload) is below the victim's
    share before it."""
    k = KueueConfig(topology=COHORT, fair_sharing=True, within_cluster_queue="LowerPriority",
                    reclaim_within_cohort="Any", fair_sharing_strategies=strategies)
    r = run(reclaim_by_share(), k)
    if reclaims:
        assert [(e.job_id, e.by) for e in r.evictions] == [(1, 5)] and r.admit[5] == 100.0
    else:
        assert r.evictions == [] and r.admit[5] > 5000.0
    assert conserved(r)


def test_fair_sharing_never_reclaims_from_a_queue_not_above_the_reclaimer() -> None:
    """Neither strategy takes from a ClusterQueue whose share is at or below the reclaimer's
    with its workload: a runs 4 GPUs (1.33 above nominal), b 4 and asks for a fifth (2.33)."""
    jobs = [job(0, 0.0, 1.0, team="c"), job(1, 2.0, 5000.0, gpus=4, team="a")]
    jobs += [job(2 + i, 3.0 + i, 5000.0, team="b") for i in range(4)]
    jobs.append(job(6, 100.0, 100.0, team="b"))
    k = KueueConfig(topology=COHORT, fair_sharing=True, within_cluster_queue="LowerPriority",
                    reclaim_within_cohort="Any")
    r = run(jobs, k)
    assert r.evictions == [] and r.admit[6] > 5000.0

# -- invariants over a generated trace -----------------------------------------------------------

@pytest.mark.parametrize("k", [
    KueueConfig(),
    KueueConfig(admission=PLACEMENT, within_cluster_queue="LowerPriority"),
    KueueConfig(within_cluster_queue="LowerPriority", checkpoint_interval=600.0),
    KueueConfig(topology=COHORT, within_cluster_queue="LowerPriority",
                reclaim_within_cohort="Any", team_weights={"team-0": 3.0}),
    KueueConfig(topology=COHORT, fair_sharing=True, within_cluster_queue="LowerPriority",
                reclaim_within_cohort="Any"),
    KueueConfig(topology=COHORT, queueing_strategy="StrictFIFO"),
], ids=["quota", "placement-lp", "quota-lp", "cohort-reclaim", "fair-sharing", "strict"])
@pytest.mark.parametrize("policy", [StaticClasses, AfsModel, DrfIdeal])
def test_every_job_completes_once_and_gpu_time_is_conserved(
    k: KueueConfig, policy: type[Policy]
) -> None:
    trace = tr.generate_trace(5, 250, teams=3, span=tr.DAY / 2)
    jobs = tr.label_jobs(trace.jobs, tr.LabelSpec(seed=3, urgent_share=0.1))
    r = run(jobs, k, policy(), nodes=3)
    assert r.admissions == [1] * len(jobs)  # every job finished exactly once
    assert all(not math.isnan(e) for e in r.end)
    assert conserved(r)  # sum(need x duration) + lost work == GPU-time given
    evicted: dict[int, int] = {}
    for e in r.evictions:
        evicted[e.job_id] = evicted.get(e.job_id, 0) + 1
    for j in jobs:  # admitted once more per eviction
        assert r.quota_admissions[j.job_id] == 1 + evicted.get(j.job_id, 0)
    assert r.lost == sum(e.lost for e in r.evictions)
    if not k.preempts:
        assert all(e.reason == PODS_READY_TIMEOUT for e in r.evictions)
