"""The evaluation's metrics (docs/evaluation.md, "Method"), computed from a `SimResult`.

- Queueing delay (submission -> pods running) per class: p50 / p95 / p99 / max.
- Urgent time to start: the urgent class's queueing delay; beside it, urgent time to quota
  admission (submission -> Kueue's first quota reservation), the part priorities decide.
- Starvation bound: the normal class's maximum delay, against the aging cap.
- Jain's index over teams with demand, per time window (`SimConfig.series_bin`), demand-capped:
  x_i = a_i / f_i, where a_i is team i's mean allocation in the window and f_i its weighted
  max-min fair share of the same total (water-filling over the teams' demands, demand = allocated
  + pending): 1 = the allocation is the demand-capped weighted fair one; a team that asked for
  less than an equal share is not counted as under-served. Reported over busy windows (demand >=
  capacity).
- Utilisation: allocated GPU-equivalents / capacity, time-averaged over the measured period.
- JCT (submission -> completion): mean and p99; makespan.
- Priority writes per job and per simulated hour (a write = one patch of one Workload).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controller.domain import PriorityClass
from evaluation.engine import Eviction, SimResult
from evaluation.trace import HOUR, PCT, Period, SimJob


@dataclass(frozen=True, slots=True)
class Quantiles:
    n: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN when empty."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = (n - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac


def quantiles(values: Iterable[float]) -> Quantiles:
    v = sorted(values)
    if not v:
        return Quantiles(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Quantiles(
        len(v), quantile(v, 0.5), quantile(v, 0.95), quantile(v, 0.99), v[-1], sum(v) / len(v)
    )


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 = equal, 1/n = one has everything."""
    if not xs:
        return 1.0
    s = sum(xs)
    sq = sum(x * x for x in xs)
    if sq == 0:
        return 1.0
    return s * s / (len(xs) * sq)


def water_fill(total: float, demands: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted max-min fair split of `total` over `demands` (nobody gets more than it asks)."""
    n = len(demands)
    alloc = [0.0] * n
    active = [i for i in range(n) if demands[i] > 0]
    left = total
    while active and left > 1e-12:
        wsum = sum(weights[i] for i in active)
        share = left / wsum
        capped = [i for i in active if demands[i] - alloc[i] <= share * weights[i] + 1e-12]
        if not capped:
            for i in active:
                alloc[i] += share * weights[i]
            break
        for i in capped:
            left -= demands[i] - alloc[i]
            alloc[i] = demands[i]
        active = [i for i in active if i not in capped]
    return alloc


def demand_capped_jain(
    alloc: Sequence[float], demand: Sequence[float], weights: Sequence[float]
) -> float:
    """Jain's index of allocation over the weighted max-min fair allocation of the same total."""
    idx = [i for i in range(len(alloc)) if demand[i] > 1e-9]
    if len(idx) <= 1:
        return 1.0
    a = [alloc[i] for i in idx]
    fair = water_fill(sum(a), [demand[i] for i in idx], [weights[i] for i in idx])
    xs = [a[k] / fair[k] if fair[k] > 1e-12 else (0.0 if a[k] <= 1e-12 else 1.0)
          for k in range(len(idx))]
    return jain(xs)


@dataclass(frozen=True, slots=True)
class Load:
    """One series window (an hour): per team, the mean allocation and pending demand (GPU
    percent); busy when allocation + pending reaches the capacity."""

    alloc: list[float]
    pending: list[float]
    demand: list[float]  # alloc + pending
    busy: bool


def windows(result: SimResult, period: Period) -> range:
    """The series windows of the period."""
    b = result.series.bin
    return range(int(period.start // b), min(math.ceil(period.end / b), len(result.series.total)))


def load(result: SimResult, w: int) -> Load:
    series = result.series
    alloc = [x / series.bin for x in series.alloc[w]]
    pending = [x / series.bin for x in series.pending[w]]
    demand = [alloc[i] + pending[i] for i in range(len(alloc))]
    return Load(alloc, pending, demand, sum(demand) >= result.config.capacity * (1 - 1e-9))


def busy_fairness(result: SimResult, period: Period,
                  weights: Sequence[float]) -> tuple[float, float, int]:
    """Over the period's series windows: the mean demand-capped Jain index of the busy ones
    (NaN when none), the utilisation, and how many windows were busy."""
    series = result.series
    span_windows = windows(result, period)
    span = len(span_windows) * series.bin
    util = (sum(series.total[span_windows.start:span_windows.stop])
            / (result.config.capacity * span) if span > 0 else math.nan)
    jain_vals = [demand_capped_jain(h.alloc, h.demand, weights)
                 for h in (load(result, w) for w in span_windows) if h.busy]
    mean = sum(jain_vals) / len(jain_vals) if jain_vals else math.nan
    return mean, util, len(jain_vals)


# ---------------------------------------------------------------------------------------------
# Scalar metrics of one run in the Kueue model (evaluation/kueue.py), for the multi-window
# evaluation (evaluation/evaluate.py). Every value is a float; NaN when not measurable.

SLOWDOWN_BOUND = 600.0  # bounded slowdown: run times under 10 min count as 10 min
def packing_metrics(result: SimResult, period: Period, jobs: Sequence[SimJob]
                    ) -> dict[str, float]:
    """Whole-GPU fragmentation and the waits of multi-GPU jobs over the measured period.

    ``stranded``: the share of free GPU capacity that sits on partly used GPUs (time integral
    of free - whole free GPUs, over the integral of free), 0 = every free percent is on a whole
    free GPU. ``whole_free``: mean whole free GPUs. ``multi_*``: waits (s) of the jobs whose
    pods ask for several distinct GPUs (they need whole free GPUs on one node), all classes."""
    s = result.series
    b = s.bin
    w0 = int(period.start // b)
    w1 = min(math.ceil(period.end / b), len(s.total), len(s.whole))
    cap = result.config.capacity
    free = sum(cap * b - s.total[w] for w in range(w0, w1))
    whole = sum(s.whole[w0:w1])
    span = (w1 - w0) * b
    out = {
        "stranded": (free - whole * PCT) / free if free > 0 else math.nan,
        "whole_free": whole / span if span > 0 else math.nan,
    }
    waits = [result.admit[j.job_id] - j.submit for j in jobs
             if j.gpus_per_pod > 1 and not math.isnan(result.admit[j.job_id])]
    q = quantiles(waits)
    out["multi_mean"] = q.mean
    out["multi_p99"] = q.p99
    out["multi_never"] = float(sum(1 for j in jobs if j.gpus_per_pod > 1
                                   and math.isnan(result.admit[j.job_id])))
    return out


SIZE_BUCKETS: tuple[tuple[str, int, float], ...] = (
    ("1gpu", 0, 100), ("2-8gpu", 101, 800), (">8gpu", 801, math.inf),
)


def team_ratios(
    result: SimResult, period: Period, weights: Sequence[float]
) -> tuple[list[float], list[float], list[tuple[float, ...]]]:
    """Per team: long-run allocation / entitlement over the busy hours in which it had demand
    (NaN if never), the weighted share error per busy hour, and per hour (whole run) each
    team's allocation / entitlement (NaN without demand or outside busy hours).

    Entitlement = the team's weighted max-min fair share of the whole capacity given every
    team's demand (allocated + pending, demand-capped water-filling): what a perfectly weighted
    fair scheduler would give it in that hour."""
    cap = result.config.capacity
    n = len(result.teams)
    got = [0.0] * n
    due = [0.0] * n
    errors: list[float] = []
    per_hour: list[tuple[float, ...]] = []
    measured = windows(result, period)
    for w in range(len(result.series.total)):
        h = load(result, w)
        if not h.busy or w not in measured:
            per_hour.append(tuple(math.nan for _ in range(n)))
            continue
        alloc, dem = h.alloc, h.demand
        fair = water_fill(float(cap), dem, weights)
        row = []
        for i in range(n):
            if dem[i] > 1e-9 and fair[i] > 1e-9:
                got[i] += alloc[i]
                due[i] += fair[i]
                row.append(alloc[i] / fair[i])
            else:
                row.append(math.nan)
        per_hour.append(tuple(row))
        tot = sum(fair)
        if tot > 0:
            errors.append(sum(abs(alloc[i] - fair[i]) for i in range(n)) / (2 * tot))
    ratios = [got[i] / due[i] if due[i] > 0 else math.nan for i in range(n)]
    return ratios, errors, per_hour


def run_metrics(
    result: SimResult, period: Period, weights: Sequence[float], loop_interval: float
) -> dict[str, float]:
    """The evaluation's scalar metrics for one policy on one window and label seed."""

    jobs = [j for j in result.jobs if not j.carried and period.start <= j.submit < period.end]
    out: dict[str, float] = {}
    waits: dict[PriorityClass, list[float]] = {c: [] for c in PriorityClass}
    buckets: dict[str, list[float]] = {name: [] for name, _, _ in SIZE_BUCKETS}
    slow: list[float] = []
    never = 0
    for j in jobs:
        a = result.admit[j.job_id]
        if math.isnan(a):
            never += 1
            continue
        wait = a - j.submit
        waits[j.cls].append(wait)
        if j.cls is PriorityClass.NORMAL:
            for name, lo, hi in SIZE_BUCKETS:
                if lo <= j.need <= hi:
                    buckets[name].append(wait)
        e = result.end[j.job_id]
        if not math.isnan(e):
            slow.append(max(1.0, (e - j.submit) / max(j.duration, SLOWDOWN_BOUND)))
    for c in PriorityClass:
        q = quantiles(waits[c])
        out[f"{c.value}_p50"] = q.p50
        out[f"{c.value}_p99"] = q.p99
        out[f"{c.value}_max"] = q.max
        out[f"{c.value}_mean"] = q.mean
    # Urgent time to quota admission (Kueue reserved its quota), beside time to start: what
    # priorities decide, without the wait for free GPUs after the reservation.
    if result.first_quota:
        q = quantiles(result.first_quota[j.job_id] - j.submit for j in jobs
                      if j.cls is PriorityClass.URGENT
                      and not math.isnan(result.first_quota[j.job_id]))
        out["urgent_quota_p99"], out["urgent_quota_max"] = q.p99, q.max
        # The same for normal jobs per size bucket: a multi-GPU job's quota comes within
        # minutes, and its longest wait is mostly for whole free nodes, which no priority makes.
        for name, lo, hi in SIZE_BUCKETS:
            q = quantiles(result.first_quota[j.job_id] - j.submit for j in jobs
                          if j.cls is PriorityClass.NORMAL and lo <= j.need <= hi
                          and not math.isnan(result.first_quota[j.job_id]))
            out[f"normal_{name}_quota_max"] = q.max
    for name, v in buckets.items():
        q = quantiles(v)
        out[f"normal_{name}_p99"] = q.p99
        out[f"normal_{name}_max"] = q.max
    out.update(packing_metrics(result, period, jobs))
    sq = quantiles(slow)
    out["slowdown_mean"] = sq.mean
    out["slowdown_p99"] = sq.p99
    out["never_admitted"] = float(never)
    # Fairness.
    jain_mean, util, busy = busy_fairness(result, period, weights)
    out["jain"] = jain_mean
    out["utilisation"] = util
    out["busy_hours"] = float(busy)
    ratios, errors, _ = team_ratios(result, period, weights)
    valid = [r for r in ratios if not math.isnan(r)]
    out["worst_team_ratio"] = min(valid) if valid else math.nan
    out["max_ratio_error"] = max(abs(r - 1) for r in valid) if valid else math.nan
    for team, r in zip(result.teams, ratios, strict=True):
        out[f"ratio:{team}"] = r
    own = backlogged_ratios(result, period, weights)
    own_valid = [r for r in own if not math.isnan(r)]
    out["backlogged_worst_ratio"] = min(own_valid) if own_valid else math.nan
    out["backlogged_ratio_error"] = (
        max(abs(r - 1) for r in own_valid) if own_valid else math.nan)
    out.update(carried_shares(result, period))
    out["share_error"] = sum(errors) / len(errors) if errors else math.nan
    out["themis_max"] = themis_max(result, jobs, weights)
    # Cost and disruption.
    hours = period.length / HOUR
    per_job = [result.job_writes[j.job_id] for j in jobs] if result.job_writes else []
    wq = quantiles(float(x) for x in per_job)
    out["writes_per_job_mean"] = wq.mean if per_job else 0.0
    out["writes_per_job_p99"] = wq.p99 if per_job else 0.0
    for cause, counts in sorted(result.job_write_causes.items()):
        out[f"writes_per_job:{cause}"] = (
            sum(counts[j.job_id] for j in jobs) / len(jobs) if jobs else 0.0)
    out["writes_per_hour"] = (
        sum(1 for t in result.write_times if period.start <= t < period.end) / hours
    )
    pre = [e for e in result.evictions if e.reason == "Preempted"
           and period.start <= e.time < period.end]
    out["preemptions_per_hour"] = len(pre) / hours
    out["same_class_preemptions"] = float(sum(1 for e in pre if _not_by_class(result, e)))
    out.update(reclaims(result, period))
    timeouts = [e for e in result.evictions if e.reason != "Preempted"
                and period.start <= e.time < period.end]
    out["timeouts_per_hour"] = len(timeouts) / hours
    gpus = result.config.capacity / PCT
    lost_h = sum(e.lost for e in pre) / PCT / HOUR
    out["gpu_hours_lost"] = lost_h
    out["lost_share"] = lost_h / (gpus * hours)
    out["jct_mean_h"] = quantiles(
        result.end[j.job_id] - j.submit for j in jobs if not math.isnan(result.end[j.job_id])
    ).mean / HOUR
    out["makespan_h"] = result.makespan / HOUR
    del loop_interval
    return out


RANK = {PriorityClass.NORMAL: 0, PriorityClass.APPROVED: 1, PriorityClass.URGENT: 2}
BACKLOG_MIN = 25.0  # GPU percent: a team is backlogged with a quarter GPU waiting on average


def _not_by_class(result: SimResult, e: Eviction) -> bool:
    """The preemptor's class is not above the victim's: the class order does not explain it."""
    return RANK[result.jobs[e.by].cls] <= RANK[result.jobs[e.job_id].cls]


def reclaims(result: SimResult, period: Period) -> dict[str, float]:
    """Reclaims: preemptions of another team's Workload of the same class or higher (the
    class order does not explain them: a fairness mechanism took the GPUs back). Per window:
    how many, per hour, the GPU-hours they lost, and per team how many it suffered
    (`reclaimed_from:TEAM`) and how many were made for it (`reclaimed_for:TEAM`)."""

    hours = period.length / HOUR
    out: dict[str, float] = {}
    rec = [e for e in result.evictions if e.reason == "Preempted" and e.by >= 0
           and period.start <= e.time < period.end and _not_by_class(result, e)
           and result.jobs[e.by].team != result.jobs[e.job_id].team]
    out["reclaims"] = float(len(rec))
    out["reclaims_per_hour"] = len(rec) / hours if hours > 0 else math.nan
    out["reclaim_gpu_hours_lost"] = sum(e.lost for e in rec) / PCT / HOUR
    for team in result.teams:
        out[f"reclaimed_from:{team}"] = 0.0
        out[f"reclaimed_for:{team}"] = 0.0
    for e in rec:
        out[f"reclaimed_from:{result.jobs[e.job_id].team}"] += 1.0
        out[f"reclaimed_for:{result.jobs[e.by].team}"] += 1.0
    suffered = [out[f"reclaimed_from:{t}"] for t in result.teams]
    out["reclaims_team_max"] = max(suffered) if suffered else 0.0
    return out


def carried_shares(result: SimResult, period: Period) -> dict[str, float]:
    """The share of capacity held by work carried into the window (running when it began):
    in its first hour, over its first day and over the whole measured period, and the most one
    team held with carried-in work in the first hour."""
    series = result.series
    cap = result.config.capacity
    b = series.bin
    w0 = int(period.start // b)
    w1 = min(math.ceil(period.end / b), len(series.total))

    def share(lo: int, hi: int) -> float:
        hi = min(hi, w1)
        if hi <= lo:
            return math.nan
        return sum(sum(series.carried[w]) for w in range(lo, hi)) / (cap * b * (hi - lo))

    first = series.carried[w0] if w0 < w1 else []
    return {
        "carried_share_first_hour": share(w0, w0 + 1),
        "carried_share_first_day": share(w0, w0 + math.ceil(24 * HOUR / b)),
        "carried_share_mean": share(w0, w1),
        "carried_team_max_first_hour": max(first) / (cap * b) if first else math.nan,
    }


def water_fill_floors(total: float, demands: Sequence[float], weights: Sequence[float],
                      floors: Sequence[float]) -> list[float]:
    """Weighted max-min fair split of `total` in which team i gets at least `floors[i]` (work
    that cannot be moved) and at most `demands[i]`: the level L with sum of
    min(demand, max(floor, L x weight)) = total, found by bisection."""
    n = len(demands)
    if sum(demands) <= total:
        return [float(d) for d in demands]

    def filled(level: float) -> list[float]:
        return [min(demands[i], max(floors[i], level * weights[i])) for i in range(n)]

    lo, hi = 0.0, max(demands[i] / weights[i] for i in range(n) if weights[i] > 0)
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(filled(mid)) < total:
            lo = mid
        else:
            hi = mid
    return filled(hi)


def backlogged_ratios(result: SimResult, period: Period, weights: Sequence[float],
                      backlog_min: float = BACKLOG_MIN) -> list[float]:
    """Per team: allocation / entitlement of the part a policy decides, over the busy hours in
    which the team was backlogged (NaN if it was due less than one GPU on average over the
    busy hours: its ratio would be the noise of a few jobs).

    What a policy decides is who gets the GPUs that free up while teams wait. Two things in the
    all-hours ratio (`team_ratios`) are outside that: the GPUs held by work carried into the
    window (running before the policy decided anything), and hours in which a team was not
    waiting (it got all it asked for). So per busy hour the entitlement is the weighted max-min
    split of the capacity with every team's carried-in GPUs as a floor (what the best policy
    that moves nothing already running could reach), and a team with at least `backlog_min`
    GPU percent pending on average is backlogged; over its backlogged hours, got = its
    allocation less its carried-in GPUs, due = its entitlement less the same."""
    series = result.series
    n = len(result.teams)
    got = [0.0] * n
    due = [0.0] * n
    busy = 0
    for w in windows(result, period):
        h = load(result, w)
        if not h.busy:
            continue
        busy += 1
        alloc = h.alloc
        carried = [x / series.bin for x in series.carried[w]]
        fair = water_fill_floors(float(result.config.capacity), h.demand, weights, carried)
        for i in range(n):
            if h.pending[i] >= backlog_min:
                got[i] += alloc[i] - carried[i]
                due[i] += fair[i] - carried[i]
    return [got[i] / due[i] if busy and due[i] >= PCT * busy else math.nan for i in range(n)]


def themis_max(result: SimResult, jobs: Sequence[object], weights: Sequence[float]) -> float:
    """Themis finish-time fairness, worst team: the mean over a team's jobs of
    rho = JCT / T_isolated, where T_isolated is the job's run time on the team's weighted
    share of the cluster alone (time-sliced when the job needs more than that share)."""

    cap = result.config.capacity
    idx = {t: i for i, t in enumerate(result.teams)}
    wsum = sum(weights)
    per_team: dict[str, list[float]] = {}
    for j in jobs:
        assert isinstance(j, SimJob)
        e = result.end[j.job_id]
        if math.isnan(e):
            continue
        share = cap * weights[idx[j.team]] / wsum
        iso = j.duration * max(1.0, j.need / share)
        per_team.setdefault(j.team, []).append((e - j.submit) / iso)
    means = [sum(v) / len(v) for v in per_team.values() if v]
    return max(means) if means else math.nan
