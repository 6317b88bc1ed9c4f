"""Benchmark the live controller on the real control plane (not a test), at default settings.

    .venv/bin/python bench/live_bench.py [--workloads 5000] [--teams 20] [--hours 1]
                                         [--rebase] [--keep]

Starts its own plane (etcd, kube-apiserver with its audit log, Kueue from tools/bin), creates N
pending Workload objects directly (cheaper than Jobs) across `--teams` namespaces sharing one
ClusterQueue with no quota, mixed classes (5 % urgent, 15 % approved), then runs the live
controller in this process with the settings users get (config.yaml: PRIORITY_MODE auto,
WRITE_BUDGET, CLIENT_QPS, leader election on, its Lease renewed in real time), and reports:

* the first cycles until nothing is left to write: time and writes;
* steady state: `--hours` of simulated time, one cycle per LOOP_INTERVAL (10 s) with the plan's
  clock advanced by that much each cycle while the informers keep watching the real apiserver
  (priority model v2 writes nothing for the passing of time, so simulated time is what matters;
  real time spent is printed too): writes and Events other than the Lease;
* with `--rebase`, one cycle just after the next weekly rebase: its writes and Events.

Writes are counted in the apiserver's audit log (user agent "wdrf-controller"), not by the
controller. Also prints this process's peak RSS (controller + bench, an upper bound).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.config import load_settings  # noqa: E402
from controller.domain import APPROVED_ANNOTATION, URGENT_ANNOTATION  # noqa: E402
from controller.encoding import next_rebase  # noqa: E402
from controller.live.kube import KubeTransport  # noqa: E402
from controller.live.runner import LiveController  # noqa: E402
from tests.support import kube  # noqa: E402
from tests.support.plane import Plane  # noqa: E402

AGENT = "wdrf-controller"


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


def create_workloads(plane: Plane, n: int, teams: list[str], start: int = 0) -> float:
    rng = random.Random(7 + start)
    bodies = [workload_body(teams[i % len(teams)], f"wl-{i:05d}", rng)
              for i in range(start, start + n)]
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
    """Until the ClusterQueue counts every Workload as pending."""
    api = plane.api_client()
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        cq = kube.request(api, "GET", kube.kueue_path("clusterqueues", "bench"))
        if int((cq.get("status") or {}).get("pendingWorkloads") or 0) >= n:
            return time.monotonic() - t0
        time.sleep(3)
    raise SystemExit(f"Kueue did not count {n} pending Workloads in {timeout}s")


def writes_since(plane: Plane, mark: int) -> Counter[str]:
    """The controller's write requests in the audit log after the first `mark` events, by
    "verb resource" (one event per request: the ResponseComplete stage)."""
    out: Counter[str] = Counter()
    for e in plane.audit_events(AGENT)[mark:]:
        if e.get("stage") not in (None, "ResponseComplete") or e.get("verb") in (
                "get", "list", "watch"):
            continue
        ref = e.get("objectRef") or {}
        out[f"{e.get('verb')} {ref.get('resource', '?')}"] += 1
    return out


def non_lease(c: Counter[str]) -> int:
    return sum(v for k, v in c.items() if not k.endswith(" leases"))


def until_quiet(c: LiveController, now: datetime) -> int:
    """Cycles at the plan time `now` until one has nothing to write; how many it took."""
    cycles = 0
    while True:
        cycles += 1
        if not c.run_cycle(now=now).changes:
            return cycles
        time.sleep(1)  # let the watches deliver our own writes


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=5000)
    ap.add_argument("--teams", type=int, default=20)
    ap.add_argument("--hours", type=float, default=1.0, help="simulated steady state")
    ap.add_argument("--rebase", action="store_true", help="also measure one weekly rebase")
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
        print(f"Kueue counted them pending {settled:.1f}s later", flush=True)

        # The settings users get: config.yaml, plus what only a process differs in (no HTTP
        # port in-process, our Lease name); CAPACITY_SOURCE auto finds no nodes -> quotas.
        settings = load_settings(REPO / "config.yaml", env={
            "METRICS_PORT": "0", "LEASE_NAME": "wdrf-bench",
            "KUBECONFIG_PATH": str(plane.kubeconfig)})
        transport = KubeTransport.from_config(str(plane.kubeconfig), user_agent=AGENT)
        c = LiveController(settings, transport)
        c.start(serve_http=False)
        try:
            if not c.wait_synced(120):
                raise SystemExit("informers did not sync")
            kube.wait_for(lambda: c.elector is None or c.elector.is_leader() or None, 60,
                          "leadership")
            now = datetime.now(UTC)
            mark = len(plane.audit_events(AGENT))
            t0 = time.monotonic()
            cycles = until_quiet(c, now)
            first_secs = time.monotonic() - t0
            first = writes_since(plane, mark)
            print(f"first cycles: {cycles} until nothing to write, {first_secs:.1f}s; writes "
                  f"{dict(first)}; writes per pending Workload "
                  f"{non_lease(first) / args.workloads:.2f}", flush=True)

            mark = len(plane.audit_events(AGENT))
            steps = int(args.hours * 3600 / settings.loop_interval)
            t0 = time.monotonic()
            changes = 0
            for k in range(1, steps + 1):
                report = c.run_cycle(now=now + timedelta(seconds=k * settings.loop_interval))
                changes += len(report.changes)
            steady_secs = time.monotonic() - t0
            time.sleep(2)  # the audit log is written as requests complete
            steady = writes_since(plane, mark)
            ends = now + timedelta(hours=args.hours)
            print(f"steady state: {args.hours:g} h simulated ({steps} cycles of "
                  f"{settings.loop_interval:g}s, {steady_secs:.0f}s real; next rebase "
                  f"{next_rebase(now, settings.rebase_period).isoformat()}, "
                  f"{'inside' if next_rebase(now, settings.rebase_period) <= ends else 'after'}"
                  f" the window): writes other than the Lease {non_lease(steady)} (goal 0), "
                  f"of which Events {steady.get('create events', 0)}; all {dict(steady)}; "
                  f"changes planned {changes}", flush=True)

            if args.rebase:
                mark = len(plane.audit_events(AGENT))
                after = next_rebase(now, settings.rebase_period) + timedelta(seconds=1)
                t0 = time.monotonic()
                rebase_cycles = until_quiet(c, after)
                time.sleep(2)
                rebased = writes_since(plane, mark)
                print(f"rebase: {rebase_cycles} cycles, {time.monotonic() - t0:.1f}s; writes "
                      f"{dict(rebased)} (Events {rebased.get('create events', 0)}, goal 0)",
                      flush=True)
        finally:
            c.shutdown()
        print(f"peak RSS of this process (controller + bench): {peak_rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
