"""Replay the Philly GPU trace through a Kueue + HAMi model, WDRF against Kueue's own policies,
on a tuning window and held-out busy windows x label seeds, with bootstrap 95 % confidence
intervals and the decision-quality goals checked. Writes a Markdown report and PNG plots.

    python bench/trace_eval.py --quick          # the tuning window, one seed
    python bench/trace_eval.py                  # tuning + 5 held-out windows x 10 seeds
    python bench/trace_eval.py --sensitivity --load 1.1   # 3 held-out windows x 10 seeds
    python bench/trace_eval.py --window 2017-10-02:3 --window 2017-11-06:3 --seeds 3

Trace: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
Workloads", USENIX ATC 2019 (Philly trace, CC BY 4.0). Classes and GPU fractions are synthetic.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from evaluation import trace as tr  # noqa: E402
from evaluation.evaluate import (  # noqa: E402
    COLUMNS,
    COST_COLUMNS,
    PACKING_COLUMNS,
    check_goals,
    plot,
    render,
    table,
)
from evaluation.experiment import (  # noqa: E402
    ALL_POLICIES,
    BASE_POLICIES,
    PREEMPTION,
    SENSITIVITY_POLICIES,
    Options,
    RunRecord,
    Window,
    choose_windows,
    default_settings,
    load_trace,
    make_policy,
    record_from_json,
    record_to_json,
    run_all,
)
from evaluation.kueue import COHORT, PLACEMENT, QUOTA, SINGLE_CQ  # noqa: E402
from evaluation.packing import POLICIES  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=tr.DEFAULT_TRACE,
                   help="philly.csv (default: $WDRF_TRACE, else ../shared/traces/philly.csv "
                   "beside the repository)")
    p.add_argument("--sensitivity", action="store_true",
                   help="a sensitivity row: the 3 busiest held-out windows x 10 seeds, no "
                   f"tuning window, policies {','.join(SENSITIVITY_POLICIES)} (each can be "
                   "overridden: --held-out, --seeds, --policies)")
    p.add_argument("--quick", action="store_true",
                   help="the tuning window only, --tuning-seeds label seeds (1)")
    p.add_argument("--days", type=int, default=3, help="window length in days (3)")
    p.add_argument("--tuning", default=None, metavar="START:DAYS",
                   help="the tuning window (default: the busiest DAYS of the busy period)")
    p.add_argument("--window", action="append", default=[], metavar="START:DAYS",
                   help="a held-out window, START a UTC date (2017-10-02) or a day offset; "
                   "repeatable (default: the --held-out busiest windows that do not overlap)")
    p.add_argument("--held-out", type=int, default=None,
                   help="held-out windows to pick (5; 3 with --sensitivity)")
    p.add_argument("--seeds", type=int, default=10, help="label seeds per window (10)")
    p.add_argument("--tuning-seeds", type=int, default=None,
                   help="label seeds on the tuning window (1, 0 with --sensitivity; it is not "
                   "part of the goals; with --quick the seeds run)")
    p.add_argument("--seed", type=int, default=1, help="first label seed (1)")
    p.add_argument("--load", type=float, default=1.0,
                   help="offered load each window's cluster is sized for (1.0)")
    p.add_argument("--node-gpus", type=int, default=8)
    p.add_argument("--urgent", type=float, default=0.02, help="share of urgent jobs")
    p.add_argument("--approved", type=float, default=0.15, help="share of approved jobs")
    p.add_argument("--fractional", type=float, default=0.30,
                   help="share of single-GPU jobs made fractional (0.25 or 0.5 GPU)")
    p.add_argument("--team-weights", default="",
                   help="'4,2,1': weights for teams by GPU-time (largest first, last repeated),"
                   " or 'team=w,...' (default: all 1)")
    p.add_argument("--policies", default=None,
                   help=f"comma list from {', '.join(BASE_POLICIES)}, wdrf-halflife=<hours>, "
                   "wdrf[-fs]:KEY=VALUE[:KEY=VALUE...] (WDRF, or WDRF + Fair Sharing, with "
                   "config keys changed), each optionally with @W1/W2/... (its own team "
                   f"weights, as --team-weights); default {','.join(ALL_POLICIES)}")
    p.add_argument("--preemption", choices=sorted(PREEMPTION), default="lower",
                   help="withinClusterQueue for every policy: never, lower (LowerPriority) or "
                   "lower-or-newer (LowerOrNewerEqualPriority); reclaimWithinCohort Any in a "
                   "cohort unless never (default lower)")
    p.add_argument("--admission", choices=(QUOTA, PLACEMENT), default=QUOTA,
                   help="quota: Kueue admits on quota, pods wait for the scheduler "
                   "(waitForPodsReady); placement: only what can be placed now")
    p.add_argument("--topology", choices=(SINGLE_CQ, COHORT), default=SINGLE_CQ,
                   help="one ClusterQueue, or one per team in a cohort (the Fair Sharing "
                   "baseline is always a cohort)")
    p.add_argument("--checkpoint", type=float, default=30.0,
                   help="checkpoint interval in minutes: a preempted job loses the work since")
    p.add_argument("--node-policy", choices=POLICIES, default="binpack")
    p.add_argument("--gpu-policy", choices=POLICIES, default="spread")
    p.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out",
                   help="report directory (default bench/out/)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: write the report from the runs in OUT/records.jsonl "
                   "(those of the --seeds asked for)")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already in OUT/records.jsonl (same windows and seeds) "
                   "and run only the missing ones; every finished run is appended there")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    opts = Options(
        trace=a.trace.resolve(),
        days=a.days,
        tuning=a.tuning,
        windows=tuple(a.window),
        held_out=a.held_out if a.held_out is not None else 3 if a.sensitivity else 5,
        seeds=a.seeds,
        tuning_seeds=(a.tuning_seeds if a.tuning_seeds is not None
                      else 0 if a.sensitivity else 1),
        first_seed=a.seed,
        quick=a.quick,
        target_load=a.load,
        node_gpus=a.node_gpus,
        labels=tr.LabelSpec(urgent_share=a.urgent, approved_share=a.approved,
                            fractional_share=a.fractional, node_gpus=a.node_gpus),
        team_weights=a.team_weights,
        policies=tuple(x.strip() for x in (a.policies or ",".join(
            SENSITIVITY_POLICIES if a.sensitivity else ALL_POLICIES)).split(",") if x.strip()),
        preemption=a.preemption,
        admission=a.admission,
        topology=a.topology,
        checkpoint=a.checkpoint * 60.0,
        node_policy=a.node_policy,
        gpu_policy=a.gpu_policy,
    )
    settings = default_settings()
    descriptions = {}
    try:
        for key in opts.policies:
            pol, _ = make_policy(key, opts, datetime(2017, 1, 1, tzinfo=UTC), settings, {})
            descriptions[pol.name] = pol.description
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    first: dict[str, int] = {}

    def keep(w: Window, seed: int) -> bool:
        role = getattr(w, "role", "")
        want = "tuning" if opts.quick else "held-out"
        if role != want or seed != opts.first_seed:
            return False
        name = str(getattr(w, "name", ""))
        first.setdefault(role, 0)
        if first[role] and name not in first:
            return False
        first[role] = 1
        first[name] = 1
        return True

    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "records.jsonl"
    done = []
    if a.report_only and not log.is_file():
        print(f"error: --report-only needs the runs in {log}, which does not exist",
              file=sys.stderr)
        return 2
    if a.report_only or (a.resume and log.is_file()):
        done = [record_from_json(json.loads(line)) for line in log.read_text().splitlines()
                if line.strip()]
        print(f"resuming: {len(done)} policy runs already in {log}")
    elif log.exists():
        log.unlink()

    def save(recs: Sequence[RunRecord]) -> None:
        with log.open("a") as fh:
            for r in recs:
                fh.write(json.dumps(record_to_json(r), allow_nan=False) + "\n")

    try:
        trace = load_trace(opts)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.report_only:
        names = {(w.start, w.days): w for w in choose_windows(opts, trace)}
        windows = [w for w in names.values()
                   if any((r.window.start, r.window.days) == (w.start, w.days) for r in done)]
        last = opts.first_seed + max(opts.seeds, opts.tuning_seeds)
        records = [replace(r, window=names.get((r.window.start, r.window.days), r.window))
                   for r in done if opts.first_seed <= r.seed < last]
        epoch = trace.epoch
        a.no_plots = True
    else:
        windows, records, epoch = _run(a, opts, keep, done, save)

    seconds = time.perf_counter() - t0
    plots = [] if a.no_plots else plot(a.out, records)
    command = "python bench/trace_eval.py" + (" " + shlex.join(argv) if argv else
                                               " " + shlex.join(sys.argv[1:]) if sys.argv[1:]
                                               else "")
    report = render(opts, windows, records, epoch, settings.loop_interval, descriptions, plots,
                    seconds, command.strip())
    (a.out / "report.md").write_text(report)
    policies = list(dict.fromkeys(r.policy for r in records))
    role = "tuning" if opts.quick else "held-out"
    shown = [r for r in records if r.window.role == role]
    print()
    print("\n".join(table(shown, policies, COLUMNS)))
    print()
    print("\n".join(table(shown, policies, COST_COLUMNS)))
    print()
    print("\n".join(table(shown, policies, PACKING_COLUMNS)))
    for wdrf in [] if opts.quick else [p for p in policies if p.startswith("WDRF")]:
        print()
        for g in check_goals(shown, settings.loop_interval, wdrf):
            mark = {True: "met", False: "NOT met", None: "not checked"}[g.met]
            print(f"- {g.name}: {mark} — {g.detail}")
    print()
    print(f"report: {a.out / 'report.md'} ({seconds:.1f} s in all)")
    print(f"Trace: {tr.CITATION}. Classes and GPU fractions are synthetic.")
    return 0


def _run(a: argparse.Namespace, opts: Options, keep: Callable[[Window, int], bool],
         done: list[RunRecord], save: Callable[[Sequence[RunRecord]], None]
         ) -> tuple[list[Window], list[RunRecord], datetime]:
    return run_all(opts, jobs=a.jobs, keep=keep, done=done, on_task=save,
                   progress=lambda s: print(s, flush=True))


if __name__ == "__main__":
    sys.exit(main())
