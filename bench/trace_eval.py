"""Replay the Philly GPU trace through a Kueue + HAMi simulator, WDRF head to head with Kueue's
own orderings. Writes a Markdown report with one table and PNG plots; prints the table.

    python bench/trace_eval.py --quick             # 3 busiest days, ~10 s
    python bench/trace_eval.py                     # whole trace, a few minutes
    python bench/trace_eval.py --trace PATH --out DIR

Trace: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
Workloads", USENIX ATC 2019 (Philly trace, CC BY 4.0). Classes and GPU fractions are synthetic.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from controller.sim import trace as tr  # noqa: E402
from controller.sim.experiment import ALL_POLICIES, Options, run, table_text  # noqa: E402
from controller.sim.packing import POLICIES  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=REPO / tr.DEFAULT_TRACE,
                   help="philly.csv (default: ../shared/traces/philly.csv beside the repo)")
    p.add_argument("--quick", action="store_true", help="replay only the busiest few days")
    p.add_argument("--days", type=int, default=3, help="quick window length in days (3)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out",
                   help="report directory (default bench/out/)")
    p.add_argument("--load", type=float, default=None,
                   help="target offered load over the measured span, sizes the cluster "
                   "(default 1.0 for --quick, 0.9 for the whole trace)")
    p.add_argument("--nodes", type=int, default=None,
                   help="cluster size in nodes (overrides --load)")
    p.add_argument("--node-gpus", type=int, default=8)
    p.add_argument("--seed", type=int, default=1, help="seed of the synthetic labels")
    p.add_argument("--urgent", type=float, default=0.02, help="share of urgent jobs")
    p.add_argument("--approved", type=float, default=0.15, help="share of approved jobs")
    p.add_argument("--fractional", type=float, default=0.30,
                   help="share of single-GPU jobs made fractional (0.25 or 0.5 GPU)")
    p.add_argument("--policies", default=",".join(ALL_POLICIES),
                   help=f"comma list from {', '.join(ALL_POLICIES)}, wdrf-aging, "
                   "wdrf-halflife=<hours>, wdrf:KEY=VALUE[:KEY=VALUE...] (WDRF with config keys "
                   "changed, e.g. wdrf:AGING_COEFFICIENT=0.5:MAX_AGING_TIME=14d)")
    p.add_argument("--node-policy", choices=POLICIES, default="binpack")
    p.add_argument("--gpu-policy", choices=POLICIES, default="spread")
    p.add_argument("--exact-ticks", action="store_true",
                   help="evaluate every controller tick on the full cluster (slow; for checks)")
    p.add_argument("--no-plots", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    opts = Options(
        trace=a.trace.resolve(),
        quick=a.quick,
        days=a.days,
        target_load=a.load if a.load is not None else (1.0 if a.quick else 0.9),
        nodes=a.nodes,
        node_gpus=a.node_gpus,
        labels=tr.LabelSpec(seed=a.seed, urgent_share=a.urgent, approved_share=a.approved,
                            fractional_share=a.fractional, node_gpus=a.node_gpus),
        policies=tuple(x.strip() for x in a.policies.split(",") if x.strip()),
        exact_ticks=a.exact_ticks,
        incremental=not a.exact_ticks,
        node_policy=a.node_policy,
        gpu_policy=a.gpu_policy,
    )
    t0 = time.perf_counter()
    try:
        exp = run(opts, out=None if a.no_plots else a.out, progress=lambda s: print(s, flush=True))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.no_plots:
        a.out.mkdir(parents=True, exist_ok=True)
        from controller.sim.report import render

        (a.out / "report.md").write_text(
            render(exp.info, exp.results, exp.metrics, exp.descriptions, [])
        )
    print()
    print(table_text(exp))
    print()
    print(f"report: {a.out / 'report.md'} ({time.perf_counter() - t0:.1f} s in all)")
    print(f"Trace: {tr.CITATION}. Classes and GPU fractions are synthetic.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
