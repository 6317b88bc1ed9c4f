"""Benchmark the live controller at Kueue's large-scale shape on the real plane (not a test).

    .venv/bin/python bench/scale_bench.py [--workloads 5000] [--cluster-queues 1000]
        [--cohorts 10] [--namespaces 500] [--quota N] [--timeout 1800] [--quiet 120] [--keep]

The shape of Kueue's own large-scale performance configuration: ClusterQueues in cohorts
(nominal quota 20 CPUs at 50,000 Workloads, scaled down with the Workloads per queue so that
about as large a share waits; borrowing limit 5x that; `reclaimWithinCohort: Any`,
`withinClusterQueue: LowerPriority`), Workloads of three sizes (1, 5 and 20 CPUs;
priorities 50, 100 and 200 as Kueue's small, medium and large classes, in the proportions
20:7:3), spread over every ClusterQueue; the queues' LocalQueues in `--namespaces`
namespaces (one team each, so a team uses several queues in different cohorts). 5 % of the
Workloads are urgent and 15 % approved. The Workloads are created first and Kueue admits
what fits; then the controller starts, as its own process (`python -m controller` at
config.yaml's settings: CLIENT_QPS 50, WRITE_BUDGET 1000), cold.

Reported:
* time from the controller's start until every ClusterQueue's first 10 pending positions are
  in the plan's order (`wdrf_cluster_queues_head_unconverged` reaches 0) and until every
  queue's whole order is (`wdrf_cluster_queue_order_converged` all 1), read from its /metrics
  every 2 s; at the end the same checked from the apiserver's objects by this process;
* the controller's writes and Events, from the apiserver's audit log (user agent
  "wdrf-controller"), in all and during `--quiet` seconds after convergence; Events per object
  (the Event objects) and the most Events created in any one second;
* the controller process's peak RSS; the machine's load average.

What is left out, so that the sizes fit 2 cores shared with the plane: Workload objects are
created directly, without Jobs, pods or kwok (a Workload's owner Job only adds the Job's
annotations; nothing here needs a pod), and no Workload finishes during the run.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.config import load_settings  # noqa: E402
from controller.domain import APPROVED_ANNOTATION, URGENT_ANNOTATION  # noqa: E402
from controller.parse import build_snapshot  # noqa: E402
from controller.plan import HEAD_POSITIONS, current_positions, positions_right  # noqa: E402
from controller.policy import compute_plan  # noqa: E402
from tests.support import kube  # noqa: E402
from tests.support.plane import Plane  # noqa: E402

AGENT = "wdrf-controller"
SIZES = (("small", 50, 1, 20), ("medium", 100, 5, 7), ("large", 200, 20, 3))


def cluster_queue_name(i: int) -> str:
    return f"cq-{i:04d}"


def cluster_queue_body(i: int, queues: int, cohorts: int, quota: int) -> dict[str, Any]:
    """The i-th ClusterQueue of `queues` in `cohorts` cohorts."""
    per_cohort = max(1, queues // cohorts)
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": cluster_queue_name(i)},
        "spec": {
            "namespaceSelector": {}, "cohortName": f"cohort-{i // per_cohort:02d}",
            "preemption": {"reclaimWithinCohort": "Any",
                           "withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{
                "name": "default", "resources": [
                    {"name": "cpu", "nominalQuota": str(quota),
                     "borrowingLimit": str(5 * quota)}]}]}],
        }}


def local_queue_of(i: int, namespaces: list[str]) -> tuple[str, str]:
    """(namespace, name) of the i-th ClusterQueue's LocalQueue."""
    return namespaces[i % len(namespaces)], f"lq-{i // len(namespaces)}"


def setup_queues(api: Any, queues: int, cohorts: int, namespaces: list[str],
                 quota: int) -> list[str]:
    kube.create_resource_flavor(api, "default")
    names = [cluster_queue_name(i) for i in range(queues)]

    def make(i: int) -> None:
        kube.request(api, "POST", kube.kueue_path("clusterqueues"),
                     cluster_queue_body(i, queues, cohorts, quota))
        ns, lq = local_queue_of(i, namespaces)
        kube.create_local_queue(api, ns, lq, names[i])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(queues)))
    return names


def workload_bodies(n: int, queues: int, namespaces: list[str]) -> list[dict[str, Any]]:
    rng = random.Random(7)
    weights = [s[3] for s in SIZES]
    out = []
    for i in range(n):
        q = i % queues
        ns, lq = local_queue_of(q, namespaces)
        _, value, cpu, _ = rng.choices(SIZES, weights)[0]
        roll = rng.random()
        ann = {URGENT_ANNOTATION: "true"} if roll < 0.05 else (
            {APPROVED_ANNOTATION: "true"} if roll < 0.20 else {})
        out.append({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"wl-{i:06d}", "namespace": ns, "annotations": ann},
            "spec": {"queueName": lq, "priority": value, "podSets": [{
                         "name": "main", "count": 1, "template": {"spec": {
                             "restartPolicy": "Never", "containers": [{
                                 "name": "c", "image": "busybox", "resources": {
                                     "requests": {"cpu": str(cpu)}}}]}}}]},
        })
    return out


def create_all(plane: Plane, bodies: list[dict[str, Any]]) -> float:
    local = threading.local()
    t0 = time.monotonic()

    def create(body: dict[str, Any]) -> None:
        if not hasattr(local, "api"):
            local.api = plane.api_client()
        ns = body["metadata"]["namespace"]
        kube.request(local.api, "POST", kube.kueue_path("workloads", namespace=ns), body)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, bodies))
    return time.monotonic() - t0


def kueue_counts(api: Any) -> tuple[int, int]:
    """(pending, admitted) Workloads over all ClusterQueues, as Kueue counts them."""
    items = kube.request(api, "GET", kube.kueue_path("clusterqueues"))["items"]
    st = [i.get("status") or {} for i in items]
    return (sum(int(s.get("pendingWorkloads") or 0) for s in st),
            sum(int(s.get("admittedWorkloads") or 0) for s in st))


def wait_kueue_settled(api: Any, n: int, timeout: float) -> tuple[float, int, int]:
    """Until Kueue counts every Workload as pending or admitted, and the counts hold still."""
    t0 = time.monotonic()
    last: tuple[int, int] | None = None
    while time.monotonic() - t0 < timeout:
        counts = kueue_counts(api)
        if sum(counts) >= n and counts == last:
            return time.monotonic() - t0, *counts
        last = counts
        time.sleep(5)
    raise SystemExit(f"Kueue did not settle within {timeout}s (last {last})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


METRIC = re.compile(r"^(\w+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$")


def scrape(port: int) -> dict[str, list[tuple[str, float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[str, list[tuple[str, float]]] = {}
    for line in text.decode().splitlines():
        m = METRIC.match(line)
        if m:
            out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def total(metrics: dict[str, list[tuple[str, float]]], name: str, where: str = "") -> float:
    return sum(v for labels, v in metrics.get(name, []) if where in labels)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def heads_from_objects(api: Any, now: datetime) -> tuple[int, int, int]:
    """(queues whose first 10 are right, queues whose whole order is right, queues with
    pending Workloads), by the apiserver's objects and a plan computed here."""
    docs: list[object] = []
    for plural, kind in (("workloads", "Workload"), ("clusterqueues", "ClusterQueue"),
                         ("localqueues", "LocalQueue")):
        for item in kube.request(api, "GET", kube.kueue_path(plural))["items"]:
            docs.append({**item, "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind})
    plan = compute_plan(build_snapshot(docs), load_settings(REPO / "config.yaml", env={}), now)
    pending: dict[str, list[Any]] = {}
    for d in plan.decisions:
        if not d.admitted:
            pending.setdefault(d.cluster_queue or "-", []).append(d)
    current = current_positions(d for ds in pending.values() for d in ds)
    heads = full = 0
    for ds in pending.values():
        right = positions_right(ds, current)
        heads += right >= min(HEAD_POSITIONS, len(ds))
        full += right == len(ds)
    return heads, full, len(pending)


def audit_summary(plane: Plane, since: str = "") -> tuple[Counter[str], Counter[int]]:
    """The controller's writes by "verb resource" (after the RFC 3339 instant `since`), and
    Events created per second."""
    writes: Counter[str] = Counter()
    per_second: Counter[int] = Counter()
    for e in plane.audit_events(AGENT):
        if e.get("stage") != "ResponseComplete" or e.get("verb") in ("get", "list", "watch"):
            continue
        at = str(e.get("requestReceivedTimestamp", ""))
        if at < since:
            continue
        ref = e.get("objectRef") or {}
        writes[f"{e.get('verb')} {ref.get('resource', '?')}"] += 1
        if ref.get("resource") == "events" and e.get("verb") == "create":
            per_second[int(datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp())] += 1
    return writes, per_second


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=5000)
    ap.add_argument("--cluster-queues", type=int, default=1000)
    ap.add_argument("--cohorts", type=int, default=10)
    ap.add_argument("--namespaces", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=1800, help="give up converging after")
    ap.add_argument("--quiet", type=float, default=120, help="seconds watched after converging")
    ap.add_argument("--quota", type=int, default=0,
                    help="nominal CPUs per ClusterQueue (default: Kueue's 20 scaled to the "
                         "Workloads per queue, so about as much waits as at 50,000)")
    ap.add_argument("--keep", action="store_true", help="keep the plane's directory")
    a = ap.parse_args()
    quota = a.quota or max(1, round(20 * a.workloads / 50_000))
    # A plain `kill` (or ^C of a background run) still stops the plane and the controller.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"load average at start {os.getloadavg()} on {os.cpu_count()} cores", flush=True)

    with Plane.temporary(keep=a.keep) as plane:
        api = plane.api_client()
        namespaces = [f"ns-{i:03d}" for i in range(a.namespaces)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda ns: kube.create_namespace(plane.api_client(), ns), namespaces))
        setup_queues(api, a.cluster_queues, a.cohorts, namespaces, quota)
        bodies = workload_bodies(a.workloads, a.cluster_queues, namespaces)
        created = create_all(plane, bodies)
        del bodies
        print(f"created {a.workloads} Workloads over {a.cluster_queues} ClusterQueues in "
              f"{a.cohorts} cohorts (nominal {quota} CPUs each, borrowing {5 * quota}), "
              f"{a.namespaces} namespaces, in {created:.0f}s", flush=True)
        settled, pending, admitted = wait_kueue_settled(api, a.workloads, a.timeout)
        print(f"Kueue settled {settled:.0f}s later: {pending} pending, {admitted} admitted",
              flush=True)

        port = free_port()
        env = {**os.environ, "KUBECONFIG_PATH": str(plane.kubeconfig),
               "METRICS_PORT": str(port), "LOG_FORMAT": "json"}
        log_path = plane.workdir / "controller.log"
        started_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        t0 = time.monotonic()
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "controller", "--config", str(REPO / "config.yaml")],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        head_at = full_at = None
        try:
            while time.monotonic() - t0 < a.timeout:
                time.sleep(2)
                if proc.poll() is not None:
                    raise SystemExit(f"the controller exited ({proc.returncode}); {log_path}")
                try:
                    m = scrape(port)
                except OSError:
                    continue
                if total(m, "wdrf_cycles_total", 'outcome="leader"') < 1:
                    continue
                queues = m.get("wdrf_cluster_queue_order_converged", [])
                if head_at is None and total(m, "wdrf_cluster_queues_head_unconverged") == 0:
                    head_at = time.monotonic() - t0
                    print(f"every ClusterQueue's first {HEAD_POSITIONS} positions right "
                          f"{head_at:.0f}s after the controller started", flush=True)
                if queues and all(v == 1 for _, v in queues):
                    full_at = time.monotonic() - t0
                    print(f"every ClusterQueue's whole order right {full_at:.0f}s after the "
                          f"start ({len(queues)} queues with pending Workloads)", flush=True)
                    break
            else:
                print(f"not converged within {a.timeout:.0f}s", flush=True)
            converged_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            time.sleep(a.quiet)
            rss = rss_mib(proc.pid)
            m = scrape(port)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
        heads, full, with_pending = heads_from_objects(api, datetime.now(UTC))
        print(f"by the apiserver's objects: first {HEAD_POSITIONS} right in {heads} of "
              f"{with_pending} ClusterQueues with pending Workloads, whole order in {full}",
              flush=True)
        time.sleep(2)  # the audit log is written as requests complete
        writes, per_second = audit_summary(plane, started_at)
        quiet, _ = audit_summary(plane, converged_at)
        events = [e for e in kube.request(api, "GET", "/api/v1/events")["items"]
                  if (e.get("source") or {}).get("component") == AGENT]
        per_object = Counter(e["involvedObject"].get("uid") for e in events)
        print(f"controller writes (audit log): {dict(writes)}; per Workload "
              f"{sum(v for k, v in writes.items() if 'workloads' in k) / a.workloads:.2f}")
        print(f"Events: {len(events)} ({Counter(e['reason'] for e in events)}); most on one "
              f"object {max(per_object.values(), default=0)}; most created in one second "
              f"{max(per_second.values(), default=0)}")
        print(f"after convergence, {a.quiet:.0f}s: writes other than the Lease "
              f"{sum(v for k, v in quiet.items() if not k.endswith(' leases'))} ({dict(quiet)})")
        print(f"controller: peak RSS {rss:.0f} MiB; cycles {total(m, 'wdrf_cycles_total'):.0f}; "
              f"patches {dict((lab, v) for lab, v in m.get('wdrf_patches_total', []))}")
        print(f"plane peak RSS (MiB): { {k: v // 1024 for k, v in plane.peak_rss_kb().items()} }")
    print(f"load average at the end {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
