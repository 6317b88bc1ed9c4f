"""The Kueue model's scheduling cycles and inadmissible-workload requeues (evaluation/kueue.py)
against Kueue v0.19's scheduler: both were found by replaying a scenario on the real plane
(tests/plane/test_sim_vs_plane.py) and are checked here mechanism by mechanism.

- A scheduling cycle takes the head of every ClusterQueue once (pkg/scheduler/scheduler.go:
  `Heads`, then every entry in classical order). A ClusterQueue whose head did not fit offers
  its next workload only in the next cycle, after the other ClusterQueues' heads.
- A workload that did not fit is parked as inadmissible; released quota requeues the parked
  workloads of the cohort `requeueBatchPeriod` (1 s) later (pkg/cache/queue/
  inadmissible_workloads.go), but a changed priority (the `kueue.x-k8s.io/priority-boost`
  annotation, `spec.priority`) moves a workload back to the active queue at once
  (`ClusterQueue.PushOrUpdate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from controller.domain import PriorityClass
from evaluation import trace as tr
from evaluation.engine import SimConfig, SimResult
from evaluation.kueue import COHORT, KueueConfig, KueueSim
from evaluation.policies import DrfIdeal, Policy, StaticClasses

A, N = PriorityClass.APPROVED, PriorityClass.NORMAL


def job(i: int, submit: float, duration: float, gpus: int = 1, team: str = "a",
        cls: PriorityClass = N) -> tr.SimJob:
    return tr.SimJob(i, submit, duration, team, cls, 1, gpus, tr.PCT)


def run(jobs: Sequence[tr.SimJob], k: KueueConfig, policy: Policy | None = None,
        gpus: int = 4, loop: float = 10.0) -> SimResult:
    cfg = SimConfig(nodes=1, node_gpus=gpus, loop_interval=loop, exact_ticks=True,
                    check_invariants=True)
    return KueueSim(jobs, cfg, k, policy or StaticClasses()).run()


# -- one head per ClusterQueue per cycle ---------------------------------------------------------

def cross_queue() -> list[tr.SimJob]:
    # Cohort of 4 GPUs, nominal 2 each. x runs 1 GPU until 10; z borrows 1 (3 GPUs running).
    # Waiting: x's approved 2-GPU head (within nominal, but the cohort will have 1 GPU free),
    # then x's approved 1-GPU job, and z's normal 1-GPU job (z would borrow).
    return [job(0, 0.0, 10.0, team="x"), job(1, 0.0, 100.0, gpus=2, team="z"),
            job(2, 0.0, 100.0, team="z"),
            job(3, 1.0, 50.0, gpus=2, team="x", cls=A), job(4, 2.0, 50.0, team="x", cls=A),
            job(5, 3.0, 50.0, team="z")]


def test_a_failed_head_gives_the_cycle_to_the_other_cluster_queues_heads() -> None:
    # At 10 one GPU frees. The cycle's heads: x's 2-GPU job (non-borrowing, tried first, does
    # not fit) and z's job (borrowing, fits): Kueue admits z's job in that cycle, and x's
    # 1-GPU job, tried only in the next cycle, finds the cohort full - although it would
    # have gone before z's job had both been heads together (non-borrowing first, higher
    # priority).
    r = run(cross_queue(), KueueConfig(topology=COHORT))
    assert r.admit[5] == 10.0
    assert r.admit[4] == 60.0 and r.admit[3] == 100.0


def test_heads_of_one_cycle_are_tried_in_classical_order() -> None:
    # Same cluster, but z's waiting job is the one x's 1-GPU job would lose to in any case
    # (x's head fits): at 10 x's approved 1-GPU head is non-borrowing and goes first.
    jobs = cross_queue()
    jobs[3] = job(3, 1.0, 50.0, gpus=1, team="x", cls=A)
    r = run(jobs, KueueConfig(topology=COHORT))
    assert r.admit[3] == 10.0 and r.admit[5] > 10.0


# -- inadmissible workloads and the batched requeue ---------------------------------------------

class Rewrites(Policy):
    """A controller that writes new priorities at given cycle times (job id -> priority)."""

    name = "rewrites"
    controller = True

    def __init__(self, prio: Mapping[int, int], at: float, new: Mapping[int, int]) -> None:
        super().__init__()
        self.prio, self.at, self.new = dict(prio), at, dict(new)

    def priority(self, job: tr.SimJob) -> int:
        return self.prio[job.job_id]

    def tick(self, now: float) -> bool:
        if now != self.at:
            return False
        changed = any(self.prio[j] != p for j, p in self.new.items())
        self.prio.update(self.new)
        return changed


def parked() -> list[tr.SimJob]:
    # One GPU, busy until 10.5; a (job 1) and b (job 2) wait, a with the higher priority.
    return [job(0, 0.0, 10.5), job(1, 1.0, 10.0), job(2, 2.0, 10.0)]


def test_released_quota_reaches_parked_workloads_after_the_requeue_batch() -> None:
    k = KueueConfig(requeue_batch=1.0)
    r = run(parked(), k, Rewrites({0: 1, 1: 10, 2: 1}, -1.0, {}), gpus=1, loop=1.0)
    # a at the requeue 1 s after the release; b 1 s after a's end (21.5) as well.
    assert r.admit[1] == 11.5 and r.admit[2] == 22.5
    r0 = run(parked(), KueueConfig(), Rewrites({0: 1, 1: 10, 2: 1}, -1.0, {}), gpus=1,
             loop=1.0)
    assert r0.admit[1] == 10.5  # requeue_batch 0: at once, as before


def test_a_priority_written_in_the_batch_period_jumps_the_parked_queue() -> None:
    # The controller's cycle at 11 (after the release at 10.5, before the requeue at 11.5)
    # rewrites b - still below a - and b takes the GPU: it left the inadmissible list.
    k = KueueConfig(requeue_batch=1.0)
    r = run(parked(), k, Rewrites({0: 1, 1: 10, 2: 1}, 11.0, {2: 5}), gpus=1, loop=1.0)
    assert r.admit[2] == 11.0 and r.admit[1] == 22.0
    # The same write before the release changes nothing: the requeue orders by priority.
    r = run(parked(), k, Rewrites({0: 1, 1: 10, 2: 1}, 5.0, {2: 5}), gpus=1, loop=1.0)
    assert r.admit[1] == 11.5 and r.admit[2] == 22.5
    # And a cycle in the batch period that changes nothing does not unpark anything.
    r = run(parked(), k, Rewrites({0: 1, 1: 10, 2: 1}, 11.0, {2: 1}), gpus=1, loop=1.0)
    assert r.admit[1] == 11.5


def test_new_workloads_are_not_parked() -> None:
    # A workload arriving after the release, inside the batch period, takes the free GPU.
    jobs = [*parked(), job(3, 10.8, 10.0)]
    r = run(jobs, KueueConfig(requeue_batch=1.0), Rewrites({0: 1, 1: 10, 2: 1, 3: 0}, -1.0, {}),
            gpus=1, loop=1.0)
    assert r.admit[3] == 10.8 and r.admit[1] == 21.8


def test_requeue_batch_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="requeue batch"):
        KueueConfig(requeue_batch=-1.0)


@pytest.mark.parametrize("k", [
    KueueConfig(requeue_batch=1.0),
    KueueConfig(requeue_batch=10.0, within_cluster_queue="LowerPriority"),
    KueueConfig(topology=COHORT, requeue_batch=1.0, within_cluster_queue="LowerPriority",
                reclaim_within_cohort="Any"),
    KueueConfig(topology=COHORT, requeue_batch=1.0, fair_sharing=True,
                within_cluster_queue="LowerPriority", reclaim_within_cohort="Any"),
], ids=["quota", "quota-lp-10s", "cohort-reclaim", "fair-sharing"])
@pytest.mark.parametrize("policy", [StaticClasses, DrfIdeal])
def test_with_requeue_batches_every_job_completes_once_and_gpu_time_is_conserved(
    k: KueueConfig, policy: type[Policy]
) -> None:
    trace = tr.generate_trace(5, 250, teams=3, span=tr.DAY / 2)
    jobs = tr.label_jobs(trace.jobs, tr.LabelSpec(seed=3, urgent_share=0.1))
    r = KueueSim(jobs, SimConfig(nodes=2, check_invariants=True), k, policy()).run()
    assert r.admissions == [1] * len(jobs)
    need = sum(j.need * j.duration for j in jobs)
    assert abs(sum(r.series.total) - need - r.lost) <= 1e-6 * need
