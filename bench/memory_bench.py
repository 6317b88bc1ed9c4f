"""The live controller's memory at Kueue's large-scale shape, offline (not a test).

    nice -n 5 .venv/bin/python bench/memory_bench.py [--workloads 50000] [--cycles 3]
        [--write-budget 1000] [--breakdown] [--trace [--top 25]] [--dry-run-json]

The real `LiveController` (config.yaml's settings; no leader election, no HTTP server) over the
in-memory API server of the unit tests (`tests.support.fake.FakeApi`), holding what
`bench/scale_bench.py` creates on the real plane: its ClusterQueues in cohorts, LocalQueues in
`--namespaces` namespaces, and Workloads of its three sizes and classes. Each ClusterQueue's
first Workloads, up to the first that does not fit its nominal quota, carry Kueue's admission
status (about 12 % of them; Kueue settled at 5,167 of 50,000 on the plane); the others a
pending `QuotaReserved` condition with Kueue's message. The informers LIST and WATCH it in
their own threads, every answer is JSON-encoded and decoded as the real client's, and each
cycle's writes (WRITE_BUDGET) are applied by the fake, whose watch events then change the
cached objects as live. CLIENT_QPS is raised so that a cycle does not wait for the rate
limiter (memory is the same).

Reported after the informers' sync and after every cycle: the process's RSS and peak RSS
(VmHWM) less its RSS before the controller was built. That baseline is the interpreter, the
imports and the fake API with every object, set up so that it leaves no free memory behind;
the difference is the controller's own (the fake's copies of the written objects aside, a few
MiB). A live process has the interpreter and the kubernetes client on top (52 MiB once
imported).
* `--breakdown`: after the cycles, what the controller holds by component (sizes reached from
  each, counted once) and what a cycle builds on top (plan, diff).
* `--trace`: tracemalloc from the controller's start (the fake's objects, made before, are not
  traced): bytes traced after each stage and peak during it; `--top N` the N biggest sites of
  what is held at the end, by the controller's innermost line (a site with no controller
  line, such as copy.py, is the fake's, deeper than `--frames`). Slow: 4 min at 2,000.
* `--write-budget N`: WRITE_BUDGET (config.yaml's 1,000 by default); a larger one reaches in a
  few cycles the state a cold start ends in, every Workload written (its terms, base and
  applied annotations cached, parsed and planned).
* `--dry-run-json`: instead of cycles, what `python -m controller --dry-run --once -o json`
  does (LIST, one cycle with every write refused, the plan rendered as JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import random
import sys
import time
import tracemalloc
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scale_bench import (  # noqa: E402
    cluster_queue_body,
    cluster_queue_name,
    local_queue_of,
    workload_bodies,
)

from controller.config import load_settings  # noqa: E402
from controller.live.api import CLUSTER_QUEUES, JSON, LOCAL_QUEUES, WORKLOADS  # noqa: E402
from controller.live.main import print_plan  # noqa: E402
from controller.live.runner import LiveController  # noqa: E402
from tests.support.fake import FakeApi, _split  # noqa: E402
from tests.support.fake_cluster import KUEUE_GROUP_DOC  # noqa: E402

FLAVOR = "default"
CREATED = "2026-11-28T02:00:00Z"


class BenchApi(FakeApi):
    """FakeApi whose LIST pages cost their own size (the tests' version copies every object per
    page) and whose watch history can be dropped once every watch has read it."""

    def _list(self, root: str, plural: str, ns: str | None, query: Mapping[str, str]) -> JSON:
        if query.get("labelSelector") or ns is not None:
            return super()._list(root, plural, ns, query)
        keys = sorted((k for k in self._objects if k[0] == root and k[1] == plural), key=str)
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(keys) or 1
        more = start + limit < len(keys)
        return {"kind": "List",
                "metadata": {"resourceVersion": str(self._last_rv),
                             **({"continue": str(start + limit)} if more else {})},
                "items": [self._objects[k] for k in keys[start: start + limit]]}

    def add(self, path: str, obj: JSON) -> None:
        """Store `obj` itself (no copy, no watch history): set-up that leaves no free memory
        behind for the controller to reuse unseen in RSS."""
        root, ns, plural, _ = _split(path)
        meta = obj["metadata"]
        if ns:
            meta["namespace"] = ns
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta.setdefault("creationTimestamp", CREATED)
        rv = next(self._rv)
        self._last_rv = rv
        meta["resourceVersion"] = str(rv)
        self._objects[(root, plural, meta.get("namespace"), meta["name"])] = obj

    def drop_history(self) -> None:
        with self._lock:
            self._log.clear()

    @property
    def last_rv(self) -> int:
        return self._last_rv


class JsonTransport:
    """Every answer encoded and decoded as JSON, like the real client's: the controller gets
    objects of its own, as from the wire."""

    def __init__(self, api: BenchApi) -> None:
        self.api = api

    def request(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                body: Any = None, content_type: str | None = None,
                timeout: float | None = None) -> Any:
        data = json.dumps(self.api.request(method, path, query=query, body=body,
                                           content_type=content_type, timeout=timeout))
        return json.loads(data)

    def stream(self, path: str, *, query: Mapping[str, str] | None = None,
               timeout: float | None = None) -> Iterator[JSON]:
        for event in self.api.stream(path, query=query, timeout=timeout):
            yield json.loads(json.dumps(event))

    def close(self) -> None:
        self.api.close()


def pending_status(cpu: int, cq: str) -> JSON:
    return {"conditions": [{
        "type": "QuotaReserved", "status": "False", "reason": "Pending",
        "lastTransitionTime": CREATED, "observedGeneration": 1,
        "message": f"couldn't assign flavors to pod set main: insufficient unused quota for "
                   f"cpu in flavor {FLAVOR}, {cpu} more needed"}],
        "resourceRequests": [{"name": "main", "resources": {"cpu": str(cpu)}}]}


def admitted_status(cpu: int, cq: str) -> JSON:
    def condition(kind: str, reason: str, message: str) -> JSON:
        return {"type": kind, "status": "True", "reason": reason, "message": message,
                "lastTransitionTime": CREATED, "observedGeneration": 1}

    return {
        "admission": {"clusterQueue": cq, "podSetAssignments": [{
            "name": "main", "count": 1, "flavors": {"cpu": FLAVOR},
            "resourceUsage": {"cpu": str(cpu)}}]},
        "conditions": [condition("QuotaReserved", "QuotaReserved",
                                 f"Quota reserved in ClusterQueue {cq}"),
                       condition("Admitted", "Admitted",
                                 "The workload is admitted")],
        "resourceRequests": [{"name": "main", "resources": {"cpu": str(cpu)}}]}


def populate(api: BenchApi, workloads: int, queues: int, cohorts: int,
             namespaces: list[str]) -> tuple[int, int]:
    """scale_bench's objects, with Kueue's status; -> (pending, admitted)."""
    api.static["/apis/kueue.x-k8s.io"] = KUEUE_GROUP_DOC
    quota = max(1, round(20 * workloads / 50_000))
    lq_to_cq: dict[tuple[str, str], str] = {}
    for i in range(queues):
        api.add(CLUSTER_QUEUES.item(cluster_queue_name(i)),
                       cluster_queue_body(i, queues, cohorts, quota))
        ns, lq = local_queue_of(i, namespaces)
        lq_to_cq[(ns, lq)] = cluster_queue_name(i)
        api.add(LOCAL_QUEUES.item(lq, ns), {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": lq, "namespace": ns},
            "spec": {"clusterQueue": cluster_queue_name(i)}})
    used: dict[str, int] = {}
    full: set[str] = set()  # queues where one did not fit: Kueue admits in order (no borrowing)
    admitted = 0
    rng = random.Random(11)
    for body in workload_bodies(workloads, queues, namespaces):
        meta, spec = body["metadata"], body["spec"]
        cq = lq_to_cq[(meta["namespace"], spec["queueName"])]
        cpu = int(spec["podSets"][0]["template"]["spec"]["containers"][0]["resources"][
            "requests"]["cpu"])
        meta.update(generation=1, labels={"kueue.x-k8s.io/queue-name": spec["queueName"]},
                    creationTimestamp=f"2026-11-28T0{rng.randrange(10)}:{rng.randrange(60):02d}"
                                      f":{rng.randrange(60):02d}Z",
                    uid=f"{rng.getrandbits(128):032x}")
        if cq not in full and used.get(cq, 0) + cpu <= quota:
            used[cq] = used.get(cq, 0) + cpu
            body["status"] = admitted_status(cpu, cq)
            meta["finalizers"] = ["kueue.x-k8s.io/resource-in-use"]
            admitted += 1
        else:
            full.add(cq)
            body["status"] = pending_status(cpu, cq)
        api.add(WORKLOADS.item(meta["name"], meta["namespace"]), body)
    api.drop_history()
    return workloads - admitted, admitted


def rss_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    fields = dict(line.split(":", 1) for line in
                  Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def release_free_memory() -> None:
    """Give the C heap's free pages back (glibc), so that the RSS baseline holds no free space
    the controller would then reuse unseen."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux), so that set-up's peaks (the baseline's
    own, `fake_size`'s walk) do not count as the controller's."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


class Meter:
    def __init__(self, trace: bool) -> None:
        self.trace = trace
        gc.collect()
        release_free_memory()
        reset_peak()
        self.base_rss = rss_kib()[0]
        self.base_traced = tracemalloc.get_traced_memory()[0] if trace else 0

    def start_stage(self) -> None:
        # No collection here: between cycles the controller's own `Collector` runs, as live.
        if self.trace:
            tracemalloc.reset_peak()

    def report(self, stage: str, extra: str = "") -> None:
        rss, hwm = rss_kib()
        line = (f"{stage:<24} RSS {(rss - self.base_rss) / 1024:5.0f} MiB, peak "
                f"{(hwm - self.base_rss) / 1024:5.0f} MiB")
        if self.trace:
            current, peak = tracemalloc.get_traced_memory()
            line += (f"; traced {(current - self.base_traced) / 2**20:5.0f} MiB, peak "
                     f"{(peak - self.base_traced) / 2**20:5.0f} MiB")
        print(line + (f"; {extra}" if extra else ""), flush=True)


def top_sites(n: int) -> None:
    """The n biggest allocation sites of what is held now, by the controller's innermost line
    on the stack (the fake API's own objects and copies left out)."""
    gc.collect()
    snap = tracemalloc.take_snapshot()
    prefix = str(REPO) + "/"
    fake = str(REPO / "tests" / "support" / "fake.py")
    sites: dict[str, list[int]] = {}
    for trace in snap.traces:
        frames = list(trace.traceback)  # oldest first
        if any(f.filename == fake for f in frames):
            continue
        mine = [f for f in frames if f.filename.startswith(prefix + "controller/")]
        frame = mine[-1] if mine else frames[-1]
        site = f"{frame.filename.removeprefix(prefix)}:{frame.lineno}"
        inner = frames[-1]
        if inner is not frame:
            site += f" ({inner.filename.rsplit('/', 1)[-1]}:{inner.lineno})"
        acc = sites.setdefault(site, [0, 0])
        acc[0] += trace.size
        acc[1] += 1
    print(f"\nbiggest sites held now, by the controller's innermost line (top {n}):")
    for site, (size, count) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:n]:
        print(f"  {size / 2**20:7.1f} MiB {count:9d} blocks  {site}")


def deep_size(root: object, seen: dict[int, object]) -> int:
    """Bytes of `root` and of everything it reaches that `seen` does not hold yet (then
    added, and kept alive so that no id is reused): what one component holds beyond the
    components measured before it. The API server's side (the fake, the transport) is not
    the controller's and is not entered."""
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, FakeApi, JsonTransport)):
            continue
        seen[id(obj)] = obj
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, (str, bytes, int, float, bool)) or obj is None:
            continue
        else:
            if hasattr(obj, "__dict__"):
                stack.append(vars(obj))
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if hasattr(obj, slot):
                        stack.append(getattr(obj, slot))
            if isinstance(obj, Mapping) and not isinstance(obj, dict):
                stack.extend(obj.items())
    return total


def fake_size(api: BenchApi) -> float:
    """MiB the fake API server's objects hold (its side: in the baseline at the start)."""
    with api._lock:
        objects = list(api._objects.values())
    return deep_size(objects, {}) / 2**20


def breakdown(c: LiveController, api: BenchApi, fake_at_start: float) -> None:
    """What the controller holds between cycles, by component (each counted beyond the ones
    before it), and what one cycle builds on top: the plan and the diff's changes."""
    print(f"  {fake_size(api):7.1f} MiB  the fake API server's objects, not the controller's "
          f"({fake_at_start:.1f} MiB at the start, in the baseline)", flush=True)
    seen: dict[int, object] = {}
    parts: list[tuple[str, object]] = [
        ("informer caches", {n: i._items for n, i in c.informers.items()}),
        ("parse caches (WorkloadInfo, Workload)", c.builder),
        ("incremental planner (parts, memos)", c.planner),
        ("cycle writer, events, metrics", (c.cycle_writer, c.events, c.metrics)),
    ]
    for name, obj in parts:
        print(f"  {deep_size(obj, seen) / 2**20:7.1f} MiB  {name}", flush=True)
    plan, built = c.plan(datetime.now(UTC))
    print(f"  {deep_size((plan, built), seen) / 2**20:7.1f} MiB  a plan and its snapshot, "
          "beyond the above", flush=True)
    diff = c.diff(plan, built)
    print(f"  {deep_size(diff, seen) / 2**20:7.1f} MiB  the diff ({len(diff.changes)} "
          "changes), beyond the above", flush=True)


def wait_delivered(c: LiveController, api: BenchApi, timeout: float = 120) -> None:
    """Until every watch has delivered the fake's last write; then forget the history."""
    deadline = time.monotonic() + timeout
    target = api.last_rv
    while time.monotonic() < deadline:
        inf = c.informers["workloads"]
        if inf.resource_version and int(inf.resource_version) >= target:
            break
        time.sleep(0.2)
    api.drop_history()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=50_000)
    ap.add_argument("--cluster-queues", type=int, default=1000)
    ap.add_argument("--cohorts", type=int, default=10)
    ap.add_argument("--namespaces", type=int, default=500)
    ap.add_argument("--cycles", type=int, default=4)
    ap.add_argument("--write-budget", type=int, default=0,
                    help="WRITE_BUDGET (default: config.yaml's)")
    ap.add_argument("--trace", action="store_true", help="tracemalloc (slower; see above)")
    ap.add_argument("--top", type=int, default=0, help="with --trace: N biggest sites")
    ap.add_argument("--frames", type=int, default=8, help="with --trace: traceback depth")
    ap.add_argument("--breakdown", action="store_true",
                    help="after the cycles: what the controller holds, by component")
    ap.add_argument("--dry-run-json", action="store_true",
                    help="--dry-run --once -o json instead of cycles")
    a = ap.parse_args()
    namespaces = [f"ns-{i:03d}" for i in range(a.namespaces)]
    api = BenchApi(bookmark_every=1.0)
    t0 = time.process_time()
    pending, admitted = populate(api, a.workloads, a.cluster_queues, a.cohorts, namespaces)
    print(f"{a.workloads} Workloads ({pending} pending, {admitted} admitted), "
          f"{a.cluster_queues} ClusterQueues in {a.cohorts} cohorts, {a.namespaces} "
          f"namespaces; set up in {time.process_time() - t0:.0f}s CPU; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    settings = load_settings(REPO / "config.yaml", env={
        "METRICS_PORT": "0", "LEADER_ELECTION": "false", "CLIENT_QPS": "100000",
        "CLIENT_BURST": "100000",
        **({"WRITE_BUDGET": str(a.write_budget)} if a.write_budget else {})})
    fake_at_start = fake_size(api) if a.breakdown else 0.0
    gc.collect()
    if a.trace:  # from here: what exists already (the fake's objects) is not traced
        tracemalloc.start(a.frames)
    meter = Meter(a.trace)
    transport = JsonTransport(api)
    c = LiveController(settings, transport, dry_run=a.dry_run_json, identity="bench")
    t0 = time.process_time()
    meter.start_stage()
    if a.dry_run_json:
        c.discover()
        c.build_informers()
        c.sync_once()
        meter.report("listed", f"{time.process_time() - t0:.0f}s CPU")
        meter.start_stage()
        report = c.run_cycle()
        meter.report("cycle (writes refused)",
                     f"{len(report.changes)} changes; {time.process_time() - t0:.0f}s CPU")
        text = print_plan(report, "json", settings)
        del report
        meter.report("rendered -o json", f"{len(text) / 2**20:.0f} MiB of JSON; "
                     f"{time.process_time() - t0:.0f}s CPU")
        c.shutdown()
    else:
        c.start(serve_http=False)
        if not c.wait_synced(600):
            raise SystemExit("informers did not sync")
        meter.report("synced", f"{time.process_time() - t0:.0f}s CPU")
        try:
            for k in range(1, a.cycles + 1):
                meter.start_stage()
                t1 = time.process_time()
                report = c.run_cycle()
                counts = report.applied.counts() if report.applied else {}
                changes = len(report.changes)
                del report
                wait_delivered(c, api)
                c.collector.after_cycle()
                meter.report(f"cycle {k}", f"{changes} changes {counts}; "
                             f"{time.process_time() - t1:.0f}s CPU")
        finally:
            c.shutdown()
        if a.breakdown:
            breakdown(c, api, fake_at_start)
    if a.trace and a.top:
        top_sites(a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
