"""Benchmark compute_plan on a synthetic cluster (not a test).

    .venv/bin/python bench/plan_bench.py [--pending 10000] [--admitted 5000] [--teams 100]
                                         [--queues 50] [--cohorts 1] [--runs 7] [--incremental]

Prints the median wall time of one full plan and peak memory: tracemalloc's peak of Python
allocations during one plan, and the process's max RSS (snapshot + plan + interpreter).
Goal: <= 250 ms and <= 200 MB for 10,000 pending + 5,000 admitted Workloads, 100 teams,
50 ClusterQueues.

With more ClusterQueues than teams, each team's namespace has a LocalQueue on every
(teams)-th ClusterQueue and its Workloads are spread over them, so every ClusterQueue has work
(Kueue's large-scale shape: `--teams 500 --queues 1000 --cohorts 10`).

Planning runs as the live loop runs it (`--gc live`, the default): automatic garbage
collection paused during each plan, collected and frozen between plans, outside the timings
(`controller.collector`). `--gc auto` leaves Python's collector to its allocation counters
(collections land inside the plans).

`--incremental` also times the live controller's planner (`controller.incremental`): its first
plan, a steady cycle in which one Workload of one pool changed (a new object, as the informer
cache gives after an update; a different pool each run), and a cycle in which nothing changed;
checks once that its plan equals compute_plan's; cycles in which one pending Workload is
admitted, and in which one new pending Workload is added at the end of the snapshot (checked
equal to compute_plan's after them); then times a cycle after a rebase (every pool planned
again, each from its memo) and prints the process max RSS with the planner's state.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.collector import Collector, paused
from controller.config import Settings
from controller.domain import (
    APPROVED_ANNOTATION,
    CPU,
    GPU,
    GPU_FRACTION_ANNOTATION,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    MEMORY,
    URGENT_ANNOTATION,
    Admission,
    ClusterQueue,
    ClusterSnapshot,
    Container,
    KueueApiVersion,
    LocalQueue,
    PodSet,
    Preemption,
    ResourceQuota,
    Workload,
    frozen_resources,
)
from controller.incremental import IncrementalPlanner
from controller.plan import Plan
from controller.policy import compute_plan

NOW = datetime(2025, 11, 20, 12, 0, tzinfo=UTC)
GC_LIVE = True  # --gc live
_COLLECTOR = Collector()


def timed(plan: Callable[..., Plan], *args: Any) -> tuple[Plan, float, float]:
    """One plan: (the plan, wall seconds, CPU seconds), run as `--gc` says."""
    if not GC_LIVE:
        t0, c0 = time.perf_counter(), time.process_time()
        out = plan(*args)
        return out, time.perf_counter() - t0, time.process_time() - c0
    _COLLECTOR.after_cycle()  # what the live loop does between cycles (not timed)
    with paused():
        t0, c0 = time.perf_counter(), time.process_time()
        out = plan(*args)
        return out, time.perf_counter() - t0, time.process_time() - c0


def synthetic(
    pending: int, admitted: int, teams: int, queues: int, seed: int = 1, cohorts: int = 1,
) -> ClusterSnapshot:
    rnd = random.Random(seed)
    cqs = tuple(
        ClusterQueue(
            f"cq-{i:02d}", KueueApiVersion.V1BETA2,
            quotas=(ResourceQuota("gpu", GPU, Decimal(64)),
                    ResourceQuota("gpu", CPU, Decimal(2048)),
                    ResourceQuota("gpu", MEMORY, Decimal(16 * 2**40))),
            cohort="pool" if cohorts <= 1 else f"pool-{i * cohorts // queues:02d}",
            preemption=Preemption(within_cluster_queue="LowerPriority") if i % 10 == 0
            else Preemption(),
        )
        for i in range(queues)
    )
    names = [f"team-{i:03d}" for i in range(teams)]
    if queues <= teams:
        lqs = tuple(LocalQueue(ns, "default", cqs[i % queues].name) for i, ns in enumerate(names))
    else:  # every ClusterQueue used: namespace i has a LocalQueue on queues i, i + teams, ...
        lqs = tuple(LocalQueue(names[i % teams], f"lq-{i}", cq.name) for i, cq in enumerate(cqs))
    mine: dict[str, list[LocalQueue]] = {}
    for lq in lqs:
        mine.setdefault(lq.namespace, []).append(lq)

    def make(i: int, is_admitted: bool) -> Workload:
        ns = names[rnd.randrange(teams)]
        lq = mine[ns][0] if len(mine[ns]) == 1 else rnd.choice(mine[ns])
        kind = rnd.random()
        res: dict[str, Decimal] = {CPU: Decimal(rnd.choice([1, 4, 8, 16])),
                                   MEMORY: Decimal(rnd.choice([8, 32, 128]) * 2**30)}
        if kind < 0.6:
            res[GPU] = Decimal(rnd.choice([1, 2, 4, 8]))
        elif kind < 0.85:
            res[GPU] = Decimal(1)
            pct = Decimal(rnd.choice([10, 25, 50]))
            res[GPUCORES] = pct
            res[GPUMEM_PERCENTAGE] = pct
        count = rnd.choice([1, 1, 1, 2, 4])
        ann: dict[str, str] = {}
        r = rnd.random()
        if r < 0.05:
            ann[URGENT_ANNOTATION] = "true"
        elif r < 0.2:
            ann[APPROVED_ANNOTATION] = "true"
        if GPU in res and rnd.random() < 0.05:
            ann[GPU_FRACTION_ANNOTATION] = "0.5"
        if rnd.random() < 0.005:
            ann[URGENT_ANNOTATION] = "yes"  # some bad input, as in real life
        usage = frozen_resources({k: v * count for k, v in res.items()})
        return Workload(
            namespace=ns,
            name=f"job-{i:05d}",
            uid=f"uid-{i:05d}",
            api_version=KueueApiVersion.V1BETA2,
            queue_name=lq.name,
            created=NOW - timedelta(seconds=rnd.uniform(0, 10 * 86400)),
            pod_sets=(PodSet("main", count, (Container("c", frozen_resources(res)),)),),
            priority=0,
            quota_reserved=is_admitted,
            admitted=is_admitted,
            admission=Admission(lq.cluster_queue, usage) if is_admitted
            else None,
            annotations=ann,
        )

    wls = [make(i, False) for i in range(pending)]
    wls += [make(pending + i, True) for i in range(admitted)]
    return ClusterSnapshot(workloads=tuple(wls), cluster_queues=cqs, local_queues=lqs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--admitted", type=int, default=5_000)
    ap.add_argument("--teams", type=int, default=100)
    ap.add_argument("--queues", type=int, default=50)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cohorts", type=int, default=1,
                    help="ClusterQueues in this many cohorts (pools); with more than one, also "
                         "the plan of one pool alone: what a cycle in which one pool changed "
                         "would cost if only that pool were planned")
    ap.add_argument("--incremental", action="store_true",
                    help="also time the live controller's incremental planner: first plan, a "
                         "cycle after one Workload changed, a cycle after nothing changed")
    ap.add_argument("--gc", choices=("live", "auto"), default="live",
                    help="live: as the live loop, collection paused during a plan and done "
                         "between plans (untimed); auto: Python's automatic collection")
    args = ap.parse_args()
    global GC_LIVE
    GC_LIVE = args.gc == "live"

    snap = synthetic(args.pending, args.admitted, args.teams, args.queues,
                     cohorts=args.cohorts)
    settings = Settings()
    compute_plan(snap, settings, NOW)  # warm up imports and caches
    times, cpu = [], []
    for _ in range(args.runs):
        plan, wall, used = timed(compute_plan, snap, settings, NOW)
        times.append(wall)
        cpu.append(used)
    tracemalloc.start()
    compute_plan(snap, settings, NOW)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    med = statistics.median(times)
    print(f"workloads: {args.pending} pending + {args.admitted} admitted, {args.teams} teams, "
          f"{args.queues} ClusterQueues; decisions: {len(plan.decisions)}")
    print(f"compute_plan median: {med * 1000:.1f} ms over {args.runs} runs "
          f"(min {min(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms; "
          f"{med / max(1, args.pending + args.admitted) * 1e6:.1f} us/workload)")
    print(f"compute_plan median CPU time: {statistics.median(cpu) * 1000:.1f} ms "
          f"(less sensitive to other load on the machine; load average now "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; --gc {args.gc})")
    print(f"peak memory: {peak / 2**20:.1f} MiB allocated during one plan (tracemalloc); "
          f"process max RSS {rss_kib / 1024:.1f} MiB")
    if args.cohorts > 1:
        one_pool(snap, settings, args.runs)
    if args.incremental:
        incremental(snap, settings, args.runs, plan)


def incremental(snap: ClusterSnapshot, settings: Settings, runs: int, full: Plan) -> None:
    """The live planner: cold, then steady cycles after one event each."""
    planner = IncrementalPlanner()
    cold = timed(planner.plan, snap, settings, NOW)[1:]
    pools = planner.pools
    # One pending Workload per run, each in a different pool where there are enough.
    by_pool: dict[str, int] = {}
    for d in full.decisions:
        if not d.admitted and d.breakdown is not None:
            by_pool.setdefault(d.breakdown.pool, int(d.uid.rpartition("-")[2]))
    chosen = [by_pool[p] for p in sorted(by_pool)]
    workloads = list(snap.workloads)
    times, cpu, replanned = [], [], []
    for run in range(runs):
        i = chosen[run % len(chosen)]
        w = workloads[i]
        flip = {} if APPROVED_ANNOTATION in w.annotations else {APPROVED_ANNOTATION: "true"}
        workloads[i] = replace(w, annotations=flip, resource_version=str(run))
        snap = replace(snap, workloads=tuple(workloads))
        _, wall, used = timed(planner.plan, snap, settings, NOW)
        times.append(wall)
        cpu.append(used)
        replanned.append(len(planner.replanned))
    still, still_cpu = [], []
    for _ in range(runs):
        plan, wall, used = timed(planner.plan, snap, settings, NOW)
        still.append(wall)
        still_cpu.append(used)
    same = plan == compute_plan(snap, settings, NOW)
    snap, moved = admitted_and_added(planner, snap, settings, runs, chosen)
    same = same and planner.plan(snap, settings, NOW) == compute_plan(snap, settings, NOW)
    print(f"incremental: {pools} pools; first plan {cold[0] * 1000:.1f} ms "
          f"(CPU {cold[1] * 1000:.1f} ms){'' if not planner.fallback else ' ' + planner.fallback}")
    print(f"incremental, one Workload changed: median {statistics.median(times) * 1000:.1f} ms, "
          f"CPU {statistics.median(cpu) * 1000:.1f} ms over {runs} runs "
          f"(pools replanned per run: {sorted(set(replanned))})")
    print(f"incremental, nothing changed: median {statistics.median(still) * 1000:.1f} ms, "
          f"CPU {statistics.median(still_cpu) * 1000:.1f} ms; equal to compute_plan: {same}")
    for what, (used_cpu, count) in moved.items():
        print(f"incremental, {what}: CPU {statistics.median(used_cpu) * 1000:.1f} ms over "
              f"{runs} runs (pools replanned per run: {sorted(count)})")
    # A rebase moves every pending value: every pool is planned again, from the memos.
    later = NOW + timedelta(seconds=settings.rebase_period)
    rebase = timed(planner.plan, snap, settings, later)[1:]
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"incremental, after a rebase (every pool planned again, {len(planner.replanned)}): "
          f"{rebase[0] * 1000:.1f} ms (CPU {rebase[1] * 1000:.1f} ms); process max RSS now "
          f"{rss_kib / 1024:.1f} MiB")


def admitted_and_added(
    planner: IncrementalPlanner, snap: ClusterSnapshot, settings: Settings, runs: int,
    chosen: list[int],
) -> tuple[ClusterSnapshot, dict[str, tuple[list[float], set[int]]]]:
    """Steady cycles after one pending Workload of a pool is admitted (its ClusterQueue's
    quota reserved), and after one new pending Workload is added at the end of the snapshot
    (as the informer cache lists a new object): CPU seconds of each, a different pool each
    run; and the pools each replanned."""
    cq_of = {(lq.namespace, lq.name): lq.cluster_queue for lq in snap.local_queues}
    original = snap.workloads
    workloads = list(original)
    out: dict[str, tuple[list[float], set[int]]] = {
        "one pending Workload admitted": ([], set()), "one pending Workload added": ([], set())}
    for run in range(runs):
        i = chosen[run % len(chosen)]
        w, count = original[i], original[i].pod_sets[0].count
        usage = {k: v * count for k, v in w.pod_sets[0].containers[0].resources.items()}
        workloads[i] = replace(
            w, quota_reserved=True, admitted=True, resource_version=f"admitted-{run}",
            admission=Admission(cq_of[(w.namespace, w.queue_name)], frozen_resources(usage)))
        snap = replace(snap, workloads=tuple(workloads))
        out["one pending Workload admitted"][0].append(timed(planner.plan, snap, settings, NOW)[2])
        out["one pending Workload admitted"][1].add(len(planner.replanned))
    for run in range(runs):
        w = original[chosen[run % len(chosen)]]  # (a copy of one pending Workload)
        workloads.append(replace(w, name=f"{w.name}-new", uid=f"{w.uid}-new"))
        snap = replace(snap, workloads=tuple(workloads))
        out["one pending Workload added"][0].append(timed(planner.plan, snap, settings, NOW)[2])
        out["one pending Workload added"][1].add(len(planner.replanned))
    return snap, out


def one_pool(snap: ClusterSnapshot, settings: Settings, runs: int) -> None:
    """compute_plan over the first cohort's ClusterQueues and their Workloads only."""
    cohort = snap.cluster_queues[0].cohort
    queues = {cq.name for cq in snap.cluster_queues if cq.cohort == cohort}
    lqs = tuple(lq for lq in snap.local_queues if lq.cluster_queue in queues)
    in_pool = {(lq.namespace, lq.name) for lq in lqs}
    wls = tuple(w for w in snap.workloads if (w.namespace, w.queue_name) in in_pool)
    sub = ClusterSnapshot(workloads=wls, cluster_queues=tuple(
        cq for cq in snap.cluster_queues if cq.name in queues), local_queues=lqs)
    times, cpu = [], []
    for _ in range(runs):
        _, wall, used = timed(compute_plan, sub, settings, NOW)
        times.append(wall)
        cpu.append(used)
    print(f"one pool alone ({cohort}: {len(queues)} ClusterQueues, {len(wls)} Workloads): "
          f"compute_plan median {statistics.median(times) * 1000:.1f} ms, CPU "
          f"{statistics.median(cpu) * 1000:.1f} ms over {runs} runs")


if __name__ == "__main__":
    main()
