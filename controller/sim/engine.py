"""Discrete-event model of one Kueue ClusterQueue over a HAMi GPU cluster.

Events are job arrivals, job completions and controller ticks (every LOOP_INTERVAL of simulated
time, for policies that run a controller loop). After arrivals and completions at a time `t`,
Kueue's BestEffortFIFO scheduler walks the pending workloads in queue order and admits every one
that fits (quota in GPU-equivalents, and HAMi finds GPUs for every pod); a head that does not fit
is parked and the next one is tried. Admitted jobs run for their trace duration, then free their
quota and GPUs. There is no preemption (Kueue ClusterQueues with `preemption: Never`).

Tick skipping (`exact_ticks=False`): a controller tick is evaluated only when the state changed
since the last evaluated tick (an arrival, admission or completion) or when the policy says its
output may change (`Policy.next_tick`, e.g. an aging step). A skipped tick would return the very
same plan (the policy is a pure function of snapshot and clock, and neither moved in a way it
reads), so it changes no priority, counts no write and admits nothing; `exact_ticks=True`
evaluates every tick, and a test checks that both give identical results.

A tick never needs an admission pass of its own: after a pass no pending job fits, and changing
priorities does not change what fits. The engine still runs one after a tick that changed the
order when `exact_ticks=True`, which the same test uses to show it admits nothing.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from controller.sim.packing import BINPACK, SPREAD, Cluster, Placement
from controller.sim.trace import PCT, SimJob

if TYPE_CHECKING:
    from controller.sim.kueue import Eviction
    from controller.sim.policies import Policy

Key = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class SimConfig:
    nodes: int
    node_gpus: int = 8
    loop_interval: float = 10.0  # the controller's LOOP_INTERVAL (simulated seconds)
    node_policy: str = BINPACK  # HAMi scheduler defaults: node binpack ...
    gpu_policy: str = SPREAD  # ... and GPU spread
    series_bin: float = 3600.0  # width of the time-series windows (metrics, plots)
    exact_ticks: bool = False
    check_invariants: bool = False  # verify every GPU after every event (slow; tests)

    @property
    def capacity(self) -> int:
        """GPU percent: the ClusterQueue's nominal quota and the physical GPUs agree."""
        return self.nodes * self.node_gpus * PCT


class SortedQueue:
    """Pending job ids in queue order (ascending key), with lazy deletion."""

    __slots__ = ("dead", "items")

    def __init__(self) -> None:
        self.items: list[tuple[Key, int]] = []
        self.dead = 0

    def add(self, key: Key, job_id: int) -> None:
        item = (key, job_id)
        if not self.items or self.items[-1] < item:
            self.items.append(item)
        else:
            bisect.insort(self.items, item)

    def rebuild(self, entries: list[tuple[Key, int]]) -> None:
        entries.sort()
        self.items = entries
        self.dead = 0


@dataclass(slots=True)
class Series:
    """Time integrals per window of `bin` seconds: per-team allocation and pending demand."""

    bin: float
    teams: int
    alloc: list[list[float]] = field(default_factory=list)  # [window][team] GPU%-seconds
    pending: list[list[float]] = field(default_factory=list)
    total: list[float] = field(default_factory=list)  # [window] GPU%-seconds allocated

    def add(self, t0: float, t1: float, alloc: Sequence[int], pending: Sequence[int]) -> None:
        while t1 > t0:
            w = int(t0 // self.bin)
            end = min(t1, (w + 1) * self.bin)
            dt = end - t0
            while len(self.total) <= w:
                self.alloc.append([0.0] * self.teams)
                self.pending.append([0.0] * self.teams)
                self.total.append(0.0)
            row_a, row_p = self.alloc[w], self.pending[w]
            tot = 0
            for i, a in enumerate(alloc):
                if a:
                    row_a[i] += a * dt
                    tot += a
            for i, p in enumerate(pending):
                if p:
                    row_p[i] += p * dt
            self.total[w] += tot * dt
            t0 = end


@dataclass(slots=True)
class SimResult:
    policy: str
    config: SimConfig
    jobs: Sequence[SimJob]
    teams: tuple[str, ...]
    admit: list[float]  # per job id; NaN = never admitted
    end: list[float]
    admissions: list[int]  # how many times each job was admitted (must be 1)
    writes: int
    write_times: list[float]
    ticks_evaluated: int
    ticks_total: int
    series: Series
    max_tenants: int  # most jobs ever sharing one physical GPU
    makespan: float
    overcommit_checks: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    # Kueue model (controller/sim/kueue.py) only:
    evictions: list[Eviction] = field(default_factory=list)
    lost: float = 0.0  # GPU-percent-seconds of work lost to preemption
    quota_admissions: list[int] = field(default_factory=list)  # per job: quota reservations
    job_writes: list[int] = field(default_factory=list)  # per job: priority writes


class Simulation:
    """One policy over one job list on one cluster. `run()` returns a `SimResult`."""

    def __init__(self, jobs: Sequence[SimJob], config: SimConfig, policy: Policy) -> None:
        self.jobs = list(jobs)
        for i, j in enumerate(self.jobs):
            if j.job_id != i:
                raise ValueError("job ids must be 0..n-1 in list order")
        self.cfg = config
        self.policy = policy
        self.cluster = Cluster(config.nodes, config.node_gpus)
        self.capacity = config.capacity
        self.used = 0  # ClusterQueue quota in use, GPU percent
        self.teams = tuple(sorted({j.team for j in self.jobs}))
        self.team_idx = {t: i for i, t in enumerate(self.teams)}
        self.team_alloc = [0] * len(self.teams)
        self.team_pending = [0] * len(self.teams)
        self.now = 0.0
        self.pending: dict[int, SimJob] = {}
        self.running: dict[int, Placement] = {}
        self.queues: dict[str, SortedQueue] = {}
        self.shape_count: dict[tuple[int, int, int], int] = {}
        self.admit = [math.nan] * len(self.jobs)
        self.end = [math.nan] * len(self.jobs)
        self.admissions = [0] * len(self.jobs)
        self.completions: list[tuple[float, int]] = []
        self.series = Series(config.series_bin, len(self.teams))
        self.changed = True  # since the last evaluated tick
        self.order_changed = False
        self.last_t = 0.0
        self.checks = 0
        self._too_big = [j.job_id for j in self.jobs if j.need > self.capacity]
        if self._too_big:
            raise ValueError(
                f"{len(self._too_big)} job(s) need more than the cluster's capacity; "
                "clip them before simulating"
            )

    # -- queue bookkeeping ---------------------------------------------------------------------
    def queue_name(self, job: SimJob) -> str:
        return job.team if self.policy.per_team else ""

    def _enqueue(self, job: SimJob) -> None:
        self.pending[job.job_id] = job
        self.policy.on_arrival(job, self.now)
        q = self.queues.setdefault(self.queue_name(job), SortedQueue())
        q.add(self.policy.job_key(job), job.job_id)
        self.shape_count[job.shape] = self.shape_count.get(job.shape, 0) + 1
        self.team_pending[self.team_idx[job.team]] += job.need

    def resort(self) -> None:
        """Re-key every pending job (after the policy changed priorities)."""
        for q in self.queues.values():
            key = self.policy.job_key
            pend = self.pending
            q.rebuild([(key(pend[jid]), jid) for _, jid in q.items if jid in pend])

    # -- admission -----------------------------------------------------------------------------
    def _fits(self, job: SimJob) -> bool:
        return self.used + job.need <= self.capacity and self.cluster.can_place(*job.shape)

    def _admit(self, job: SimJob) -> bool:
        node_policy, gpu_policy = self.policy.packing(job)
        placement = self.cluster.place(job.pods, job.gpus_per_pod, job.pct, node_policy,
                                       gpu_policy)
        if placement is None:
            return False
        if placement.total != job.need:
            raise AssertionError(f"job {job.job_id}: placed {placement.total}, needs {job.need}")
        jid = job.job_id
        del self.pending[jid]
        self.queues[self.queue_name(job)].dead += 1
        self.admissions[jid] += 1
        self.admit[jid] = self.now
        self.running[jid] = placement
        self.used += job.need
        ti = self.team_idx[job.team]
        self.team_alloc[ti] += job.need
        self.team_pending[ti] -= job.need
        c = self.shape_count[job.shape] - 1
        if c:
            self.shape_count[job.shape] = c
        else:
            del self.shape_count[job.shape]
        heapq.heappush(self.completions, (self.now + job.duration, jid))
        self.policy.on_admit(job, self.now)
        self.changed = True
        return True

    def _failed_shapes(self) -> set[tuple[int, int, int]]:
        return {s for s in self.shape_count if not self._shape_fits(s)}

    def _shape_fits(self, s: tuple[int, int, int]) -> bool:
        return self.used + s[0] * s[1] * s[2] <= self.capacity and self.cluster.can_place(*s)

    def admission_pass(self) -> int:
        """Kueue BestEffortFIFO: walk the queue in order, admit what fits, skip what does not."""
        if not self.pending:
            return 0
        failed = self._failed_shapes()
        if failed.issuperset(self.shape_count):
            return 0
        admitted = 0
        if not self.policy.per_team:
            q = self.queues.get("")
            if q is None:
                return 0
            items = q.items
            pend = self.pending
            i = 0
            while i < len(items):
                jid = items[i][1]
                i += 1
                job = pend.get(jid)
                if job is None or job.shape in failed:
                    continue
                if self._fits(job) and self._admit(job):
                    admitted += 1
                    # Admissions only shrink free space: shapes that failed still fail.
                    if not self._shape_fits(job.shape):
                        failed.add(job.shape)
                else:
                    failed.add(job.shape)
                if failed.issuperset(self.shape_count):
                    break
            self._compact(q)
            return admitted
        # Per-team queues (DRF, AFS): the team with the lowest key goes next, re-keyed after
        # every admission.
        heap = [(self.policy.team_key(name), name, 0) for name in self.queues]
        heapq.heapify(heap)
        while heap:
            tkey, name, pos = heapq.heappop(heap)
            q = self.queues[name]
            items = q.items
            job = None
            while pos < len(items):
                cand = self.pending.get(items[pos][1])
                pos += 1
                if cand is not None and cand.shape not in failed:
                    job = cand
                    break
            if job is None:
                continue
            if self._fits(job) and self._admit(job):
                admitted += 1
                if not self._shape_fits(job.shape):
                    failed.add(job.shape)
                tkey = self.policy.team_key(name)
            else:
                failed.add(job.shape)
            if failed.issuperset(self.shape_count):
                break
            heapq.heappush(heap, (tkey, name, pos))
        for q in self.queues.values():
            self._compact(q)
        return admitted

    def _compact(self, q: SortedQueue) -> None:
        """Drop admitted entries once they are half of the queue (amortised O(1))."""
        if q.dead * 2 > len(q.items):
            q.items = [it for it in q.items if it[1] in self.pending]
            q.dead = 0

    # -- time ----------------------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        if t > self.last_t:
            self.series.add(self.last_t, t, self.team_alloc, self.team_pending)
            self.last_t = t
        self.now = t
        self.policy.advance(t)

    def _complete(self, jid: int) -> None:
        job = self.jobs[jid]
        self.cluster.release(self.running.pop(jid))
        self.used -= job.need
        self.team_alloc[self.team_idx[job.team]] -= job.need
        self.end[jid] = self.now
        self.policy.on_release(job, self.now)
        self.changed = True

    def run(self) -> SimResult:
        jobs = sorted(self.jobs, key=lambda j: (j.submit, j.job_id))
        self.policy.reset(self)
        controller = self.policy.controller
        loop = self.cfg.loop_interval
        next_tick = 0.0 if controller else math.inf
        ticks_eval = 0
        writes_before = self.policy.writes
        ai = 0
        n = len(jobs)
        while True:
            t_arr = jobs[ai].submit if ai < n else math.inf
            t_done = self.completions[0][0] if self.completions else math.inf
            if math.isinf(t_arr) and math.isinf(t_done):
                break  # all done (or pending jobs that nothing will ever free room for)
            t = min(t_arr, t_done, next_tick)
            self._advance(t)
            events = False
            while self.completions and self.completions[0][0] <= t:
                self._complete(heapq.heappop(self.completions)[1])
                events = True
            while ai < n and jobs[ai].submit <= t:
                self._enqueue(jobs[ai])
                ai += 1
                events = True
                self.changed = True
            if events:
                self.admission_pass()
            if t >= next_tick:
                # Only ticks that can matter are visited (see `_next_tick`).
                ticks_eval += 1
                if self.policy.tick(t):
                    self.resort()
                    if self.cfg.exact_ticks and self.admission_pass():
                        raise AssertionError("a tick alone admitted a workload")
                self.changed = False
                next_tick = self._next_tick(t, loop, jobs[ai].submit if ai < n else math.inf)
            if self.cfg.check_invariants:
                self.cluster.check()
                self.checks += 1
                if self.used != self.cluster.allocated:
                    raise AssertionError("quota usage and GPU allocation disagree")
        self._advance(self.now)
        ends = [e for e in self.end if not math.isnan(e)]
        makespan = max(ends) if ends else 0.0
        return SimResult(
            policy=self.policy.name,
            config=self.cfg,
            jobs=self.jobs,
            teams=self.teams,
            admit=self.admit,
            end=self.end,
            admissions=self.admissions,
            writes=self.policy.writes - writes_before,
            write_times=list(self.policy.write_times),
            ticks_evaluated=ticks_eval,
            ticks_total=int(makespan // loop) + 1 if controller else 0,
            series=self.series,
            max_tenants=self.cluster.max_tenants,
            makespan=makespan,
            overcommit_checks=self.checks,
            extra=dict(self.policy.extra()),
        )

    def _next_tick(self, t: float, loop: float, t_arr: float) -> float:
        """The next tick to visit. Every tick when exact; else the first tick at or after the
        next arrival, completion or policy-announced change (nothing else moves the plan)."""
        if not self.pending and math.isinf(t_arr):
            return math.inf  # nothing left to decide about, ever
        if self.cfg.exact_ticks:
            return t + loop
        t_done = self.completions[0][0] if self.completions else math.inf
        ev = min(t_arr, t_done, self.policy.next_change(t))
        if math.isinf(ev):
            return math.inf
        return max(t + loop, _grid_at_or_after(ev, loop))


def _grid_at_or_after(t: float, loop: float) -> float:
    return math.ceil(t / loop - 1e-9) * loop
