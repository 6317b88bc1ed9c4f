"""Trace loading, seeded synthetic labels, windows and offered load.

The Philly trace (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
Workloads", USENIX ATC 2019; CC BY 4.0) has submission time, duration, whole GPUs and a virtual
cluster per job. It has no priority classes and no fractional GPUs: both are drawn here from a
seeded generator (`LabelSpec`) and every report says so.

All GPU amounts in the simulator are integer *GPU percent* (100 = one whole GPU), so fractional
HAMi work (25 %, 50 %) is exact and GPU-time is conserved without rounding.
"""

from __future__ import annotations

import csv
import math
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from controller.domain import PriorityClass

DAY = 86400.0
HOUR = 3600.0
PCT = 100  # GPU percent in one whole GPU

# The trace lives in ../shared beside the repository; resolved from this file, not the working
# directory. `WDRF_TRACE` or `bench/trace_eval.py --trace` (Options.trace) point elsewhere.
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = Path(
    os.environ.get("WDRF_TRACE") or REPO_ROOT.parent / "shared" / "traces" / "philly.csv"
)
CITATION = (
    'Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training '
    'Workloads", USENIX ATC 2019; Philly trace, CC BY 4.0 '
    "(https://creativecommons.org/licenses/by/4.0/)"
)


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One row of the trace, as recorded (no synthetic fields)."""

    submit: float  # seconds since the trace epoch
    duration: float  # seconds of run time once started
    gpus: int  # whole GPUs requested
    team: str  # Philly virtual cluster


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job as the simulator replays it: trace fields plus seeded synthetic labels."""

    job_id: int
    submit: float
    duration: float
    team: str
    cls: PriorityClass
    pods: int  # pods in the (single) pod set
    gpus_per_pod: int  # distinct physical GPUs per pod (HAMi nvidia.com/gpu)
    pct: int  # percent of each of those GPUs (100 = whole, 25/50 = HAMi fraction)
    carried: bool = False  # submitted before the replayed window: initial load, not measured

    @property
    def need(self) -> int:
        """Quota charged, in GPU percent: pods x GPUs x fraction (GPU-equivalents x 100)."""
        return self.pods * self.gpus_per_pod * self.pct

    @property
    def fractional(self) -> bool:
        return self.pct < PCT

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.pods, self.gpus_per_pod, self.pct)


@dataclass(frozen=True, slots=True)
class LabelSpec:
    """Seeded synthetic labels (the trace has none of these)."""

    seed: int = 1
    urgent_share: float = 0.02
    approved_share: float = 0.15
    fractional_share: float = 0.30  # of single-GPU jobs
    fractions: tuple[int, ...] = (25, 50)
    node_gpus: int = 8


@dataclass(frozen=True, slots=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    epoch: datetime  # what submit == 0 means (UTC)
    source: str


def _parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def load_philly(path: str | Path) -> Trace:
    """Read philly.csv (rows not sorted), sorted by submission time then row order."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"trace file {p} not found: the Philly trace lives at ../shared/traces/philly.csv "
            "beside the repository (set WDRF_TRACE or pass --trace PATH)"
        )
    rows: list[tuple[datetime, int, float, int, str]] = []
    with p.open(newline="") as fh:
        for i, r in enumerate(csv.DictReader(fh)):
            rows.append(
                (_parse_time(r["timestamp"]), i, float(r["duration"]), int(r["num_gpus"]),
                 r["cluster"])
            )
    rows.sort(key=lambda x: (x[0], x[1]))
    epoch = rows[0][0] if rows else datetime(1970, 1, 1, tzinfo=UTC)
    jobs = tuple(
        TraceJob((t - epoch).total_seconds(), max(d, 1.0), g, team) for t, _, d, g, team in rows
    )
    return Trace(jobs, epoch, str(p))


def generate_trace(
    seed: int,
    n_jobs: int,
    teams: int = 4,
    span: float = DAY,
    max_gpus: int = 16,
) -> Trace:
    """A small seeded synthetic trace for tests (Philly-like shape: mostly 1-GPU jobs)."""
    rng = random.Random(seed)
    sizes = [g for g in (1, 2, 4, 8, 16) if g <= max_gpus]
    size_weights = [0.85, 0.05, 0.04, 0.04, 0.02][: len(sizes)]
    team_names = [f"team-{i}" for i in range(teams)]
    team_weights = [1.0 / (i + 1) for i in range(teams)]  # skewed, like Philly's
    jobs = []
    for _ in range(n_jobs):
        submit = round(rng.uniform(0, span))
        duration = round(min(rng.lognormvariate(7.0, 1.5), span)) + 1
        gpus = rng.choices(sizes, size_weights)[0]
        team = rng.choices(team_names, team_weights)[0]
        jobs.append(TraceJob(float(submit), float(duration), gpus, team))
    jobs.sort(key=lambda j: j.submit)
    return Trace(tuple(jobs), datetime(2017, 10, 1, tzinfo=UTC), f"generated(seed={seed})")


def pod_layout(gpus: int, node_gpus: int) -> tuple[int, int]:
    """(pods, GPUs per pod): one pod up to a node's GPUs, else equal pods of at most a node each."""
    if gpus <= node_gpus:
        return 1, gpus
    pods = math.ceil(gpus / node_gpus)
    if gpus % pods == 0:
        return pods, gpus // pods
    return gpus, 1


def label_jobs(jobs: Sequence[TraceJob], spec: LabelSpec) -> list[SimJob]:
    """Attach seeded classes and fractions; one draw sequence per job, so labels are stable."""
    rng = random.Random(spec.seed)
    out: list[SimJob] = []
    for i, j in enumerate(jobs):
        u_cls = rng.random()
        u_frac = rng.random()
        frac_pick = rng.randrange(len(spec.fractions)) if spec.fractions else 0
        if u_cls < spec.urgent_share:
            cls = PriorityClass.URGENT
        elif u_cls < spec.urgent_share + spec.approved_share:
            cls = PriorityClass.APPROVED
        else:
            cls = PriorityClass.NORMAL
        pods, per_pod = pod_layout(j.gpus, spec.node_gpus)
        pct = PCT
        if j.gpus == 1 and spec.fractions and u_frac < spec.fractional_share:
            pct = spec.fractions[frac_pick]
        out.append(SimJob(i, j.submit, j.duration, j.team, cls, pods, per_pod, pct))
    return out


def window(jobs: Iterable[SimJob], start: float, end: float, carry_in: bool = True) -> list[SimJob]:
    """Jobs submitted in [start, end), re-based so that `start` is time 0, ids renumbered.

    With `carry_in`, jobs submitted before `start` that would still be running at `start` had
    nothing ever waited are submitted at time 0 with their remaining run time, flagged
    `carried` (the cluster does not start empty; they are never measured)."""
    carried: list[SimJob] = []
    sel: list[SimJob] = []
    for j in jobs:
        if start <= j.submit < end:
            sel.append(j)
        elif carry_in and j.submit < start < j.submit + j.duration:
            carried.append(j)
    out = [
        SimJob(k, 0.0, j.submit + j.duration - start, j.team, j.cls, j.pods, j.gpus_per_pod,
               j.pct, carried=True)
        for k, j in enumerate(carried)
    ]
    out += [
        SimJob(len(out) + k, j.submit - start, j.duration, j.team, j.cls, j.pods,
               j.gpus_per_pod, j.pct)
        for k, j in enumerate(sel)
    ]
    return out


def demand_profile(jobs: Iterable[SimJob], bin_s: float = DAY) -> list[float]:
    """Mean GPU-equivalents each bin would use if no job ever waited (run from submission)."""
    bins: list[float] = []
    for j in jobs:
        s, e = j.submit, j.submit + j.duration
        b = int(s // bin_s)
        while s < e:
            ne = min(e, (b + 1) * bin_s)
            while len(bins) <= b:
                bins.append(0.0)
            bins[b] += j.need / PCT * (ne - s) / bin_s
            s = ne
            b += 1
    return bins


def offered_load(jobs: Sequence[SimJob], capacity_gpus: int, start: float, end: float) -> float:
    """GPU-time the jobs would use inside [start, end) if none waited, over capacity x length."""
    used = 0.0
    for j in jobs:
        s, e = max(j.submit, start), min(j.submit + j.duration, end)
        if e > s:
            used += j.need / PCT * (e - s)
    return used / (capacity_gpus * (end - start)) if end > start and capacity_gpus else 0.0


@dataclass(frozen=True, slots=True)
class Period:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


def busy_period(jobs: Sequence[SimJob], smooth_days: int = 7) -> Period:
    """Longest run of days whose trailing `smooth_days` mean no-wait demand is >= the trace mean.

    The trace mean is total GPU-time over the span from first submission to last completion.
    """
    prof = demand_profile(jobs, DAY)
    if not prof:
        return Period(0.0, 0.0)
    mean = sum(prof) / len(prof)
    smooth = [
        sum(prof[max(0, i - smooth_days + 1) : i + 1]) / min(smooth_days, i + 1)
        for i in range(len(prof))
    ]
    best = (0, 0)
    i = 0
    while i < len(smooth):
        if smooth[i] >= mean:
            k = i
            while k < len(smooth) and smooth[k] >= mean:
                k += 1
            if k - i > best[1] - best[0]:
                best = (i, k)
            i = k
        else:
            i += 1
    return Period(best[0] * DAY, best[1] * DAY)


def busiest_window(jobs: Sequence[SimJob], days: int, within: Period | None = None) -> Period:
    """The `days`-long day-aligned window with the most in-window demand from its own jobs."""
    lo = int((within.start if within else 0.0) // DAY)
    hi_t = within.end if within else max((j.submit for j in jobs), default=0.0) + DAY
    hi = max(lo + 1, int(hi_t // DAY) - days + 1)
    by_day: dict[int, list[SimJob]] = {}
    for j in jobs:
        by_day.setdefault(int(j.submit // DAY), []).append(j)
    best, best_d = lo, -1.0
    for d in range(lo, hi):
        sel = [j for k in range(d, d + days) for j in by_day.get(k, [])]
        s, e = d * DAY, (d + days) * DAY
        dem = sum(j.need * (min(j.submit + j.duration, e) - j.submit) for j in sel) / (e - s)
        if dem > best_d:
            best, best_d = d, dem
    return Period(best * DAY, (best + days) * DAY)


def size_cluster(
    jobs: Sequence[SimJob], period: Period, node_gpus: int, target_load: float
) -> int:
    """Nodes so that the offered load over `period` is as close to `target_load` as possible."""
    demand = offered_load(jobs, 1, period.start, period.end)  # mean GPUs over the period
    nodes = max(1, round(demand / target_load / node_gpus))
    return nodes
