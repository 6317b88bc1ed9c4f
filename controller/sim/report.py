"""Markdown report and PNG plots (matplotlib, Agg backend) for a set of simulated policies."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller.domain import PriorityClass
from controller.sim.engine import SimResult
from controller.sim.metrics import PolicyMetrics, quantile
from controller.sim.trace import CITATION, HOUR, PCT

CLASSES = (PriorityClass.URGENT, PriorityClass.APPROVED, PriorityClass.NORMAL)
# matplotlib's tab10
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the report says about the run (method, sizes, synthetic labels)."""

    title: str
    trace: str
    window: str  # human description of the replayed span
    period: str  # human description of the measured span
    jobs: int
    carried: int
    nodes: int
    node_gpus: int
    load: float
    loop_interval: float
    aging_cap: float  # MAX_AGING_TIME
    overtake_window: float  # Settings.overtake_window(): against every later arrival
    bound: str  # Settings.starvation_bound(), per overtaking class
    labels: str  # synthetic-label disclosure
    packing: str
    seconds: Mapping[str, float] = field(default_factory=dict)  # wall time per policy


def fmt_min(seconds: float) -> str:
    """Minutes, compact: 0, 0.4, 14, 2,777."""
    if seconds != seconds:
        return "-"
    m = seconds / 60.0
    if m < 0.05:
        return "0"
    if m < 10:
        return f"{m:.1f}"
    return f"{m:,.0f}"


def fmt_h(seconds: float) -> str:
    if seconds != seconds:
        return "-"
    return f"{seconds / HOUR:,.1f}"


def fmt_pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f} %"


def _cls_cell(m: PolicyMetrics, c: PriorityClass) -> str:
    q = m.wait[c]
    return " / ".join(fmt_min(v) for v in (q.p50, q.p95, q.p99, q.max))


def main_table(metrics: Sequence[PolicyMetrics]) -> list[str]:
    head = (
        "| policy | urgent wait p50 / p95 / p99 / max (min) | approved (min) | normal (min) "
        "| max normal wait (h) | Jain, busy windows: mean (≥ 0.9) | GPU util. "
        "| JCT mean / p99 (h) | priority writes / h |"
    )
    rows = [head, "|" + "---|" * 9]
    for m in metrics:
        jain = (
            "-" if m.jain_busy_mean != m.jain_busy_mean
            else f"{m.jain_busy_mean:.3f} ({100 * m.jain_busy_ge_09:.0f} %)"
        )
        writes = f"{m.writes_per_hour:,.0f}" if m.extra.get("plan_calls") else "0 (no controller)"
        rows.append(
            f"| {m.policy} | {_cls_cell(m, PriorityClass.URGENT)} "
            f"| {_cls_cell(m, PriorityClass.APPROVED)} | {_cls_cell(m, PriorityClass.NORMAL)} "
            f"| {fmt_h(m.wait[PriorityClass.NORMAL].max)} | {jain} | {fmt_pct(m.utilisation)} "
            f"| {fmt_h(m.jct.mean)} / {fmt_h(m.jct.p99)} | {writes} |"
        )
    return rows


SIZE_GROUPS: tuple[tuple[str, float, float], ...] = (
    ("≤ 1 GPU (incl. fractions)", 0, PCT),
    ("2-8 GPUs (one node)", PCT + 1, 8 * PCT),
    ("> 8 GPUs (several nodes)", 8 * PCT + 1, math.inf),
)


def size_table(results: Sequence[SimResult], metrics: Sequence[PolicyMetrics]) -> list[str]:
    """Normal-class p99 / max wait by job size: what priorities can and cannot bound."""
    rows = [
        "| policy | " + " | ".join(f"{name}: p99 / max (h)" for name, _, _ in SIZE_GROUPS) + " |",
        "|" + "---|" * (len(SIZE_GROUPS) + 1),
    ]
    for r, m in zip(results, metrics, strict=True):
        cells = []
        for _, lo, hi in SIZE_GROUPS:
            w = sorted(
                r.admit[j.job_id] - j.submit
                for j in r.jobs
                if not j.carried and j.cls is PriorityClass.NORMAL
                and m.period.start <= j.submit < m.period.end
                and lo <= j.need <= hi and not math.isnan(r.admit[j.job_id])
            )
            cells.append(f"{fmt_h(quantile(w, 0.99))} / {fmt_h(w[-1])} (n={len(w)})" if w else "-")
        rows.append(f"| {m.policy} | " + " | ".join(cells) + " |")
    return rows


@dataclass(frozen=True, slots=True)
class Goal:
    text: str
    met: bool | None  # None: not applicable / not measurable
    detail: str


def goals(metrics: Sequence[PolicyMetrics], info: RunInfo, wdrf: str = "WDRF") -> list[Goal]:
    by = {m.policy: m for m in metrics}
    w = by.get(wdrf)
    if w is None:
        return []
    out: list[Goal] = []
    best = min(m.wait[PriorityClass.URGENT].p99 for m in metrics)
    wu = w.wait[PriorityClass.URGENT].p99
    out.append(Goal(
        "WDRF urgent p99 wait within one LOOP_INTERVAL of the best policy",
        wu <= best + info.loop_interval,
        f"WDRF {fmt_min(wu)} min, best {fmt_min(best)} min, LOOP_INTERVAL {info.loop_interval:g} s",
    ))
    nmax = w.wait[PriorityClass.NORMAL].max
    others = {
        name: by[name].wait[PriorityClass.NORMAL].max
        for name in ("FIFO", "Kueue AFS (model)") if name in by
    }
    out.append(Goal(
        "WDRF normal-class max wait below FIFO's and the AFS model's",
        all(nmax < v for v in others.values()),
        f"WDRF {fmt_h(nmax)} h; " + ", ".join(f"{k} {fmt_h(v)} h" for k, v in others.items())
        + f"; overtake window (all classes) {fmt_h(info.overtake_window)} h, aging cap "
        f"{fmt_h(info.aging_cap)} h",
    ))
    out.append(Goal(
        "WDRF Jain's index ≥ 0.9 in busy windows (mean)",
        w.jain_busy_mean >= 0.9 if w.jain_busy_mean == w.jain_busy_mean else None,
        f"mean {w.jain_busy_mean:.3f}, {100 * w.jain_busy_ge_09:.0f} % of {w.busy_windows} "
        "busy windows ≥ 0.9",
    ))
    if "FIFO" in by:
        f = by["FIFO"].utilisation
        out.append(Goal(
            "WDRF utilisation within 2 % of FIFO's",
            w.utilisation >= f - 0.02,
            f"WDRF {fmt_pct(w.utilisation)}, FIFO {fmt_pct(f)}",
        ))
    ok = all(m.admitted_once and m.gpu_time_error < 1e-9 for m in metrics)
    out.append(Goal(
        "Fractional packing counted correctly (every job admitted once, GPU-time conserved, "
        "no GPU over 100 %)",
        ok,
        "max jobs sharing one GPU: " + ", ".join(f"{m.policy} {m.max_tenants}" for m in metrics),
    ))
    return out


def render(
    info: RunInfo,
    results: Sequence[SimResult],
    metrics: Sequence[PolicyMetrics],
    descriptions: Mapping[str, str],
    plots: Sequence[str],
) -> str:
    lines = [f"# {info.title}", ""]
    lines += [
        f"Trace: Philly ({CITATION}); `{info.trace}`.",
        "",
        f"- Replayed: {info.window}; measured: {info.period}.",
        f"- Jobs: {info.jobs:,} ({info.carried:,} carried in from before the window as initial "
        "load, not measured).",
        f"- Cluster: {info.nodes} nodes x {info.node_gpus} GPUs = {info.nodes * info.node_gpus:,} "
        f"GPUs, one ClusterQueue with that quota in GPU-equivalents; offered load over the "
        f"measured span {info.load:.2f}.",
        f"- Packing: {info.packing}.",
        f"- {info.labels}",
        f"- Controller loop: LOOP_INTERVAL {info.loop_interval:g} s; MAX_AGING_TIME "
        f"{fmt_h(info.aging_cap)} h; starvation bound: {info.bound}",
        "",
        "## Results",
        "",
        "Waits are queueing delays (submission → admission) of jobs submitted in the measured "
        "span, in minutes: p50 / p95 / p99 / max. Jain's index is demand-capped, per hour, over "
        "the hours where demand ≥ capacity. Writes count changes of a workload's target "
        "priority between controller cycles.",
        "",
    ]
    lines += main_table(metrics)
    lines += ["", "Normal-class waits by job size (hours):", ""]
    lines += size_table(results, metrics)
    lines += ["", "## Goals", ""]
    for g in goals(metrics, info):
        mark = "n/a" if g.met is None else ("met" if g.met else "NOT met")
        lines.append(f"- **{mark}**: {g.text} — {g.detail}")
    lines += ["", "## Policies", ""]
    for m in metrics:
        lines.append(f"- **{m.policy}**: {descriptions.get(m.policy, '')}")
    lines += ["", "## Checks and cost", ""]
    for r, m in zip(results, metrics, strict=True):
        cost = ""
        if m.extra.get("plan_calls"):
            cost = (
                f"; {m.extra['plan_calls']:,.0f} compute_plan calls, "
                f"{m.extra['plan_ms_mean']:.2f} ms each on {m.extra['plan_workloads_mean']:.0f} "
                f"workloads on average; {r.ticks_evaluated:,} of {r.ticks_total:,} ticks "
                "evaluated"
            )
        secs = info.seconds.get(m.policy)
        wall = f"{secs:.1f} s" if secs is not None else "?"
        lines.append(
            f"- {m.policy}: {wall}; every job admitted exactly once: {m.admitted_once}; "
            f"GPU-time conservation error {m.gpu_time_error:.1e}; never admitted "
            f"{m.never_admitted}; makespan {fmt_h(m.makespan)} h{cost}"
        )
    if plots:
        lines += ["", "## Plots", ""]
        for p in plots:
            lines.append(f"![{p}]({p})")
    lines += [
        "",
        "Classes (urgent/approved/normal) and GPU fractions are synthetic (seeded), not part of "
        f"the trace. Trace: {CITATION}.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Plots


def _smooth(values: Sequence[float], span: int) -> list[float]:
    """Trailing moving average over `span` points."""
    out: list[float] = []
    acc = 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= span:
            acc -= values[i - span]
        out.append(acc / min(i + 1, span))
    return out


def plot_all(
    out: Path, results: Sequence[SimResult], metrics: Sequence[PolicyMetrics], info: RunInfo
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    colors = PALETTE
    credit = (
        "Trace: Philly, Jeon et al., USENIX ATC 2019 (CC BY 4.0); classes and fractions synthetic"
    )

    # 1. Wait-time CDF per class per policy.
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), sharey=True)
    for ax, c in zip(axes, CLASSES, strict=True):
        for k, (r, m) in enumerate(zip(results, metrics, strict=True)):
            w = sorted(
                max(r.admit[j.job_id] - j.submit, 0.0) / 60.0
                for j in r.jobs
                if not j.carried and j.cls is c and m.period.start <= j.submit < m.period.end
                and not math.isnan(r.admit[j.job_id])
            )
            if not w:
                continue
            ys = [(i + 1) / len(w) for i in range(len(w))]
            ax.step(w, ys, where="post", label=m.policy, color=colors[k % 10], linewidth=1.4)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(left=0)
        ax.set_title(f"{c.value} class")
        ax.set_xlabel("queueing delay (minutes, log scale above 1)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("fraction of jobs admitted")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Queueing delay CDF per class — {info.title}")
    fig.text(0.5, 0.01, credit, ha="center", fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(out / "wait_cdf.png", dpi=110)
    plt.close(fig)
    names.append("wait_cdf.png")

    # 2. Team share over time (stacked), one panel per policy.
    teams = results[0].teams
    totals = [sum(r.series.alloc[w][i] for r in results[:1] for w in range(len(r.series.alloc)))
              for i in range(len(teams))]
    top = sorted(range(len(teams)), key=lambda i: -totals[i])[:8]
    n = len(results)
    cols = 2 if n > 1 else 1
    rows = math.ceil(n / cols)
    fig, axes_grid = plt.subplots(rows, cols, figsize=(14, 2.8 * rows), sharex=True, sharey=True,
                                  squeeze=False)
    for k, (r, m) in enumerate(zip(results, metrics, strict=True)):
        ax = axes_grid[k // cols][k % cols]
        b = r.series.bin
        w0 = int(m.period.start // b)
        w1 = min(math.ceil(m.period.end / b), len(m.share_series))
        xs = [(w * b) / 86400.0 for w in range(w0, w1)]
        span = max(1, int(6 * HOUR // b)) if m.period.length > 7 * 86400 else 1
        stacks = [_smooth([m.share_series[w][i] for w in range(w0, w1)], span) for i in top]
        other = _smooth([
            sum(m.share_series[w][i] for i in range(len(teams)) if i not in top)
            for w in range(w0, w1)
        ], span)
        labels = [teams[i] for i in top] + ["other teams"]
        ax.stackplot(xs, *stacks, other, labels=labels, colors=[*colors[:8], "#cccccc"])
        ax.set_title(m.policy, fontsize=10)
        ax.set_ylim(0, 1.0)
        ax.grid(True, alpha=0.3)
    for k in range(n, rows * cols):
        axes_grid[k // cols][k % cols].axis("off")
    handles, labels = axes_grid[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
               bbox_to_anchor=(0.5, 0.015), frameon=False)
    for ax in axes_grid[-1]:
        ax.set_xlabel("days since start of replay")
    for row in axes_grid:
        row[0].set_ylabel("share of GPUs")
    long_run = metrics[0].period.length > 7 * 86400
    fig.suptitle("Team (virtual cluster) share of GPU capacity over time"
                 + (" (6 h mean)" if long_run else " (hourly)"))
    fig.text(0.5, 0.003, credit, ha="center", fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(out / "team_share.png", dpi=100)
    plt.close(fig)
    names.append("team_share.png")

    # 3. Utilisation over time (6-hour moving average) and Jain's index per busy window.
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(14, 7), sharex=True)
    for k, (r, m) in enumerate(zip(results, metrics, strict=True)):
        b = r.series.bin
        w0 = int(m.period.start // b)
        w1 = min(math.ceil(m.period.end / b), len(m.util_series))
        u = m.util_series[w0:w1]
        smooth = _smooth(u, max(1, int(6 * HOUR // b)))
        xs = [(w * b) / 86400.0 for w in range(w0, w1)]
        ax1.plot(xs, smooth, label=m.policy, color=colors[k % 10], linewidth=1.2)
        js = m.jain_series
        day = max(1, int(24 * HOUR // b))
        jm: list[float] = []
        for i in range(len(js)):
            vals = [x for x in js[max(0, i - day + 1): i + 1] if x == x]
            jm.append(sum(vals) / len(vals) if vals and js[i] == js[i] else math.nan)
        ax2.plot(xs[: len(jm)], jm, color=colors[k % 10], linewidth=1.2, label=m.policy)
    ax1.set_ylabel("GPU utilisation (6 h mean)")
    ax1.set_ylim(0, 1.05)
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8, loc="lower right", ncol=3)
    ax2.set_ylabel("Jain's index, busy hours\n(24 h mean)")
    ax2.set_ylim(0, 1.02)
    ax2.axhline(0.9, color="gray", linestyle="--", linewidth=0.8)
    ax2.grid(True, alpha=0.3)
    ax2.set_xlabel("days since start of replay")
    fig.suptitle("Utilisation (allocated GPU-equivalents / capacity) and fairness over time")
    fig.text(0.5, 0.005, credit, ha="center", fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    fig.savefig(out / "utilisation.png", dpi=100)
    plt.close(fig)
    names.append("utilisation.png")
    return names
