"""One evaluation run: pick windows of the trace, label them with a seed, size the cluster, and
simulate every policy in the Kueue model (evaluation/kueue.py) under the same Kueue settings.

A *window* is `DAYS` days of the trace from a UTC date; jobs still running at its start are
carried in (never measured); the cluster is sized so the window's offered load is `target_load`;
every job submitted in the window is measured and the simulation runs until the last one ends.
The *tuning* window is the one the controller's defaults were chosen on (the busiest 3 days of
the busy period unless named); *held-out* windows are other busy windows, never used for tuning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from controller.config import SETTING_FIELDS, Settings, with_overrides
from evaluation import trace as tr
from evaluation.engine import SimConfig, SimResult
from evaluation.kueue import (
    ANY,
    COHORT,
    LOWER_OR_NEWER_EQUAL,
    LOWER_PRIORITY,
    NEVER,
    QUOTA,
    SINGLE_CQ,
    KueueConfig,
    KueueSim,
    Policy,
)
from evaluation.metrics import run_metrics
from evaluation.packing import BINPACK, SPREAD
from evaluation.policies import AfsModel, DrfClasses, DrfIdeal, Fifo, StaticClasses
from evaluation.wdrf import WdrfKueue

# The headline configuration: every policy with equal weights, and the per-team ClusterQueue
# rows again with team weights 4, 2, 1 (teams by GPU-time, the last weight repeated).
ALL_POLICIES = ("fifo", "static", "afs", "fs", "drf", "drf-classes", "wdrf", "wdrf-fs",
                "fs@4/2/1", "wdrf-fs@4/2/1")
BASE_POLICIES = ("fifo", "static", "afs", "fs", "drf", "drf-classes", "wdrf", "wdrf-fs")
SENSITIVITY_POLICIES = ("fifo", "fs", "drf-classes", "wdrf", "wdrf-fs")
PREEMPTION = {"never": NEVER, "lower": LOWER_PRIORITY, "lower-or-newer": LOWER_OR_NEWER_EQUAL}
FS_NAME = "Kueue Fair Sharing (cohort)"
WDRF_FS_NAME = "WDRF + Kueue Fair Sharing (cohort)"
AFS_NAME = "Kueue AFS (model)"
DRF_CLASSES_NAME = "DRF with classes (ideal)"
WEIGHTS_TAG = ", weights "  # display-name suffix of a row with its own team weights


def split_key(key: str) -> tuple[str, str]:
    """`wdrf-fs@4/2/1` -> (`wdrf-fs`, `4,2,1`): the policy and its own team weights ('' for
    the run's --team-weights)."""
    base, _, spec = key.partition("@")
    return base, spec.replace("/", ",")


def weights_tag(name: str) -> str:
    """The team-weights suffix of a row's display name ('' when it has none)."""
    i = name.find(WEIGHTS_TAG)
    return name[i:] if i >= 0 else ""


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    start: float  # seconds since the trace epoch (a UTC midnight)
    days: int
    role: str  # "tuning" | "held-out"

    def label(self, epoch: datetime) -> str:
        s = epoch + timedelta(seconds=self.start)
        e = s + timedelta(days=self.days)
        return f"{s:%Y-%m-%d} → {e:%Y-%m-%d}"


@dataclass(frozen=True, slots=True)
class Options:
    trace: Path | None = tr.DEFAULT_TRACE  # None: a generated trace (tests)
    days: int = 3
    tuning: str | None = None  # "YYYY-MM-DD:DAYS"; None: busiest window of the busy period
    windows: tuple[str, ...] = ()  # held-out "YYYY-MM-DD:DAYS"; empty: the busiest others
    held_out: int = 5
    seeds: int = 10
    tuning_seeds: int = 1  # label seeds on the tuning window (reported, not part of the goals)
    first_seed: int = 1
    quick: bool = False  # the tuning window only, `tuning_seeds` label seeds (at least one)
    target_load: float = 1.0
    node_gpus: int = 8
    labels: tr.LabelSpec = field(default_factory=tr.LabelSpec)
    team_weights: str = ""  # "4,2,1" (teams by GPU-time, last repeated) or "team=w,..."
    policies: tuple[str, ...] = ALL_POLICIES
    preemption: str = "lower"  # withinClusterQueue for every policy: never|lower|lower-or-newer
    admission: str = QUOTA
    topology: str = SINGLE_CQ
    checkpoint: float = 1800.0
    pods_ready_timeout: float = 300.0
    node_policy: str = BINPACK
    gpu_policy: str = SPREAD
    check_invariants: bool = False
    generated_jobs: int = 600  # only when trace is None
    generated_seed: int = 11


@dataclass(slots=True)
class RunRecord:
    window: Window
    seed: int
    policy: str  # display name
    key: str  # the --policies item
    metrics: dict[str, float]
    seconds: float
    nodes: int
    load: float
    result: SimResult | None = None  # kept only when asked (plots)
    weights: tuple[float, ...] = ()


# -- trace and windows ---------------------------------------------------------------------------

_TRACE_CACHE: dict[str, tr.Trace] = {}


def load_trace(opts: Options) -> tr.Trace:
    key = str(opts.trace) if opts.trace is not None else f"gen:{opts.generated_seed}"
    cached = _TRACE_CACHE.get(key)
    if cached is None:
        if opts.trace is None:
            cached = tr.generate_trace(opts.generated_seed, opts.generated_jobs, teams=4,
                                       span=2 * tr.DAY)
        else:
            cached = tr.load_philly(opts.trace)
        _TRACE_CACHE[key] = cached
    return cached


def parse_window(text: str, epoch: datetime, role: str) -> Window:
    """`2017-10-25:3` (UTC date : days) or `D:3` (day offset from the trace's first day)."""
    start_s, sep, days_s = text.partition(":")
    if not sep:
        raise ValueError(f"window {text!r}: expected START:DAYS, e.g. 2017-10-25:3")
    days = int(days_s)
    if days < 1:
        raise ValueError(f"window {text!r}: DAYS must be >= 1")
    day0 = datetime(epoch.year, epoch.month, epoch.day, tzinfo=UTC)
    if start_s.isdigit():
        start = day0 + timedelta(days=int(start_s))
    else:
        start = datetime.strptime(start_s, "%Y-%m-%d").replace(tzinfo=UTC)
    return Window(text, (start - epoch).total_seconds(), days, role)


def window_demand(jobs: Sequence[tr.SimJob], start: float, days: int) -> float:
    end = start + days * tr.DAY
    return sum(j.need * (min(j.submit + j.duration, end) - j.submit)
               for j in jobs if start <= j.submit < end)


def choose_windows(opts: Options, trace: tr.Trace) -> list[Window]:
    """The tuning window, then the held-out ones (named, or the busiest day-aligned windows of
    the busy period that overlap neither the tuning window nor each other)."""
    labelled = tr.label_jobs(trace.jobs, replace(opts.labels, seed=opts.first_seed))
    epoch = trace.epoch
    day0 = datetime(epoch.year, epoch.month, epoch.day, tzinfo=UTC)
    shift = (day0 - epoch).total_seconds()
    busy = tr.busy_period(labelled)
    if opts.tuning:
        tuning = parse_window(opts.tuning, epoch, "tuning")
    else:
        win = tr.busiest_window(labelled, opts.days, busy)
        tuning = Window(f"busiest {opts.days} days", win.start + shift, opts.days, "tuning")
    out = [tuning]
    if opts.quick or (opts.held_out <= 0 and not opts.windows):
        return out
    if opts.windows:
        return out + [parse_window(w, epoch, "held-out") for w in opts.windows]
    lo = int(busy.start // tr.DAY)
    hi = int(busy.end // tr.DAY) - opts.days
    ranked = sorted(
        range(lo, hi + 1),
        key=lambda d: (-window_demand(labelled, d * tr.DAY + shift, opts.days), d),
    )
    taken = [(tuning.start, tuning.start + tuning.days * tr.DAY)]
    for d in ranked:
        s = d * tr.DAY + shift
        e = s + opts.days * tr.DAY
        if any(s < te and ts < e for ts, te in taken):
            continue
        taken.append((s, e))
        out.append(Window(f"held-out {len(out)}", s, opts.days, "held-out"))
        if len(out) > opts.held_out:
            break
    return out


def team_weights(spec: str, jobs: Sequence[tr.SimJob]) -> dict[str, float]:
    """`4,2,1`: weights for the teams in order of trace GPU-time (largest first), the last one
    repeated; `a=4,b=2`: explicit (others 1). Empty: every team 1."""
    spec = spec.strip()
    if not spec:
        return {}
    if "=" in spec:
        out: dict[str, float] = {}
        for item in spec.split(","):
            k, _, v = item.partition("=")
            out[k.strip()] = float(v)
        return out
    values = [float(x) for x in spec.replace("/", ",").split(",") if x.strip()]
    use: dict[str, float] = {}
    for j in jobs:
        use[j.team] = use.get(j.team, 0.0) + j.need * j.duration
    order = sorted(use, key=lambda t: (-use[t], t))
    return {t: values[min(i, len(values) - 1)] for i, t in enumerate(order)}


# -- policies ------------------------------------------------------------------------------------

def parse_variant(name: str) -> dict[str, object]:
    """`wdrf:FAIRNESS_POINTS=50000:USAGE_HALF_LIFE=7d` -> Settings field changes, each value
    parsed exactly as config.yaml's would be."""
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


def kueue_config(opts: Options, weights: Mapping[str, float]) -> KueueConfig:
    within = PREEMPTION[opts.preemption]
    return KueueConfig(
        topology=opts.topology,
        admission=opts.admission,
        within_cluster_queue=within,
        reclaim_within_cohort=ANY if within != NEVER and opts.topology == COHORT else NEVER,
        checkpoint_interval=opts.checkpoint,
        pods_ready_timeout=opts.pods_ready_timeout,
        team_weights=dict(weights),
    )


def make_policy(key: str, opts: Options, zero: datetime, settings: Settings,
                weights: Mapping[str, float]) -> tuple[Policy, KueueConfig]:
    """A policy and the Kueue settings it runs under (the same for every policy but the
    Fair Sharing rows, a cohort of per-team ClusterQueues by definition). `key@4/2/1`: the
    policy with those team weights (`weights` must be them), named with `, weights 4/2/1`."""
    plain, spec = split_key(key)
    if spec:
        policy, k = make_policy(plain, opts, zero, settings, weights)
        policy.name = f"{policy.name}{WEIGHTS_TAG}{spec.replace(',', '/')}"
        return policy, k
    k = kueue_config(opts, weights)
    if key == "fifo":
        return Fifo(), k
    if key == "static":
        return StaticClasses(), k
    if key == "afs":
        return AfsModel(), k
    if key == "drf":
        return DrfIdeal(), k
    if key == "drf-classes":
        return DrfClasses(weights), k
    if key == "fs":
        fs = replace(k, topology=COHORT, fair_sharing=True,
                     reclaim_within_cohort=ANY if k.within_cluster_queue != NEVER else NEVER)
        return StaticClasses(
            FS_NAME,
            "per-team ClusterQueues in one cohort, nominal quota by team weight, Kueue Fair "
            "Sharing (weights = team weights, preemptionStrategies LessThanOrEqualToFinalShare, "
            "LessThanInitialShare); classes as fixed priorities 1000/100/1",
        ), fs
    base = with_overrides(settings, team_weights=dict(weights)) if weights else settings
    if key == "wdrf":
        return WdrfKueue(base, zero), k
    if key == "wdrf-hami":
        return WdrfKueue(base, zero, name="WDRF, plan's HAMi packing", apply_hami=True), k
    # Kueue runs Fair Sharing in the wdrf-fs rows, so the controller is told so there (a
    # variant may still set KUEUE_FAIR_SHARING=false).
    fs_base = with_overrides(base, kueue_fair_sharing=True)
    if key == "wdrf-fs":
        fs = replace(k, topology=COHORT, fair_sharing=True,
                     reclaim_within_cohort=ANY if k.within_cluster_queue != NEVER else NEVER)
        return WdrfKueue(fs_base, zero, name=WDRF_FS_NAME), fs
    if key.startswith(("wdrf:", "wdrf-fs:")):
        label = ", ".join(kv.replace("=", " ", 1) for kv in key.split(":")[1:] if kv.strip())
        if key.startswith("wdrf-fs:"):
            s = with_overrides(fs_base, **parse_variant(key))
            fs = replace(k, topology=COHORT, fair_sharing=True,
                         reclaim_within_cohort=ANY if k.within_cluster_queue != NEVER else NEVER)
            return WdrfKueue(s, zero, name=f"{WDRF_FS_NAME}, {label}"), fs
        s = with_overrides(base, **parse_variant(key))
        return WdrfKueue(s, zero, name=f"WDRF, {label}"), k
    if key.startswith("wdrf-halflife="):
        hl = float(key.split("=", 1)[1]) * 3600.0
        s = with_overrides(base, usage_half_life=hl)
        return WdrfKueue(s, zero, name=f"WDRF, USAGE_HALF_LIFE {hl / 3600:g} h"), k
    raise ValueError(f"unknown policy {key!r} (expected {', '.join(BASE_POLICIES)}, "
                     "wdrf-halflife=<hours>, or wdrf[-fs]:KEY=VALUE[:KEY=VALUE...], each "
                     "optionally with @W1/W2/... team weights)")


# -- running -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Prepared:
    jobs: list[tr.SimJob]
    measured: tr.Period
    nodes: int
    zero: datetime
    load: float
    weights: dict[str, float]
    labelled: list[tr.SimJob]  # the whole labelled trace (team weights by GPU-time)


def prepare(opts: Options, window: Window, seed: int) -> Prepared:
    trace = load_trace(opts)
    labelled = tr.label_jobs(trace.jobs, replace(opts.labels, seed=seed,
                                                 node_gpus=opts.node_gpus))
    end = window.start + window.days * tr.DAY
    jobs = tr.window(labelled, window.start, end)
    measured = tr.Period(0.0, window.days * tr.DAY)
    nodes = tr.size_cluster(jobs, measured, opts.node_gpus, opts.target_load)
    biggest = max((j.need for j in jobs), default=tr.PCT)
    nodes = max(nodes, math.ceil(biggest / tr.PCT / opts.node_gpus))
    load = tr.offered_load(jobs, nodes * opts.node_gpus, measured.start, measured.end)
    zero = trace.epoch + timedelta(seconds=window.start)
    weights = team_weights(opts.team_weights, labelled)
    return Prepared(jobs, measured, nodes, zero, load, weights, labelled)


def default_settings() -> Settings:
    """The controller's defaults, exactly as `Settings()` defines them (no file, no env)."""
    return Settings()


def run_window(opts: Options, window: Window, seed: int, keep_results: bool = False,
               progress: Callable[[str], None] | None = None) -> list[RunRecord]:
    prep = prepare(opts, window, seed)
    settings = default_settings()
    cfg = SimConfig(nodes=prep.nodes, node_gpus=opts.node_gpus,
                    loop_interval=settings.loop_interval, node_policy=opts.node_policy,
                    gpu_policy=opts.gpu_policy, check_invariants=opts.check_invariants)
    out: list[RunRecord] = []
    for key in opts.policies:
        spec = split_key(key)[1]
        weights = team_weights(spec, prep.labelled) if spec else prep.weights
        policy, k = make_policy(key, opts, prep.zero, settings, weights)
        t0 = time.perf_counter()
        result = KueueSim(prep.jobs, cfg, k, policy).run()
        secs = time.perf_counter() - t0
        teams = result.teams
        w = tuple(weights.get(t, 1.0) for t in teams)
        metrics = run_metrics(result, prep.measured, w, settings.loop_interval)
        out.append(RunRecord(window, seed, policy.name, key, metrics, secs, prep.nodes,
                             prep.load, result if keep_results else None, w))
        if progress:
            progress(f"  {window.name} seed {seed}: {policy.name} {secs:.1f} s")
    return out


def _task(args: tuple[Options, Window, int, bool]) -> list[RunRecord]:
    opts, window, seed, keep = args
    return run_window(opts, window, seed, keep)


def record_to_json(r: RunRecord) -> dict[str, object]:
    return {"window": r.window.name, "start": r.window.start, "days": r.window.days,
            "role": r.window.role, "seed": r.seed, "policy": r.policy, "key": r.key,
            "nodes": r.nodes, "load": r.load, "seconds": r.seconds,
            "weights": list(r.weights),
            "metrics": {k: (None if v != v else v) for k, v in r.metrics.items()}}


def record_from_json(d: Mapping[str, object]) -> RunRecord:
    def num(x: object) -> float:
        return math.nan if x is None else float(str(x))

    metrics = d["metrics"]
    weights = d["weights"]
    assert isinstance(metrics, dict) and isinstance(weights, list)
    w = Window(str(d["window"]), num(d["start"]), int(num(d["days"])), str(d["role"]))
    return RunRecord(w, int(num(d["seed"])), str(d["policy"]), str(d["key"]),
                     {str(k): num(v) for k, v in metrics.items()}, num(d["seconds"]),
                     int(num(d["nodes"])), num(d["load"]), None,
                     tuple(num(x) for x in weights))


def run_all(opts: Options, jobs: int = 1, progress: Callable[[str], None] | None = None,
            keep: Callable[[Window, int], bool] | None = None,
            done: Sequence[RunRecord] = (),
            on_task: Callable[[Sequence[RunRecord]], None] | None = None,
            ) -> tuple[list[Window], list[RunRecord], datetime]:
    """Every (window, seed), seed by seed (the tuning window first), in `jobs` processes;
    results kept where `keep` says (plots). Policy runs already in `done` (same window, seed
    and policy) are not run again; `on_task` sees each finished task's records (to save them
    as they come)."""
    trace = load_trace(opts)
    windows = choose_windows(opts, trace)
    tuning_seeds = max(opts.tuning_seeds, 1) if opts.quick else opts.tuning_seeds
    seeds = list(range(opts.first_seed, opts.first_seed + max(
        tuning_seeds, 0 if opts.quick else opts.seeds)))
    have = {(r.window.start, r.window.days, r.seed, r.key) for r in done}
    tasks = []
    asked: set[tuple[float, int, int, str]] = set()
    for i, s in enumerate(seeds):
        for w in windows:
            if i >= (opts.seeds if w.role == "held-out" else tuning_seeds):
                continue
            asked.update((w.start, w.days, s, k) for k in opts.policies)
            missing = tuple(k for k in opts.policies if (w.start, w.days, s, k) not in have)
            if missing:
                tasks.append((replace(opts, policies=missing), w, s, bool(keep and keep(w, s))))
    names = {(w.start, w.days): w for w in windows}
    # Only the runs asked for: a resumed file may hold more seeds, windows or policies, and
    # the report must describe what was asked.
    records: list[RunRecord] = [
        replace(r, window=names.get((r.window.start, r.window.days), r.window)) for r in done
        if (r.window.start, r.window.days, r.seed, r.key) in asked
    ]

    def finished(recs: list[RunRecord]) -> None:
        nonlocal records
        records += recs
        if on_task:
            on_task(recs)
        if progress:
            progress(_progress_line(recs))

    if jobs <= 1:
        for t in tasks:
            finished(_task(t))
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as ex:
            for recs in ex.map(_task, tasks):
                finished(recs)
    return windows, records, trace.epoch


def _progress_line(recs: Sequence[RunRecord]) -> str:
    if not recs:
        return ""
    r = recs[0]
    parts = ", ".join(f"{x.policy} {x.seconds:.1f} s" for x in recs)
    return f"{r.window.name} seed {r.seed} ({r.nodes} nodes, load {r.load:.2f}): {parts}"
