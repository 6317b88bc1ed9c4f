"""CPU time of compute_plan, pure Python against the mypyc build (not a test).

    .venv/bin/python tools/compile.py                 # build it first (`make compiled`)
    .venv/bin/python bench/compiled_bench.py [--pending 40000] [--admitted 10000] [--teams 500]
                                             [--queues 1000] [--cohorts 10] [--rounds 3] [--runs 3]

Each round runs one fresh process with the pure-Python planner (the compiled modules beside
the sources ignored) and one with the compiled one, in alternating order; each builds the
synthetic cluster of bench/plan_bench.py, then times one cold plan and `--runs` more (CPU
time, automatic garbage collection paused as in the live loop) and hashes the first plan's
repr. Prints both figures per round, their ranges, and whether every plan was the same
(exit status 1 when not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pure_python_imports() -> None:
    """Import the controller package from source only from here on: the extension modules
    beside its .py files (the compiled build) are ignored."""
    from importlib.abc import PathEntryFinder
    from importlib.machinery import SOURCE_SUFFIXES, FileFinder, SourceFileLoader

    source_only = FileFinder.path_hook((SourceFileLoader, SOURCE_SUFFIXES))
    package = ROOT / "controller"

    def hook(path: str) -> PathEntryFinder:
        if Path(path).resolve() != package and not Path(path).resolve().is_relative_to(package):
            raise ImportError  # (the next hook's finder: every other directory as usual)
        return source_only(path)

    sys.path_hooks.insert(0, hook)
    sys.path_importer_cache.clear()


def child(mode: str, args: argparse.Namespace) -> None:
    """One process's timings, as a JSON line."""
    if mode == "pure":
        pure_python_imports()
    sys.path.insert(0, str(ROOT))
    import gc
    import hashlib
    import statistics
    import time

    from bench.plan_bench import NOW, synthetic
    from controller import policy
    from controller.collector import paused
    from controller.config import Settings

    compiled = not policy.__file__.endswith(".py")
    if compiled != (mode == "compiled"):
        sys.exit(f"asked for the {mode} planner, imported {policy.__file__}"
                 + (" (build it: tools/compile.py)" if mode == "compiled" else ""))
    snap = synthetic(args.pending, args.admitted, args.teams, args.queues, cohorts=args.cohorts)
    settings = Settings()
    gc.collect()
    gc.freeze()
    times = []
    with paused():
        for run in range(1 + args.runs):
            c0 = time.process_time()
            plan = policy.compute_plan(snap, settings, NOW)
            times.append(time.process_time() - c0)
            if run == 0:
                digest = hashlib.sha256(repr(plan).encode()).hexdigest()
            del plan
    print(json.dumps({"cold": times[0], "warm": statistics.median(times[1:]) if args.runs
                      else times[0], "digest": digest}))


def run(mode: str, args: argparse.Namespace) -> dict[str, float | str]:
    cmd = [sys.executable, __file__, "--child", mode, "--pending", str(args.pending),
           "--admitted", str(args.admitted), "--teams", str(args.teams), "--queues",
           str(args.queues), "--cohorts", str(args.cohorts), "--runs", str(args.runs)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"})
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pending", type=int, default=40_000)
    ap.add_argument("--admitted", type=int, default=10_000)
    ap.add_argument("--teams", type=int, default=500)
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--cohorts", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3, help="plans timed after the cold one")
    ap.add_argument("--child", choices=("pure", "compiled"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args)
        return
    print(f"{args.pending} pending + {args.admitted} admitted, {args.teams} teams, "
          f"{args.queues} ClusterQueues in {args.cohorts} cohorts; CPU time (ms); load average "
          f"{os.getloadavg()[0]:.1f}")
    results: dict[str, list[dict[str, float | str]]] = {"pure": [], "compiled": []}
    for i in range(args.rounds):
        order = ("pure", "compiled") if i % 2 == 0 else ("compiled", "pure")
        for mode in order:
            results[mode].append(run(mode, args))
        p, c = results["pure"][-1], results["compiled"][-1]
        print(f"round {i + 1}: cold plan pure {float(p['cold']) * 1000:.0f}, compiled "
              f"{float(c['cold']) * 1000:.0f}; later plans (median of {args.runs}) pure "
              f"{float(p['warm']) * 1000:.0f}, compiled {float(c['warm']) * 1000:.0f}")

    def span(mode: str, key: str) -> str:
        values = sorted(float(r[key]) * 1000 for r in results[mode])
        return f"{values[0]:.0f}-{values[-1]:.0f}"

    same = len({r["digest"] for rs in results.values() for r in rs}) == 1
    print(f"cold plan: pure {span('pure', 'cold')} ms, compiled {span('compiled', 'cold')} ms; "
          f"later plans: pure {span('pure', 'warm')} ms, compiled {span('compiled', 'warm')} ms; "
          f"load average now {os.getloadavg()[0]:.1f}")
    print(f"plans the same in both builds: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
