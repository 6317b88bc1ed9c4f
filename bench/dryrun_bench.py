"""Benchmark the offline dry run end to end on a big snapshot file (not a test).

    .venv/bin/python bench/dryrun_bench.py [--objects 15000] [--runs 3]

Builds a snapshot of `--objects` Kubernetes objects from the bundled example (its Workloads and
Jobs cloned under new names and UIDs, about 2/3 Workloads and 1/3 Jobs, plus its queues and
nodes), written once as YAML (`kubectl get -o yaml` style) and once as JSON (`-o json`) under
bench/out/, then times `python -m controller --dry-run --from-file FILE -o json` in a fresh
process, as a user runs it, and reports wall time and the child's max RSS.
Goal: <= 5 s end to end for 15,000 objects, as YAML or as JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "cluster-snapshot.yaml"
_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def build(objects: int) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    items: list[dict[str, Any]] = []
    for d in docs:
        items.extend(d.get("items", [d]) if isinstance(d, dict) else [])
    fixed = [o for o in items if o.get("kind") not in ("Workload", "Job")]
    workloads = [o for o in items if o.get("kind") == "Workload"]
    jobs = {o["metadata"]["name"]: o for o in items if o.get("kind") == "Job"}
    out = list(fixed)
    i = 0
    while len(out) < objects:
        w = copy.deepcopy(workloads[i % len(workloads)])
        meta = w["metadata"]
        suffix = f"-{i:05d}"
        meta["name"] += suffix
        meta["uid"] = f"{meta.get('uid', 'uid')[:24]}{i:012d}"
        owner = (meta.get("ownerReferences") or [{}])[0]
        job = jobs.get(owner.get("name", ""))
        if job is not None and len(out) + 1 < objects:
            j = copy.deepcopy(job)
            j["metadata"]["name"] += suffix
            j["metadata"]["uid"] = f"job-{i:012d}"
            owner["name"] = j["metadata"]["name"]
            owner["uid"] = j["metadata"]["uid"]
            out.append(j)
        out.append(w)
        i += 1
    return {"apiVersion": "v1", "kind": "List", "items": out[:objects]}


def run_once(path: Path) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, this child's max RSS MiB, exit status) of one dry run in a
    fresh process (os.wait4 gives the child's own resource usage). CPU time is what to compare
    on a shared machine: wall time there is mostly waiting for a core."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "--dry-run", "--from-file", str(path), "-o", "json"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=15000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    doc = build(a.objects)
    kinds: dict[str, int] = {}
    for o in doc["items"]:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    ypath, jpath = a.out / "snapshot-big.yaml", a.out / "snapshot-big.json"
    ypath.write_text(yaml.dump(doc, Dumper=_Dumper, sort_keys=False))
    jpath.write_text(json.dumps(doc))
    print(f"snapshot: {len(doc['items'])} objects {kinds}; YAML {ypath.stat().st_size >> 20} MiB,"
          f" JSON {jpath.stat().st_size >> 20} MiB; libyaml: {hasattr(yaml, 'CSafeLoader')}")
    failed = 0
    for path in (ypath, jpath):
        walls, cpus, rss = [], [], 0.0
        for _ in range(a.runs):
            wall, cpu, r, rc = run_once(path)
            failed += rc != 0
            walls.append(wall)
            cpus.append(cpu)
            rss = max(rss, r)
        print(f"{path.suffix[1:]:>4}: dry run median {statistics.median(walls):.2f} s over "
              f"{a.runs} runs (min {min(walls):.2f} s), CPU median "
              f"{statistics.median(cpus):.2f} s, max RSS {rss:.0f} MiB")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
