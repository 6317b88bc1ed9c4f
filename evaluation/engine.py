"""Structures shared by the simulator: configuration, the pending queue, time series and the
result of one run. The Kueue model that uses them is `evaluation.kueue.KueueSim`."""


from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from evaluation.packing import BINPACK, SPREAD
from evaluation.trace import PCT, SimJob

Key = tuple[float, ...]


@dataclass(slots=True)
class Eviction:
    time: float
    job_id: int
    reason: str  # Preempted | PodsReadyTimeout
    lost: float  # GPU-percent-seconds of work lost (need x seconds since the last checkpoint)
    by: int = -1  # preemptor job id
    admitted_at: float = math.nan  # when the evicted job's quota was reserved


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
    """Time integrals per window of `bin` seconds: per-team allocation and pending demand, and
    the part of the allocation held by work carried into the window (running when it began)."""

    bin: float
    teams: int
    alloc: list[list[float]] = field(default_factory=list)  # [window][team] GPU%-seconds
    pending: list[list[float]] = field(default_factory=list)
    total: list[float] = field(default_factory=list)  # [window] GPU%-seconds allocated
    carried: list[list[float]] = field(default_factory=list)  # [window][team], part of alloc
    # [window] GPU-seconds of physical GPUs with nothing on them (whole free GPUs): the free
    # capacity a multi-GPU or whole-GPU pod can use; the rest of the free capacity is stranded
    # on partly used GPUs (fragmentation).
    whole: list[float] = field(default_factory=list)

    def add(self, t0: float, t1: float, alloc: Sequence[int], pending: Sequence[int],
            carried: Sequence[int] = (), whole: int = 0) -> None:
        while t1 > t0:
            w = int(t0 // self.bin)
            end = min(t1, (w + 1) * self.bin)
            dt = end - t0
            while len(self.total) <= w:
                self.alloc.append([0.0] * self.teams)
                self.pending.append([0.0] * self.teams)
                self.carried.append([0.0] * self.teams)
                self.total.append(0.0)
                self.whole.append(0.0)
            if whole:
                self.whole[w] += whole * dt
            row_a, row_p = self.alloc[w], self.pending[w]
            row_c = self.carried[w]
            for i, c in enumerate(carried):
                if c:
                    row_c[i] += c * dt
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
    # Kueue model (evaluation/kueue.py) only:
    evictions: list[Eviction] = field(default_factory=list)
    lost: float = 0.0  # GPU-percent-seconds of work lost to preemption
    quota_admissions: list[int] = field(default_factory=list)  # per job: quota reservations
    job_writes: list[int] = field(default_factory=list)  # per job: priority writes
    # per job: Kueue's first quota reservation (NaN: never); its pods may start later
    first_quota: list[float] = field(default_factory=list)
    job_write_causes: dict[str, list[int]] = field(default_factory=dict)  # per cause, per job
