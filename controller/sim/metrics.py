"""Metrics from `../shared/docs/fairness-anchors.md`, computed from a `SimResult`.

- Queueing delay (submission -> admission) per class: p50 / p95 / p99 / max.
- Urgent time-to-admission: the urgent class's queueing delay.
- Starvation bound: the normal class's maximum delay, against the aging cap.
- Jain's index over teams with demand, per time window (`SimConfig.series_bin`), demand-capped:
  x_i = a_i / f_i, where a_i is team i's mean allocation in the window and f_i its weighted
  max-min fair share of the same total (water-filling over the teams' demands, demand = allocated
  + pending): 1 = the allocation is the demand-capped weighted fair one; a team that asked for
  less than an equal share is not counted as under-served. Reported over busy windows (demand >=
  capacity).
- Utilisation: allocated GPU-equivalents / capacity, time-averaged over the measured period.
- JCT (submission -> completion): mean and p99; makespan.
- Priority writes per simulated hour (a write = a workload's target value changed between ticks).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.domain import PriorityClass
from controller.sim.engine import SimResult
from controller.sim.trace import HOUR, Period


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
class PolicyMetrics:
    policy: str
    jobs: int
    wait: Mapping[PriorityClass, Quantiles]  # seconds
    jct: Quantiles
    utilisation: float
    jain_busy_mean: float
    jain_busy_min: float
    jain_busy_ge_09: float  # fraction of busy windows with J >= 0.9
    busy_windows: int
    writes_per_hour: float
    writes: int
    makespan: float
    admitted_once: bool
    gpu_time_error: float  # relative difference: sum(need x duration) vs integral of allocation
    max_tenants: int
    ticks_evaluated: int
    ticks_total: int
    never_admitted: int
    util_series: tuple[float, ...]  # per series window over the whole run
    share_series: tuple[tuple[float, ...], ...]  # per window, per team: share of capacity
    jain_series: tuple[float, ...]  # per window in the period (NaN when not busy)
    period: Period
    extra: Mapping[str, float]


def compute(
    result: SimResult, period: Period, team_weights: Mapping[str, float] | None = None
) -> PolicyMetrics:
    jobs = result.jobs
    sel = [j for j in jobs if not j.carried and period.start <= j.submit < period.end]
    waits: dict[PriorityClass, list[float]] = {c: [] for c in PriorityClass}
    jcts: list[float] = []
    never = 0
    for j in sel:
        a = result.admit[j.job_id]
        if math.isnan(a):
            never += 1
            continue
        waits[j.cls].append(a - j.submit)
        e = result.end[j.job_id]
        if not math.isnan(e):
            jcts.append(e - j.submit)
    series = result.series
    cap = result.config.capacity
    b = series.bin
    w0 = int(period.start // b)
    w1 = min(math.ceil(period.end / b), len(series.total))
    alloc_sum = sum(series.total[w0:w1])
    span = (w1 - w0) * b
    util = alloc_sum / (cap * span) if span > 0 else math.nan
    weights = [(team_weights or {}).get(t, 1.0) for t in result.teams]
    jain_vals: list[float] = []
    jain_series: list[float] = []
    for w in range(w0, w1):
        alloc = [x / b for x in series.alloc[w]]
        dem = [alloc[i] + series.pending[w][i] / b for i in range(len(alloc))]
        if sum(dem) >= cap * (1 - 1e-9):
            jv = demand_capped_jain(alloc, dem, weights)
            jain_vals.append(jv)
            jain_series.append(jv)
        else:
            jain_series.append(math.nan)
    total_need = sum(j.need * j.duration for j in jobs if not math.isnan(result.end[j.job_id]))
    integral = sum(series.total)
    err = abs(total_need - integral) / total_need if total_need else 0.0
    return PolicyMetrics(
        policy=result.policy,
        jobs=len(sel),
        wait={c: quantiles(v) for c, v in waits.items()},
        jct=quantiles(jcts),
        utilisation=util,
        jain_busy_mean=sum(jain_vals) / len(jain_vals) if jain_vals else math.nan,
        jain_busy_min=min(jain_vals) if jain_vals else math.nan,
        jain_busy_ge_09=(
            sum(1 for x in jain_vals if x >= 0.9) / len(jain_vals) if jain_vals else math.nan
        ),
        busy_windows=len(jain_vals),
        writes_per_hour=(
            sum(1 for t in result.write_times if period.start <= t < period.end)
            / (period.length / HOUR) if period.length > 0 else math.nan
        ),
        writes=result.writes,
        makespan=result.makespan,
        admitted_once=all(n == 1 for n in result.admissions),
        gpu_time_error=err,
        max_tenants=result.max_tenants,
        ticks_evaluated=result.ticks_evaluated,
        ticks_total=result.ticks_total,
        never_admitted=never,
        util_series=tuple(t / (cap * b) for t in series.total),
        share_series=tuple(tuple(x / (cap * b) for x in row) for row in series.alloc),
        jain_series=tuple(jain_series),
        period=period,
        extra=result.extra,
    )

