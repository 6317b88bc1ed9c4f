"""Benchmark the live controller on the real control plane (not a test).

    .venv/bin/python bench/live_bench.py [--workloads 5000] [--teams 20] [--steady 120]
                                         [--interval 10] [--keep]

Starts its own plane (etcd, kube-apiserver, Kueue from tools/bin), creates N pending Workload
objects directly (cheaper than Jobs) across `--teams` namespaces sharing one ClusterQueue with
a small quota, mixed classes (5 % urgent, 15 % approved), then runs `python -m controller` as a
separate process with leader election on and prints:

* the first full cycle (snapshot + plan + every write) and steady cycles (from its JSON logs),
* API requests per steady cycle by verb/resource and in total per minute (its
  `wdrf_api_requests_total` metric, scraped from /metrics), writes in steady state,
* the controller's RSS (VmRSS, and the peak VmHWM) from /proc.

AGING_STEP is set to 1 h so that no workload's aging term steps during the measurement: the
steady window then measures "nothing changed" (aging steps legitimately cause writes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.domain import APPROVED_ANNOTATION, URGENT_ANNOTATION  # noqa: E402
from tests.support import kube  # noqa: E402
from tests.support.plane import Plane  # noqa: E402
from tests.support.procs import free_port  # noqa: E402

SAMPLE = re.compile(r'^wdrf_api_requests_total\{resource="([^"]*)",verb="([^"]*)"\} (\S+)$')


def workload_body(ns: str, name: str, rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    ann = {URGENT_ANNOTATION: "true"} if roll < 0.05 else (
        {APPROVED_ANNOTATION: "true"} if roll < 0.20 else {})
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": name, "namespace": ns, "annotations": ann},
        "spec": {"queueName": "lq", "podSets": [{
            "name": "main", "count": 1, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox",
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}]},
    }


def create_workloads(plane: Plane, n: int, teams: list[str]) -> float:
    rng = random.Random(7)
    bodies = [workload_body(teams[i % len(teams)], f"wl-{i:05d}", rng) for i in range(n)]
    t0 = time.monotonic()
    local = threading.local()

    def create(body: dict[str, Any]) -> None:
        if not hasattr(local, "api"):
            local.api = plane.api_client()
        ns = body["metadata"]["namespace"]
        kube.request(local.api, "POST", kube.kueue_path("workloads", namespace=ns), body,
                     "application/json")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, bodies))
    return time.monotonic() - t0


def wait_kueue_saw_all(plane: Plane, n: int, timeout: float = 900) -> float:
    """Until the ClusterQueue counts every Workload as pending (Kueue writes a Pending
    condition only on the heads its scheduler tries, so conditions are no measure)."""
    api = plane.api_client()
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        cq = kube.request(api, "GET", kube.kueue_path("clusterqueues", "bench"))
        if int((cq.get("status") or {}).get("pendingWorkloads") or 0) >= n:
            return time.monotonic() - t0
        time.sleep(3)
    raise SystemExit(f"Kueue did not count {n} pending Workloads in {timeout}s")


def scrape(port: int) -> tuple[Counter[str], dict[str, float]]:
    """(requests by "VERB resource", a few scalar series: cycles, cycle seconds)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: Counter[str] = Counter()
    scalars: dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out[f"{m.group(2)} {m.group(1)}"] += int(float(m.group(3)))
        for name in ("wdrf_cycle_duration_seconds_sum", "wdrf_cycle_duration_seconds_count"):
            if line.startswith(name + " "):
                scalars[name] = float(line.split()[1])
    return out, scalars


def cycles(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if str(doc.get("msg", "")).startswith("cycle "):
                out.append(doc)
    return out


def rss_mib(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", type=int, default=5000)
    ap.add_argument("--teams", type=int, default=20)
    ap.add_argument("--steady", type=float, default=120.0, help="seconds of steady state")
    ap.add_argument("--interval", type=float, default=10.0, help="LOOP_INTERVAL")
    ap.add_argument("--keep", action="store_true", help="keep the plane's directory")
    args = ap.parse_args()

    with Plane.temporary(keep=args.keep) as plane:
        api = plane.api_client()
        teams = [kube.create_namespace(api, f"team-{i:02d}") for i in range(args.teams)]
        kube.create_cluster_queue(api, "bench", {"cpu": 0, "memory": "0"},
                                  namespace_selector={})
        for ns in teams:
            kube.create_local_queue(api, ns, "lq", "bench")
        created = create_workloads(plane, args.workloads, teams)
        print(f"created {args.workloads} Workloads in {created:.1f}s", flush=True)
        settled = wait_kueue_saw_all(plane, args.workloads)
        print(f"Kueue marked them pending in {settled:.1f}s more", flush=True)

        port = free_port()
        log = plane.workdir / "controller.log"
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "PYTHONUNBUFFERED": "1",
               "METRICS_PORT": str(port), "LOOP_INTERVAL": str(args.interval),
               "LOG_FORMAT": "json", "LEADER_ELECTION": "true", "CAPACITY_SOURCE": "quota",
               "AGING_STEP": "1h", "PRIORITY_MODE": "auto", "LEASE_NAME": "wdrf-bench"}
        started = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "controller"], cwd=REPO, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        try:
            while not any(c.get("results") for c in cycles(log)):
                if proc.poll() is not None:
                    raise SystemExit(f"controller exited: {log.read_text()[-3000:]}")
                time.sleep(1)
            first = next(c for c in cycles(log) if c.get("results"))
            to_first = time.monotonic() - started
            # Let the watches catch up with our own writes, then measure a steady window.
            time.sleep(2 * args.interval)
            (req0, sc0), t0 = scrape(port), time.monotonic()
            time.sleep(args.steady)
            (req1, sc1), t1 = scrape(port), time.monotonic()
            rss, hwm = rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)

    delta = req1 - req0
    count, total = "wdrf_cycle_duration_seconds_count", "wdrf_cycle_duration_seconds_sum"
    n_cycles = max(1, int(sc1[count] - sc0[count]))
    steady_secs = sc1[total] - sc0[total]
    writes = sum(v for k, v in delta.items() if k.split()[0] in ("PATCH", "POST", "PUT"))
    lease_writes = sum(v for k, v in delta.items() if k == "PUT leases")
    lease = sum(v for k, v in delta.items() if k.endswith(" leases"))
    minutes = (t1 - t0) / 60
    print("\n=== live controller benchmark ===")
    print(f"pending Workloads: {args.workloads} in {args.teams} namespaces, one ClusterQueue")
    print(f"start to end of first writing cycle: {to_first:.1f}s")
    print(f"first full cycle (snapshot+plan+writes+Events): {first['seconds']:.2f}s, "
          f"results {first['results']}")
    print(f"steady window: {t1 - t0:.0f}s, {n_cycles} cycles, mean cycle "
          f"{steady_secs / n_cycles:.3f}s")
    print(f"steady-state writes other than the Lease: {writes - lease_writes} "
          f"in {n_cycles} cycles (goal 0)")
    print(f"API requests per steady cycle: {sum(delta.values()) / n_cycles:.1f} "
          f"({', '.join(f'{k}={v}' for k, v in sorted(delta.items()))} over {n_cycles} cycles)")
    print(f"API requests per minute: {sum(delta.values()) / minutes:.1f} "
          f"(of which Lease get/update: {lease / minutes:.1f}/min)")
    print(f"controller RSS: {rss:.0f} MiB now, peak {hwm:.0f} MiB (goal <= 250 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
