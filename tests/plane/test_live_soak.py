"""Soak on the real plane: two replicas under a supervisor that restarts them like a
Deployment, a steady churn of Jobs (and so Workloads) over two teams, and disruptions in turn
— SIGKILL of the leader, a Kueue restart, a kube-apiserver restart, SIGTERM of the leader.

At the end: the written priorities equal a fresh dry-run plan (the `--once --dry-run` code
path finds no priority write to make), the audit log shows one writer at a time over the whole
run, and the replicas' memory stays flat.

CI runs a short variant (WDRF_SOAK_SECONDS, default 60 s); `make soak` runs 20 minutes.
WDRF_SOAK_CHURN=0 measures the steady state instead: 20 Jobs created up front, no churn and no
disruptions. Either way the run prints the controllers' compare-and-swap conflicts (PATCHes
answered 409/422, from the audit log) per hour of run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client as k8s

from controller.live.diff import PRIORITY
from controller.live.kube import KubeTransport
from controller.live.runner import LiveController
from tests.plane import live_audit as audit
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.plane import Plane

SECONDS = float(os.environ.get("WDRF_SOAK_SECONDS", "60"))
CHURN = os.environ.get("WDRF_SOAK_CHURN", "1") != "0"

pytestmark = [pytest.mark.plane, pytest.mark.timeout(int(SECONDS) + 400)]
LEASE_NS = "kueue-system"


def rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Supervisor:
    """Keeps `replicas` controller processes running (restarts those that exit)."""

    def __init__(self, kubeconfig: Path, logs: Path, env: dict[str, str], replicas: int = 2):
        self.kubeconfig, self.logs, self.env = kubeconfig, logs, env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_of: dict[int, Path] = {}
        self.exits: list[int] = []
        self.started = 0
        self.rss: dict[int, list[int]] = {}
        for _ in range(replicas):
            self.procs.append(self._spawn())

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.started += 1
        log = self.logs / f"replica-{self.started}.log"
        p = h.spawn_controller(self.kubeconfig, log, **self.env)
        self.log_of[p.pid] = log
        return p

    def tick(self) -> None:
        for i, p in enumerate(self.procs):
            code = p.poll()
            if code is not None:
                self.exits.append(code)
                self.procs[i] = self._spawn()
            else:
                self.rss.setdefault(p.pid, []).append(rss_kib(p.pid))

    def signal_holder(self, identity: str, sig: int) -> bool:
        for p in self.procs:
            log = self.log_of[p.pid]
            if p.poll() is None and f"({identity})" in log.read_text(errors="replace"):
                p.send_signal(sig)
                return True
        return False

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def _holder(api: k8s.ApiClient, lease: str) -> str:
    try:
        return h.lease_holder(api, LEASE_NS, lease)
    except Exception:
        return ""


def test_soak_churn_and_disruptions_one_writer_and_the_plan_holds(
    api: k8s.ApiClient, kubeconfig: Path, plane: Plane, tmp_path: Path
) -> None:
    rng = random.Random(12)
    teams = [kube.create_namespace(api) for _ in range(2)]
    cq = kube.unique_name("cq-soak")
    kube.create_cluster_queue(api, cq, {"cpu": 2}, namespace_selector={"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": teams}]})
    for ns in teams:
        kube.create_local_queue(api, ns, "lq", cq)
    lease = kube.unique_name("wdrf-soak")
    env = dict(LOOP_INTERVAL="2", METRICS_PORT="0", LOG_FORMAT="json", LEASE_NAME=lease,
               LEADER_ELECTION="true", LEASE_DURATION="6s", RENEW_DEADLINE="4s",
               RETRY_PERIOD="1s", CAPACITY_SOURCE="quota", PRIORITY_MODE="boost",
               AGING_COEFFICIENT="0", RESOURCE_WEIGHTS="{cpu: 1}", EVENT_RATE_LIMIT="10m",
               HISTORY_CONFIG_MAP=kube.unique_name("wdrf-history"))
    started_at = datetime.now(UTC)
    sup = Supervisor(kubeconfig, tmp_path, env)
    jobs: list[tuple[str, str]] = []
    created = deleted = 0
    disruptions: list[tuple[float, str, float]] = []  # (at, what, seconds it took)

    def kill_leader(sig: int) -> Callable[[], None]:
        def run() -> None:
            identity = _holder(api, lease)
            if identity:
                sup.signal_holder(identity, sig)
        return run

    actions: list[tuple[str, Callable[[], None]]] = [
        ("SIGKILL leader", kill_leader(signal.SIGKILL)),
        ("SIGTERM leader", kill_leader(signal.SIGTERM)),
        ("restart Kueue", plane.restart_kueue),
        ("restart kube-apiserver", lambda: (plane.stop_apiserver(), plane.start_apiserver())),
    ]
    every = min(SECONDS / (len(actions) + 1), 90.0)  # in turn, again and again on long runs
    next_disruption = time.monotonic() + every
    t0 = time.monotonic()
    try:
        kube.wait_for(lambda: _holder(api, lease) or None, 60, "a leader")
        if not CHURN:
            for i in range(20):
                ns = teams[i % 2]
                h.create_job(api, ns, kube.unique_name("steady"), "lq",
                             annotations={"wdrf.x-k8s.io/approved": "true"} if i % 5 == 0 else {})
                created += 1
            next_disruption = float("inf")
        while time.monotonic() - t0 < SECONDS:
            sup.tick()
            if not CHURN:
                time.sleep(1.0)
                continue
            try:
                ns = rng.choice(teams)
                name = kube.unique_name("soak")
                ann = {"wdrf.x-k8s.io/approved": "true"} if rng.random() < 0.2 else {}
                h.create_job(api, ns, name, "lq", annotations=ann)
                jobs.append((ns, name))
                created += 1
                if len(jobs) > 30 or rng.random() < 0.3:
                    ns, name = jobs.pop(rng.randrange(len(jobs)))
                    kube.request(api, "DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}",
                                 {"propagationPolicy": "Background"})
                    deleted += 1
            except Exception:  # the apiserver or Kueue's webhook is down right now
                pass
            if time.monotonic() >= next_disruption and SECONDS - (time.monotonic() - t0) > 8:
                what, act = actions[len(disruptions) % len(actions)]
                began = time.monotonic()
                act()
                disruptions.append((began - t0, what, time.monotonic() - began))
                next_disruption = time.monotonic() + every
            time.sleep(1.0)
        # Let the controllers settle, then compare with a fresh dry-run plan.
        settings = h.live_settings(**{k: v for k, v in env.items()
                                      if k not in ("LOG_FORMAT", "LEADER_ELECTION")})
        dry = LiveController(settings, KubeTransport.from_config(str(kubeconfig)), dry_run=True)
        dry.discover()
        dry.build_informers()
        pending = 0

        def converged() -> bool:
            nonlocal pending
            sup.tick()
            dry.sync_once()
            report = dry.run_cycle()
            pending = len(report.plan.decisions)
            return not [c for c in report.refused() if c.what == PRIORITY]

        kube.wait_for(converged, 60, "the written priorities equal a fresh dry-run plan")
        assert pending > 0
        events = [e for e in plane.audit_events(audit.UA_PREFIX)
                  if audit.ts(e["stageTimestamp"]) >= started_at]
        writes = audit.controller_writes(events)
        epochs = audit.writer_epochs(writes)  # raises on two writers at once
        patches = [w for w in audit.controller_writes(events, ok_only=False) if w.verb == "patch"]
        conflicts = [w for w in patches if w.code in (409, 422)]
        hours = (datetime.now(UTC) - started_at).total_seconds() / 3600
        rss = {pid: s for pid, s in sup.rss.items() if len(s) >= 6}
        longest = max(rss.values(), key=len) if rss else []
        third = max(1, len(longest) // 3)
        early, late = longest[third:2 * third], longest[-third:]
        peak = max((max(s) for s in sup.rss.values() if s), default=0)
        print(f"soak {SECONDS:.0f}s: {created} Jobs created, {deleted} deleted, {pending} "
              f"pending at the end; {len(writes)} controller writes by {len(epochs)} leaders in "
              f"turn; replicas started {sup.started} (exits {sup.exits}); disruptions "
              f"{[(round(a), w, round(d, 1)) for a, w, d in disruptions]}; RSS peak "
              f"{peak / 1024:.0f} MiB, longest-lived replica {len(longest)} samples "
              f"{(sum(early) / len(early) / 1024) if early else 0:.0f} -> "
              f"{(sum(late) / len(late) / 1024) if late else 0:.0f} MiB; "
              f"{'churn' if CHURN else 'steady'}: {len(patches)} PATCHes, {len(conflicts)} "
              f"compare-and-swap conflicts ({len(conflicts) / hours:.0f}/h)")
        if CHURN:
            assert len(epochs) >= 2  # leadership changed hands at least once, never overlapped
        assert peak < 400 * 1024
        if early and late and len(longest) >= 30:
            assert sum(late) / len(late) < 1.3 * sum(early) / len(early) + 16 * 1024
        dry.shutdown()
    finally:
        sup.stop()
        with contextlib.suppress(Exception):
            h.cleanup(api, teams, [cq])
