"""One evaluation run: prepare the workload, simulate every policy, compute metrics, report."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from controller.config import SETTING_FIELDS, Settings, with_overrides
from controller.sim import trace as tr
from controller.sim.engine import SimConfig, SimResult, Simulation
from controller.sim.metrics import PolicyMetrics, compute
from controller.sim.packing import BINPACK, SPREAD
from controller.sim.policies import AfsModel, DrfIdeal, Fifo, Policy, StaticClasses, Wdrf
from controller.sim.report import RunInfo, plot_all, render

ALL_POLICIES = ("fifo", "static", "afs", "drf", "wdrf", "wdrf-previous")

# The defaults before 2026-11 (docs/evaluation.md): classes 1000/100/1 x 250 and a fairness
# range of 20,000 points, worth only 5.6 h of waiting against the aging term.
PREVIOUS_DEFAULTS: dict[str, object] = {
    "priority_weights": {"urgent": 1000, "approved": 100, "normal": 1},
    "priority_class_unit": 250,
    "fairness_points": 20000,
}


@dataclass(frozen=True, slots=True)
class Options:
    trace: Path | None = tr.DEFAULT_TRACE  # None: generated trace (tests)
    quick: bool = False
    days: int = 3  # quick window length
    target_load: float = 1.0
    nodes: int | None = None  # override sizing
    node_gpus: int = 8
    labels: tr.LabelSpec = field(default_factory=tr.LabelSpec)
    policies: tuple[str, ...] = ALL_POLICIES
    exact_ticks: bool = False
    incremental: bool = True
    check_invariants: bool = False
    node_policy: str = BINPACK
    gpu_policy: str = SPREAD
    afs_half_life: float = 168 * 3600.0
    variant_aging: float = 0.5  # AGING_COEFFICIENT of the "wdrf-aging" variant
    generated_jobs: int = 600  # only when trace is None
    generated_seed: int = 11


@dataclass(slots=True)
class Experiment:
    info: RunInfo
    results: list[SimResult]
    metrics: list[PolicyMetrics]
    descriptions: dict[str, str]
    jobs: list[tr.SimJob]
    period: tr.Period


def wdrf_settings() -> Settings:
    """The controller's defaults, exactly as `Settings()` defines them (no config file, no env)."""
    return Settings()


def make_policies(opts: Options, zero: datetime, settings: Settings) -> list[Policy]:
    """The policies named in `opts.policies`; `zero` is the wall-clock time of simulated 0."""
    out: list[Policy] = []
    for name in opts.policies:
        if name == "fifo":
            out.append(Fifo())
        elif name == "static":
            out.append(StaticClasses())
        elif name == "afs":
            out.append(AfsModel(half_life=opts.afs_half_life))
        elif name == "drf":
            out.append(DrfIdeal())
        elif name == "wdrf":
            out.append(Wdrf(settings, zero, incremental=opts.incremental))
        elif name == "wdrf-previous":
            s = with_overrides(settings, **PREVIOUS_DEFAULTS)
            out.append(Wdrf(s, zero, name="WDRF, previous defaults", incremental=opts.incremental))
        elif name == "wdrf-aging":
            s = with_overrides(settings, aging_coefficient=opts.variant_aging)
            out.append(Wdrf(s, zero, name=f"WDRF, AGING_COEFFICIENT {opts.variant_aging:g}",
                            incremental=opts.incremental))
        elif name.startswith("wdrf:"):
            s = with_overrides(settings, **parse_variant(name))
            label = ", ".join(
                kv.replace("=", " ", 1) for kv in name.split(":")[1:] if kv.strip()
            )
            out.append(Wdrf(s, zero, name=f"WDRF, {label}", incremental=opts.incremental))
        elif name.startswith("wdrf-halflife="):
            hl = float(name.split("=", 1)[1]) * 3600.0
            s = with_overrides(settings, usage_half_life=hl)
            out.append(Wdrf(s, zero, name=f"WDRF, USAGE_HALF_LIFE {hl / 3600:g} h",
                            incremental=opts.incremental))
        else:
            raise ValueError(f"unknown policy {name!r} (expected {', '.join(ALL_POLICIES)}, "
                             "wdrf-aging, wdrf-halflife=<hours>, or wdrf:KEY=VALUE[:KEY=VALUE...])")
    return out


def parse_variant(name: str) -> dict[str, object]:
    """`wdrf:AGING_COEFFICIENT=0.25:FAIRNESS_POINTS=100000` -> Settings field changes, each value
    parsed exactly as config.yaml's would be (durations like 14d accepted)."""
    changes: dict[str, object] = {}
    for item in name.split(":")[1:]:
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in SETTING_FIELDS:
            raise ValueError(f"bad WDRF variant item {item!r} in {name!r} (expected KEY=VALUE "
                             "with a config key)")
        f = SETTING_FIELDS[key]
        changes[f.name] = f.metadata["parse"](value.strip())
    return changes


@dataclass(frozen=True, slots=True)
class Prepared:
    jobs: list[tr.SimJob]
    measured: tr.Period  # span whose submissions are measured (simulated seconds)
    nodes: int
    zero: datetime  # wall-clock time of simulated time 0
    window: str  # what is replayed, in words
    period: str  # what is measured, in words
    source: str


def prepare(opts: Options) -> Prepared:
    if opts.trace is None:
        trace = tr.generate_trace(opts.generated_seed, opts.generated_jobs, teams=4,
                                  span=tr.DAY)
    else:
        trace = tr.load_philly(opts.trace)
    labelled = tr.label_jobs(trace.jobs, opts.labels)
    if opts.quick and opts.trace is not None:
        busy = tr.busy_period(labelled)
        win = tr.busiest_window(labelled, opts.days, busy)
        jobs = tr.window(labelled, win.start, win.end)
        measured = tr.Period(0.0, win.length)
        window = (
            f"{opts.days}-day quick window {tr.fmt_time(trace.epoch, win.start)} → "
            f"{tr.fmt_time(trace.epoch, win.end)} UTC (the busiest {opts.days} days of the busy "
            "period), run until the last job ends"
        )
        period = "jobs submitted in the quick window"
        zero = trace.epoch + timedelta(seconds=win.start)
    else:
        jobs = labelled
        if opts.trace is not None:
            measured = tr.busy_period(labelled)
            period = (
                f"the busy period {tr.fmt_time(trace.epoch, measured.start)} → "
                f"{tr.fmt_time(trace.epoch, measured.end)} UTC "
                f"({measured.length / tr.DAY:.0f} days; longest run of days whose 7-day mean "
                "no-wait demand is at least the trace mean)"
            )
        else:
            measured = tr.Period(0.0, tr.DAY)
            period = "the generated day"
        window = (
            f"the whole trace from {tr.fmt_time(trace.epoch, 0.0)} UTC until the last job ends"
        )
        zero = trace.epoch
    nodes = opts.nodes or tr.size_cluster(jobs, measured, opts.node_gpus, opts.target_load)
    biggest = max((j.need for j in jobs), default=tr.PCT)
    nodes = max(nodes, math.ceil(biggest / tr.PCT / opts.node_gpus))
    return Prepared(jobs, measured, nodes, zero, window, period, trace.source)


def run(opts: Options, out: Path | None = None,
        progress: Callable[[str], None] | None = None) -> Experiment:
    prep = prepare(opts)
    jobs, measured, nodes = prep.jobs, prep.measured, prep.nodes
    settings = wdrf_settings()
    cfg = SimConfig(
        nodes=nodes,
        node_gpus=opts.node_gpus,
        loop_interval=settings.loop_interval,
        node_policy=opts.node_policy,
        gpu_policy=opts.gpu_policy,
        exact_ticks=opts.exact_ticks,
        check_invariants=opts.check_invariants,
    )
    load = tr.offered_load(jobs, nodes * opts.node_gpus, measured.start, measured.end)
    if progress:
        progress(
            f"{len(jobs):,} jobs; {prep.window}; cluster {nodes} x {opts.node_gpus} GPUs; "
            f"offered load over the measured span {load:.3f}"
        )
    results: list[SimResult] = []
    metrics: list[PolicyMetrics] = []
    seconds: dict[str, float] = {}
    descriptions: dict[str, str] = {}
    for policy in make_policies(opts, prep.zero, settings):
        t0 = time.perf_counter()
        result = Simulation(jobs, cfg, policy).run()
        seconds[policy.name] = time.perf_counter() - t0
        m = compute(result, measured)
        results.append(result)
        metrics.append(m)
        descriptions[policy.name] = policy.description
        if progress:
            progress(f"  {policy.name}: {seconds[policy.name]:.1f} s")
    ls = opts.labels
    info = RunInfo(
        title="WDRF trace evaluation" + (" (quick window)" if opts.quick else " (full trace)"),
        trace=prep.source,
        window=prep.window,
        period=prep.period,
        jobs=len(jobs),
        carried=sum(1 for j in jobs if j.carried),
        nodes=nodes,
        node_gpus=opts.node_gpus,
        load=load,
        loop_interval=settings.loop_interval,
        aging_cap=settings.max_aging_time,
        overtake_window=settings.overtake_window(),
        bound=settings.starvation_bound(lambda sec: f"{math.ceil(sec / 360) / 10:.1f} h"),
        labels=(
            f"Synthetic labels (seed {ls.seed}): {100 * ls.urgent_share:g} % urgent, "
            f"{100 * ls.approved_share:g} % approved, the rest normal; "
            f"{100 * ls.fractional_share:g} % of single-GPU jobs turned into HAMi fractions of "
            + " or ".join(f"{f} %" for f in ls.fractions)
            + " of a GPU (same duration). The trace has no classes or fractions."
        ),
        packing=(
            f"HAMi node policy {opts.node_policy}, GPU policy {opts.gpu_policy} (HAMi's "
            "defaults) unless the WDRF plan decides otherwise (its default rule: binpack/binpack "
            "for fractional work); a job is admitted only when its quota fits and every pod "
            "finds GPUs (Kueue with topology-aware admission)"
        ),
        seconds=seconds,
    )
    plots: list[str] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        plots = plot_all(out, results, metrics, info)
        (out / "report.md").write_text(render(info, results, metrics, descriptions, plots))
    return Experiment(info, results, metrics, descriptions, jobs, measured)


def table_text(exp: Experiment) -> str:
    from controller.sim.report import main_table

    return "\n".join(main_table(exp.metrics))

