"""WDRF in the Kueue model: the controller's real `compute_plan`, its decisions written back as
the live controller writes them, and Kueue's preemption fed with them (pending *and* admitted
priorities)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import evaluation.wdrf as wdrf_module
from controller.config import Settings
from controller.domain import PriorityClass
from evaluation import trace as tr
from evaluation.engine import SimConfig, SimResult
from evaluation.kueue import COHORT, PREEMPTED, KueueConfig, KueueSim
from evaluation.wdrf import WdrfKueue

RANK = {PriorityClass.NORMAL: 0, PriorityClass.APPROVED: 1, PriorityClass.URGENT: 2}


def jobs(seed: int = 4, n: int = 220) -> list[tr.SimJob]:
    trace = tr.generate_trace(seed, n, teams=3, span=tr.DAY / 3)
    return tr.label_jobs(trace.jobs, tr.LabelSpec(seed=seed, urgent_share=0.1,
                                                  approved_share=0.2))


def run(js: Sequence[tr.SimJob], k: KueueConfig, **kw: bool) -> SimResult:
    trace = tr.generate_trace(4, 1)
    policy = WdrfKueue(Settings(), trace.epoch, **kw)
    return KueueSim(js, SimConfig(nodes=2, check_invariants=True), k, policy).run()


def test_calls_the_controllers_compute_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = wdrf_module.compute_plan

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(wdrf_module, "compute_plan", spy)
    r = run(jobs(n=60), KueueConfig())
    assert calls and r.extra["plan_calls"] == len(calls)
    assert r.writes == sum(r.job_writes) > 0


@pytest.mark.parametrize("k", [
    KueueConfig(within_cluster_queue="LowerPriority"),
    KueueConfig(topology=COHORT, within_cluster_queue="LowerPriority",
                reclaim_within_cohort="Any"),
], ids=["single-cq", "cohort"])
def test_team_summaries_of_admitted_work_change_nothing(k: KueueConfig) -> None:
    js = jobs()
    full = run(js, k, aggregate_admitted=False)
    agg = run(js, k, aggregate_admitted=True)
    assert full.admit == agg.admit and full.end == agg.end
    assert full.job_writes == agg.job_writes
    assert [(e.time, e.job_id) for e in full.evictions] == [
        (e.time, e.job_id) for e in agg.evictions
    ]


@pytest.mark.parametrize("topology", ["single-cq", "cohort"])
def test_preemption_sees_class_differences_once_the_guard_is_written(topology: str) -> None:
    """With withinClusterQueue LowerPriority, the plan's guards on admitted Workloads mean a
    Workload is preempted only by one of a higher class (urgent over approved and normal by
    default) - except in the LOOP_INTERVAL between Kueue's admission and the controller's next
    cycle, while the admitted Workload still carries its pending priority (a window the
    priority model cannot close; counted in the evaluation as same-class preemptions).
    Never does an evicted Workload preempt its preemptor back."""
    js = jobs(seed=6, n=300)
    k = KueueConfig(topology=topology, within_cluster_queue="LowerPriority")
    r = run(js, k)
    pre = [e for e in r.evictions if e.reason == PREEMPTED]
    assert pre, "the scenario should exercise preemption"
    loop = Settings().loop_interval
    for e in pre:
        victim, by = js[e.job_id], js[e.by]
        if RANK[by.cls] <= RANK[victim.cls]:
            assert e.time - e.admitted_at < loop, (e, victim, by)
    pairs = {(e.by, e.job_id) for e in pre}
    assert not any((b, a) in pairs for a, b in pairs)  # no ping-pong
    assert r.admissions == [1] * len(js)


def test_workloads_carry_their_reservation_time_and_kueues_preempted_condition() -> None:
    """As the parser reads them from Kueue's conditions: `reserved_since` from the admission
    (QuotaReserved=True), none while pending; `preempted_at` from the preemption, reset when
    the Workload is admitted again (Kueue sets Preempted=False then)."""
    seen: list[tuple[str, int, float | None, float | None, float | None]] = []
    epoch = tr.generate_trace(4, 1).epoch

    def rel(t: object) -> float | None:
        return None if t is None else (t - epoch).total_seconds()  # type: ignore[operator]

    class Spy(WdrfKueue):
        def on_admit(self, job: tr.SimJob, now: float) -> None:
            super().on_admit(job, now)
            w = self.wl[job.job_id]
            seen.append(("admit", job.job_id, rel(w.reserved_since), rel(w.preempted_at),
                         rel(w.last_eviction)))

        def on_evict(self, job: tr.SimJob, now: float, reason: str) -> None:
            super().on_evict(job, now, reason)
            w = self.wl[job.job_id]
            seen.append(("evict", job.job_id, rel(w.reserved_since), rel(w.preempted_at),
                         rel(w.last_eviction)))

    js = [tr.SimJob(0, 0.0, 1000.0, "a", PriorityClass.NORMAL, 1, 8, 100),
          tr.SimJob(1, 100.0, 100.0, "b", PriorityClass.URGENT, 1, 8, 100)]
    k = KueueConfig(within_cluster_queue="LowerPriority")
    KueueSim(js, SimConfig(nodes=1, check_invariants=True), k, Spy(Settings(), epoch)).run()
    assert seen == [
        ("admit", 0, 0.0, None, None),
        ("evict", 0, None, 100.0, 100.0),
        ("admit", 1, 100.0, None, None),
        ("admit", 0, 200.0, None, 100.0),
    ]


@pytest.mark.parametrize("aggregate", [True, False])
def test_reclaim_in_one_shared_cluster_queue_through_kueues_preemption(aggregate: bool) -> None:
    """Team a holds all 8 GPUs with long jobs; team b asks for 2. With RECLAIM_ENABLED the
    plan lowers the guards of two of a's Workloads once they ran MIN_RUNTIME, and the Kueue
    model's LowerPriority preemption hands their GPUs to b's Workloads of the same class within
    one LOOP_INTERVAL; the victims do not take them back. Without it nobody preempts. (The
    plan then sees every admitted Workload: summaries cannot stand for single victims.)"""
    epoch = tr.generate_trace(4, 1).epoch
    js = [tr.SimJob(i, 0.0, 1e5, "a", PriorityClass.NORMAL, 1, 1, 100) for i in range(8)]
    js += [tr.SimJob(8 + i, 100.0, 1000.0, "b", PriorityClass.NORMAL, 1, 1, 100)
           for i in range(2)]
    k = KueueConfig(within_cluster_queue="LowerPriority")
    cfg = SimConfig(nodes=1, check_invariants=True)
    on = Settings(reclaim_enabled=True, min_runtime=1800.0)
    policy = WdrfKueue(on, epoch, aggregate_admitted=aggregate)
    assert not policy.aggregate_admitted
    r = KueueSim(js, cfg, k, policy).run()
    pre = [e for e in r.evictions if e.reason == PREEMPTED]
    assert len(pre) == 2 and {e.by for e in pre} == {8, 9}
    assert all(js[e.job_id].team == "a" for e in pre)
    assert all(1800.0 <= e.time <= 1800.0 + on.loop_interval for e in pre)
    assert r.admit[8] == r.admit[9] == pre[0].time
    assert not {(e.job_id, e.by) for e in pre} & {(e.by, e.job_id) for e in r.evictions}
    off = KueueSim(js, cfg, k, WdrfKueue(Settings(), epoch)).run()
    assert off.evictions == [] and off.admit[8] == 1e5


@pytest.mark.parametrize("stand_ins", [True, False])
def test_urgent_work_preempts_at_creation_with_its_class_stand_in(stand_ins: bool) -> None:
    """The recommended setup gives a new urgent Workload its class stand-in (spec.priority, the
    urgent band's floor) at creation: Kueue preempts for it at once. Without the stand-in it
    waits for the controller's next cycle (ticks every LOOP_INTERVAL from 0)."""
    epoch = tr.generate_trace(4, 1).epoch
    settings = Settings()
    seen: list[tuple[int, int | None, str | None, int]] = []

    class Spy(WdrfKueue):
        def on_admit(self, job: tr.SimJob, now: float) -> None:
            super().on_admit(job, now)
            w = self.wl[job.job_id]
            seen.append((job.job_id, w.priority, w.priority_class_name, self.priority(job)))
            # Kueue's value is spec.priority plus the controller's boost, as written.
            assert self.priority(job) == wdrf_module.effective_priority(wdrf_module._wire(w))

    js = [tr.SimJob(0, 0.0, 1000.0, "a", PriorityClass.NORMAL, 1, 8, 100),
          tr.SimJob(1, 103.0, 100.0, "b", PriorityClass.URGENT, 1, 8, 100)]
    k = KueueConfig(within_cluster_queue="LowerPriority")
    r = KueueSim(js, SimConfig(nodes=1, check_invariants=True), k,
                 Spy(settings, epoch, stand_ins=stand_ins)).run()
    preempted_at = 103.0 if stand_ins else 110.0
    assert [(e.time, e.job_id, e.by) for e in r.evictions] == [(preempted_at, 0, 1)]
    assert r.admit[1] == preempted_at
    urgent = settings.stand_in_value(PriorityClass.URGENT)
    assert urgent > settings.guard(PriorityClass.APPROVED)
    if stand_ins:  # admitted on its stand-in, before any write
        assert seen[:2] == [(0, 0, "wdrf-normal", 0), (1, urgent, "wdrf-urgent", urgent)]
    else:  # admitted on the controller's first write
        assert seen[0] == (0, None, None, 0)
        assert seen[1][:3] == (1, None, None) and seen[1][3] >= urgent
