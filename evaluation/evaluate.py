"""The multi-window evaluation: means with bootstrap 95 % confidence intervals over (window,
label seed) runs, the goals of the decision-quality issue checked on the held-out windows, a
Markdown report and plots.

Confidence intervals: percentile bootstrap over the runs (each run = one window x one label
seed, all policies on the same run), 2,000 resamples, fixed RNG seed. A comparison between two
policies resamples the *paired* per-run differences, so window-to-window variation that moves
every policy alike does not widen it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from evaluation.experiment import (
    AFS_NAME,
    DRF_CLASSES_NAME,
    FS_NAME,
    WDRF_FS_NAME,
    Options,
    RunRecord,
    Window,
    weights_tag,
)
from evaluation.metrics import SIZE_BUCKETS, quantile
from evaluation.trace import CITATION, HOUR

RESAMPLES = 2000
WDRF = "WDRF"
FIFO = "FIFO"
# Rows whose behaviour does not depend on the team weights (they never read them): baselines
# for a WDRF row of any weights.
WEIGHT_FREE = (FIFO, "Static classes", AFS_NAME, "DRF (ideal)")
LOST_LIMIT = 0.01  # GPU-hours lost to preemption, share of capacity (one shared ClusterQueue)
WRITES_LIMIT = 3.0


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    lo: float
    hi: float
    n: int

    def fmt(self, f: Callable[[float], str]) -> str:
        if math.isnan(self.mean):
            return "-"
        return f"{f(self.mean)} [{f(self.lo)}, {f(self.hi)}]"


def bootstrap(values: Sequence[float], seed: int = 7) -> Estimate:
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = sum(v) / len(v)
    if len(v) == 1:
        return Estimate(mean, mean, mean, 1)
    rng = random.Random(seed)
    n = len(v)
    means = sorted(sum(v[rng.randrange(n)] for _ in range(n)) / n for _ in range(RESAMPLES))
    return Estimate(mean, quantile(means, 0.025), quantile(means, 0.975), n)


def by_run(records: Sequence[RunRecord], policy: str, metric: str) -> dict[tuple[str, int], float]:
    return {(r.window.name, r.seed): r.metrics.get(metric, math.nan) for r in records
            if r.policy == policy}


def estimate(records: Sequence[RunRecord], policy: str, metric: str) -> Estimate:
    return bootstrap(list(by_run(records, policy, metric).values()))


def paired(records: Sequence[RunRecord], a: str, b: str, metric: str) -> Estimate:
    """a - b, per run, bootstrapped."""
    va, vb = by_run(records, a, metric), by_run(records, b, metric)
    return bootstrap([va[k] - vb[k] for k in va if k in vb
                      and not math.isnan(va[k]) and not math.isnan(vb[k])])


# -- goals ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Goal:
    name: str
    met: bool | None  # None: cannot be checked (a policy missing)
    detail: str


def _h(x: float) -> str:
    return f"{x / HOUR:.2f} h"


def _m(x: float) -> str:
    return f"{x / 60:.1f} min"


def _f3(x: float) -> str:
    return f"{x:.3f}"


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def shared_cq(wdrf: str) -> bool:
    """A WDRF row on one shared ClusterQueue (not on Fair Sharing's per-team ClusterQueues)."""
    return not wdrf.startswith(WDRF_FS_NAME)


def _fairness_goal(records: Sequence[RunRecord], wdrf: str, metric: str, label: str,
                   at_least: Sequence[str], above: Sequence[str], where: str) -> Goal:
    """`wdrf` at least every `at_least` row (better, or the paired difference's CI reaches 0)
    and above every `above` row (the paired difference's CI above 0)."""
    policies = {r.policy for r in records}
    parts, ok = [f"{wdrf} {estimate(records, wdrf, metric).fmt(_f3)}"], True
    for b, strict in [(b, False) for b in at_least] + [(b, True) for b in above]:
        if b not in policies:
            parts.append(f"{b} not run")
            continue
        d = paired(records, wdrf, b, metric)
        good = d.lo > 0 if strict else d.hi >= 0
        ok = ok and good
        parts.append(f"{b} {estimate(records, b, metric).fmt(_f3)} (difference {d.fmt(_f3)}"
                     f"{'' if good else ': not above' if strict else ': worse'})")
    missing = any(b not in policies for b in (*at_least, *above))
    want = " and ".join(
        x for x in (
            f"≥ {', '.join(at_least)} (better or within CI)" if at_least else "",
            f"above {', '.join(above)} (paired CI above 0)" if above else "",
        ) if x)
    return Goal(f"fairness ({where}): {label} {want}", None if missing else ok,
                "; ".join(parts))


def check_goals(records: Sequence[RunRecord], loop_interval: float,
                wdrf: str = WDRF) -> list[Goal]:
    """The goals for the WDRF row `wdrf`, on the records given (the held-out runs).

    One shared ClusterQueue: Jain's index and the worst team's allocation / entitlement at least
    Kueue Fair Sharing's on per-team ClusterQueues and above the class-aware DRF's and the AFS
    model's; GPU-hours lost to preemption <= 1 % of capacity. Per-team ClusterQueues (WDRF +
    Fair Sharing): both at least Fair Sharing's alone, with the same team weights. Both: urgent
    p99 <= the best baseline's + LOOP_INTERVAL, normal max wait per size bucket <= FIFO's,
    priority writes per job <= 3 (mean). Baselines are the rows of the same team weights, and
    the rows that never read weights (FIFO, Static classes, AFS model, DRF)."""
    policies = {r.policy for r in records}
    if wdrf not in policies:
        return [Goal(f"{wdrf} was not run", None, "")]
    tag = weights_tag(wdrf)
    out: list[Goal] = []
    shared = shared_cq(wdrf)
    where = ("one shared ClusterQueue" if shared else "per-team ClusterQueues") + (
        f", team weights {tag.removeprefix(', weights ')}" if tag else "")
    at_least = [FS_NAME + tag]
    above = [DRF_CLASSES_NAME + tag, AFS_NAME] if shared else []
    for metric, label in (("jain", "Jain's index (busy hours)"),
                          ("worst_team_ratio", "worst team's allocation / entitlement")):
        out.append(_fairness_goal(records, wdrf, metric, label, at_least, above, where))
    if shared:
        lost = estimate(records, wdrf, "lost_share")
        out.append(Goal(
            f"disruption ({where}): GPU-hours lost to preemption ≤ {100 * LOST_LIMIT:g} % of "
            "capacity", lost.mean <= LOST_LIMIT,
            f"{wdrf} {lost.fmt(_pct)} of capacity "
            f"({estimate(records, wdrf, 'gpu_hours_lost').fmt(lambda x: f'{x:,.0f}')}"
            " GPU-h per window)"))
    # urgent p99 <= best baseline + one LOOP_INTERVAL
    others = sorted(p for p in policies if not p.startswith("WDRF")
                    and (weights_tag(p) == tag or p in WEIGHT_FREE))
    if others:
        best = min(others, key=lambda p: estimate(records, p, "urgent_p99").mean)
        w = estimate(records, wdrf, "urgent_p99")
        be = estimate(records, best, "urgent_p99")
        detail = (f"{wdrf} {w.fmt(_m)}; best {best} {be.fmt(_m)}; "
                  f"difference {paired(records, wdrf, best, 'urgent_p99').fmt(_m)}")
        if all("urgent_quota_p99" in r.metrics for r in records if r.policy in (wdrf, best)):
            # what priorities decide: the rest of the wait is for free GPUs after admission
            detail += (f"; time to quota admission p99: {wdrf} "
                       f"{estimate(records, wdrf, 'urgent_quota_p99').fmt(_m)}, {best} "
                       f"{estimate(records, best, 'urgent_quota_p99').fmt(_m)}")
        out.append(Goal(
            f"urgent ({where}): p99 time to start ≤ best baseline's + LOOP_INTERVAL "
            f"({loop_interval:g} s)",
            w.mean <= be.mean + loop_interval, detail))
    else:
        out.append(Goal(f"urgent ({where}): p99 ≤ best baseline's + LOOP_INTERVAL", None,
                        "no baseline run"))
    if FIFO in policies:
        parts, ok = [], True
        buckets = [name for name, _, _ in SIZE_BUCKETS]
        for bucket in buckets:
            metric = f"normal_{bucket}_max"
            w, f = estimate(records, wdrf, metric), estimate(records, FIFO, metric)
            if w.n == 0 and f.n == 0:
                parts.append(f"{bucket}: no normal jobs of that size")
                continue
            good = w.mean <= f.mean  # NaN (none of them started) is not good
            ok = ok and good
            parts.append(f"{bucket}: {wdrf} {w.fmt(_h)} vs FIFO {f.fmt(_h)}")
        quota = {b: f"normal_{b}_quota_max" for b in buckets}
        if all(m in r.metrics for r in records if r.policy in (wdrf, FIFO)
               for m in quota.values()):
            # what priorities decide; the verdict stays on time to start
            parts.append("time to quota admission max: " + "; ".join(
                f"{b}: {wdrf} {estimate(records, wdrf, m).fmt(_h)} vs FIFO "
                f"{estimate(records, FIFO, m).fmt(_h)}" for b, m in quota.items()))
        out.append(Goal(f"starvation ({where}): normal max wait per size bucket ≤ FIFO's", ok,
                        "; ".join(parts)))
    else:
        out.append(Goal(f"starvation ({where}): normal max wait per size bucket ≤ FIFO's",
                        None, "FIFO not run"))
    wpj = estimate(records, wdrf, "writes_per_job_mean")
    p99 = estimate(records, wdrf, "writes_per_job_p99")
    out.append(Goal(f"cost ({where}): priority writes per job ≤ {WRITES_LIMIT:g} (mean)",
                    wpj.mean <= WRITES_LIMIT,
                    f"{wdrf}: mean {wpj.fmt(lambda x: f'{x:.2f}')}, p99 "
                    f"{p99.fmt(lambda x: f'{x:.1f}')}"))
    return out


# -- report --------------------------------------------------------------------------------------

COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("jain", "Jain (busy h)", _f3),
    ("worst_team_ratio", "worst team alloc/entitl.", _f3),
    ("share_error", "weighted share error", _f3),
    ("themis_max", "Themis rho, worst team", lambda x: f"{x:.1f}"),
    ("urgent_p99", "urgent p99", _m),
    ("approved_p99", "approved p99", _m),
    ("normal_p99", "normal p99", _h),
    ("slowdown_mean", "bounded slowdown mean", lambda x: f"{x:.1f}"),
    ("utilisation", "GPU util.", _pct),
)
COST_COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("preemptions_per_hour", "preemptions / h", lambda x: f"{x:.2f}"),
    ("same_class_preemptions", "same-class preemptions / window", lambda x: f"{x:.1f}"),
    ("gpu_hours_lost", "GPU-h lost / window", lambda x: f"{x:,.0f}"),
    ("lost_share", "lost / capacity", _pct),
    ("timeouts_per_hour", "PodsReady timeouts / h", lambda x: f"{x:.2f}"),
    ("writes_per_job_mean", "writes / job mean", lambda x: f"{x:.2f}"),
    ("writes_per_job_p99", "writes / job p99", lambda x: f"{x:.1f}"),
    ("writes_per_hour", "writes / h", lambda x: f"{x:,.0f}"),
)
PACKING_COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("stranded", "free capacity on partly used GPUs", _pct),
    ("whole_free", "whole free GPUs (mean)", lambda x: f"{x:.1f}"),
    ("multi_mean", "multi-GPU wait mean", _h),
    ("multi_p99", "multi-GPU wait p99", _h),
    ("multi_never", "multi-GPU never admitted", lambda x: f"{x:.1f}"),
)
PACKING_TEXT = ("HAMi packing (whole-GPU fragmentation: the share of free GPU capacity stranded "
                "on partly used GPUs; waits of jobs whose pods need several whole GPUs on one "
                "node):")
WEIGHT_COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("backlogged_ratio_error", "largest abs(ratio - 1), backlogged, own work", _f3),
    ("backlogged_worst_ratio", "worst team, backlogged, own work", _f3),
    ("max_ratio_error", "largest abs(ratio - 1), all (earlier metric)", _f3),
    ("worst_team_ratio", "worst team, all", _f3),
)
RECLAIM_COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("preemptions_per_hour", "preemptions / h", lambda x: f"{x:.2f}"),
    ("reclaims_per_hour", "reclaims / h", lambda x: f"{x:.2f}"),
    ("reclaims", "reclaims / window", lambda x: f"{x:.1f}"),
    ("reclaims_team_max", "most reclaims one team suffered / window", lambda x: f"{x:.1f}"),
    ("gpu_hours_lost", "GPU-h lost / window", lambda x: f"{x:,.0f}"),
    ("reclaim_gpu_hours_lost", "of it by reclaims", lambda x: f"{x:,.0f}"),
    ("lost_share", "lost / capacity", _pct),
)
CARRIED_COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("carried_share_first_hour", "first hour", _pct),
    ("carried_share_first_day", "first day", _pct),
    ("carried_share_mean", "whole window", _pct),
    ("carried_team_max_first_hour", "one team's most, first hour", _pct),
)
SIZE_COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("normal_1gpu_p99", "≤ 1 GPU p99", _h), ("normal_1gpu_max", "≤ 1 GPU max", _h),
    ("normal_2-8gpu_p99", "2-8 GPUs p99", _h), ("normal_2-8gpu_max", "2-8 GPUs max", _h),
    ("normal_>8gpu_p99", "> 8 GPUs p99", _h), ("normal_>8gpu_max", "> 8 GPUs max", _h),
)


def table(records: Sequence[RunRecord], policies: Sequence[str],
          columns: Sequence[tuple[str, str, Callable[[float], str]]]) -> list[str]:
    rows = ["| policy | " + " | ".join(c[1] for c in columns) + " |",
            "|" + "---|" * (len(columns) + 1)]
    for p in policies:
        cells = [estimate(records, p, key).fmt(f) for key, _, f in columns]
        rows.append(f"| {p} | " + " | ".join(cells) + " |")
    return rows


def render(opts: Options, windows: Sequence[Window], records: Sequence[RunRecord],
           epoch: datetime, loop_interval: float, descriptions: dict[str, str],
           plots: Sequence[str], seconds: float, command: str) -> str:
    policies = list(dict.fromkeys(r.policy for r in records))
    tuning = [r for r in records if r.window.role == "tuning"]
    held = [r for r in records if r.window.role == "held-out"]
    seeds = sorted({r.seed for r in records})
    lines = [
        "# WDRF decision quality: Kueue model, held-out windows, 95 % confidence intervals",
        "",
        f"Generated by `{command}` in {seconds / 60:.1f} min. Trace: {CITATION}. Priority "
        "classes, approvals, GPU fractions (and team weights when set) are synthetic, drawn "
        "from seeded generators.",
        "",
        "## Setup",
        "",
        f"- Windows ({opts.days if not opts.windows else 'named'} days each; jobs running at "
        "the start carried in, never measured; the run continues until the last job ends):",
    ]
    for w in windows:
        rs = [r for r in records if r.window == w]
        nodes = sorted({r.nodes for r in rs})
        loads = [r.load for r in rs]
        lines.append(
            f"  - {w.role}: {w.label(epoch)} UTC ({w.name}); {min(nodes)}-{max(nodes)} nodes x "
            f"{opts.node_gpus} GPUs, offered load {min(loads):.2f}-{max(loads):.2f}"
            if rs else f"  - {w.role}: {w.label(epoch)} (not run)")
    lines += [
        f"- Label seeds: {', '.join(map(str, seeds))} ({100 * opts.labels.urgent_share:g} % "
        f"urgent, {100 * opts.labels.approved_share:g} % approved, "
        f"{100 * opts.labels.fractional_share:g} % of 1-GPU jobs fractional).",
        f"- Kueue: topology `{opts.topology}`, admission `{opts.admission}`, "
        f"withinClusterQueue `{opts.preemption}` for every policy"
        + (", reclaimWithinCohort Any" if opts.topology == "cohort" else "")
        + f"; waitForPodsReady timeout {opts.pods_ready_timeout:g} s, backoff 60 s x 2^(n-1) "
        f"up to 1 h; checkpoint every {opts.checkpoint / 60:g} min; HAMi {opts.node_policy}/"
        f"{opts.gpu_policy} for every policy.",
        f"- Team weights: {opts.team_weights or 'all 1'}.",
        "",
        "Policies:",
    ]
    lines += [f"- *{p}*: {descriptions.get(p, '')}" for p in policies]
    for title, rs in (("Held-out windows", held), ("Tuning window", tuning)):
        if not rs:
            continue
        n = len({(r.window.name, r.seed) for r in rs})
        lines += ["", f"## {title} ({n} runs: mean [95 % CI])", "",
                  "Fairness, waits and utilisation (waits = submission → pods running):", ""]
        lines += table(rs, policies, COLUMNS)
        lines += ["", "Normal-class waits by job size:", ""]
        lines += table(rs, policies, SIZE_COLUMNS)
        lines += ["", "Disruption and API cost:", ""]
        lines += table(rs, policies, COST_COLUMNS)
        lines += ["", PACKING_TEXT, ""]
        lines += table(rs, policies, PACKING_COLUMNS)
        lines += ["", WEIGHTS_TEXT, ""]
        lines += table(rs, policies, WEIGHT_COLUMNS)
        lines += ["", RECLAIM_TEXT, ""]
        lines += table(rs, policies, RECLAIM_COLUMNS)
        lines += reclaims_by_team(rs, policies)
    lines += carried_in(records, windows, epoch)
    for wdrf in [p for p in policies if p.startswith("WDRF")] if held else []:
        lines += ["", f"## Goals for {wdrf} (held-out windows)", ""]
        for g in check_goals(held, loop_interval, wdrf):
            mark = {True: "**met**", False: "**NOT met**", None: "not checked"}[g.met]
            lines.append(f"- {g.name}: {mark} - {g.detail}")
    if plots:
        lines += ["", "## Plots (first held-out window, first seed)", ""]
        lines += [f"![{p}]({p})" for p in plots]
    lines += ["", "## Run times", "", "Seconds per policy run (one window, one seed), mean:", ""]
    for p in policies:
        secs = [r.seconds for r in records if r.policy == p]
        lines.append(f"- {p}: {sum(secs) / len(secs):.1f}")
    return "\n".join(lines) + "\n"


WEIGHTS_TEXT = (
    "Weights honoured (allocation / entitlement per team over the busy hours). *Backlogged, "
    "own work* (what a policy decides: where GPUs go while teams wait): only the hours in "
    "which the team had work waiting; the entitlement is the weighted max-min split with each "
    "team's carried-in GPUs as a floor, and both sides leave those GPUs out; teams due less "
    "than one GPU on average are left out. *All*: the earlier metric, every hour with demand, "
    "carried-in work included:"
)
RECLAIM_TEXT = (
    "Preemption and reclaim (a *reclaim* preempts another team's Workload of the same class or "
    "higher: the class order does not explain it):"
)


def reclaims_by_team(records: Sequence[RunRecord], policies: Sequence[str]) -> list[str]:
    """Per policy with reclaims: each team's allocation / entitlement, the reclaims it suffered
    and those made for it, per window (means over runs)."""
    out: list[str] = []
    for p in policies:
        rs = [r for r in records if r.policy == p]
        if not rs or estimate(records, p, "reclaims").mean <= 0:
            continue
        teams = sorted({k.split(":", 1)[1] for r in rs for k in r.metrics
                        if k.startswith("reclaimed_from:")})

        def mean(key: str, rows: Sequence[RunRecord] = rs) -> float:
            v = [r.metrics[key] for r in rows if key in r.metrics
                 and not math.isnan(r.metrics[key])]
            return sum(v) / len(v) if v else math.nan

        out += ["", f"Reclaims per team, {p} (means per window over {len(rs)} runs):", "",
                "| team | alloc / entitlement, all | reclaims suffered | reclaims made for it |",
                "|---|---|---|---|"]
        for t in sorted(teams, key=lambda t: -mean(f"reclaimed_from:{t}")):
            ratio = mean(f"ratio:{t}")
            out.append(f"| {t} | {'-' if math.isnan(ratio) else f'{ratio:.2f}'} | "
                       f"{mean(f'reclaimed_from:{t}'):.1f} | {mean(f'reclaimed_for:{t}'):.1f} |")
    return out


def carried_in(records: Sequence[RunRecord], windows: Sequence[Window],
               epoch: datetime) -> list[str]:
    """Per window: the share of capacity held by work carried into it, under FIFO (which never
    preempts, so the carried-in work runs out undisturbed; else the first policy run)."""
    rows = []
    for w in windows:
        rs = [r for r in records if r.window == w]
        if not rs:
            continue
        policy = FIFO if any(r.policy == FIFO for r in rs) else rs[0].policy
        cells = [estimate(rs, policy, key).fmt(f) for key, _, f in CARRIED_COLUMNS]
        rows.append(f"| {w.role}: {w.label(epoch)} | {policy} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "## Work carried into each window", "",
            "Share of the cluster's GPUs held by jobs already running when the window began "
            "(never measured; a policy that does not preempt cannot move them):", "",
            "| window | under | " + " | ".join(c[1] for c in CARRIED_COLUMNS) + " |",
            "|" + "---|" * (len(CARRIED_COLUMNS) + 2), *rows]


# -- plots ---------------------------------------------------------------------------------------

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


def plot(out: Path, records: Sequence[RunRecord]) -> list[str]:
    """CCDF of waits (log y), allocation / entitlement over time, preemptions over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from evaluation.metrics import team_ratios

    rs = [r for r in records if r.result is not None]
    if not rs:
        return []
    out.mkdir(parents=True, exist_ok=True)
    credit = "Trace: Philly, Jeon et al., USENIX ATC 2019 (CC BY 4.0); labels synthetic"
    names: list[str] = []
    # 1. CCDF of waits, all measured jobs, log y.
    fig, ax = plt.subplots(figsize=(9, 5))
    for k, r in enumerate(rs):
        res = r.result
        assert res is not None
        span = r.window.days * 86400.0
        w = sorted(max(res.admit[j.job_id] - j.submit, 0.0) / 3600.0 for j in res.jobs
                   if not j.carried and j.submit < span and not math.isnan(res.admit[j.job_id]))
        if not w:
            continue
        n = len(w)
        ax.step(w, [1 - i / n for i in range(n)], where="post", label=r.policy,
                color=PALETTE[k % 10], linewidth=1.3)
    ax.set_yscale("log")
    ax.set_xlabel("wait, submission → pods running (hours)")
    ax.set_ylabel("fraction of jobs waiting longer (CCDF)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.5, 0.005, credit, ha="center", fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out / "wait_ccdf.png", dpi=110)
    plt.close(fig)
    names.append("wait_ccdf.png")
    # 2. allocation / entitlement per team over time, one panel per policy.
    cols = 2
    rows = math.ceil(len(rs) / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(13, 2.6 * rows), sharex=True, sharey=True,
                             squeeze=False)
    for k, r in enumerate(rs):
        res = r.result
        assert res is not None
        from evaluation.trace import Period

        _, _, per_hour = team_ratios(res, Period(0.0, r.window.days * 86400.0), r.weights)
        ax = grid[k // cols][k % cols]
        for i, team in enumerate(res.teams):
            ys = [row[i] for row in per_hour]
            if all(math.isnan(y) for y in ys):
                continue
            ax.plot([h for h in range(len(ys))], ys, linewidth=0.8, color=PALETTE[i % 10],
                    label=team)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylim(0, 2.5)
        ax.set_title(r.policy, fontsize=9)
        ax.grid(True, alpha=0.3)
    for k in range(len(rs), rows * cols):
        grid[k // cols][k % cols].axis("off")
    for ax in grid[-1]:
        ax.set_xlabel("hours since window start (busy hours only)")
    for row in grid:
        row[0].set_ylabel("alloc / entitlement")
    fig.suptitle("Each team's allocation divided by its weighted fair share, per busy hour")
    fig.text(0.5, 0.003, credit, ha="center", fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    fig.savefig(out / "entitlement.png", dpi=100)
    plt.close(fig)
    names.append("entitlement.png")
    # 3. preemptions over time (cumulative).
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for k, r in enumerate(rs):
        res = r.result
        assert res is not None
        ts = sorted(e.time / 3600.0 for e in res.evictions if e.reason == "Preempted")
        ax.step([0.0, *ts], list(range(len(ts) + 1)), where="post", label=r.policy,
                color=PALETTE[k % 10], linewidth=1.3)
    ax.set_xlabel("hours since window start")
    ax.set_ylabel("preemptions (cumulative)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.5, 0.005, credit, ha="center", fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out / "preemptions.png", dpi=110)
    plt.close(fig)
    names.append("preemptions.png")
    return names
