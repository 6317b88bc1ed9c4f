"""Issue 12 on the real plane, with the kube-apiserver's audit log as the witness: exactly one
writer (paused leader, slow apiserver for the leader only), SIGTERM order (history saved, then
the Lease released, nothing after), a stale cache pauses writes and readiness with a bounded
re-watch rate, and a Workload recreated under the same name gets no stale patch.

Replicas are `python -m controller` processes with short Lease timings (LEASE_DURATION 6 s,
RENEW_DEADLINE 4 s, RETRY_PERIOD 1 s); each names itself in its User-Agent, so the audit log
tells them apart, and writes under that name as its field manager, so the managedFields of
the Workloads it changed tell them apart as well.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from controller.domain import KUEUE_PRIORITY_BOOST_ANNOTATION
from controller.live.api import WORKLOADS
from controller.live.apply import NOOP, Applier
from controller.live.diff import diff_priority
from controller.live.metrics import Metrics
from controller.plan import PriorityMode
from tests.plane import live_audit as audit
from tests.plane import live_helpers as h
from tests.plane import live_history as history
from tests.support import kube
from tests.support.plane import Plane
from tests.support.procs import free_port
from tests.support.proxy import Proxy

pytestmark = pytest.mark.plane

LEASE_NS = "kueue-system"


def replica_env(lease: str, **extra: str) -> dict[str, str]:
    env = dict(LOOP_INTERVAL="1", METRICS_PORT="0", LOG_FORMAT="json", LEASE_NAME=lease,
               LEADER_ELECTION="true", LEASE_DURATION="6s", RENEW_DEADLINE="4s",
               RETRY_PERIOD="1s", CAPACITY_SOURCE="quota", PRIORITY_MODE="boost",
               AGING_COEFFICIENT="0", RESOURCE_WEIGHTS="{cpu: 1}", EVENT_RATE_LIMIT="10m",
               HISTORY_CONFIG_MAP=kube.unique_name("wdrf-history"))
    env.update(extra)
    return env


def boosted(api: k8s.ApiClient, ns: str, name: str) -> bool:
    ann = kube.get_workload(api, ns, name)["metadata"].get("annotations") or {}
    return KUEUE_PRIORITY_BOOST_ANNOTATION in ann


def new_job(api: k8s.ApiClient, ns: str, name: str) -> str:
    h.create_job(api, ns, name, "lq")
    return h.job_workload(api, ns, name)


def holder(api: k8s.ApiClient, lease: str, not_in: tuple[str, ...] = ("",),
           timeout: float = 60) -> str:
    return str(kube.wait_for(
        lambda: (lambda x: x if x not in not_in else None)(h.lease_holder(api, LEASE_NS, lease)),
        timeout, f"a holder of Lease {lease} other than {not_in}"))


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        with_signal(p, signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def with_signal(p: subprocess.Popen[bytes], sig: int) -> None:
    if p.poll() is None:
        os.kill(p.pid, sig)


def which(logs: dict[str, Path], identity: str) -> str:
    kube.wait_for(lambda: any(f"({identity})" in p.read_text() for p in logs.values()), 30,
                  "the leader's log line")
    return next(r for r, p in logs.items() if f"({identity})" in p.read_text())


PAUSES = int(os.environ.get("WDRF_PAUSES", "1"))
CONFLICT = frozenset({409, 422})  # a compare-and-swap refused
BURST = 8  # Jobs created at once: the leader's write phase, paused after a random write of it


@dataclass(frozen=True)
class Round:
    handover: float  # seconds from SIGSTOP to the new holder on the Lease
    writes: int  # Workload writes of the two replicas that the apiserver accepted (2xx)
    conflicts: int  # ... and that it refused as a compare-and-swap (409, 422)
    changes: int  # changes of Workloads the objects' history gives to the two replicas
    inferred: int  # ... of them same-second writes, given to the latest-stamped replica
    burst_old: int  # Workloads of the burst the paused leader had boosted
    late_requests: list[audit.Write]  # the old leader's, completed after the new one's first
    late_changes: list[history.Change]  # the old leader's, after the new one's first (by rv)


@pytest.mark.timeout(300 + 60 * PAUSES)
def test_paused_leader_never_writes_after_the_new_leader(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str, tmp_path: Path, plane: Plane
) -> None:
    """The leader is paused (SIGSTOP) at a random point of its write phase (right after its
    k-th write of a burst, k random, as the Workloads' watch sees it), WDRF_PAUSES times
    (default 1; `make test-paused-leader` pauses 50 times beside a CPU hog). Two witnesses
    the controller cannot write: the audit log (no write of the paused leader that changed an
    object, 2xx, completed after the new leader's first write; requests of it that arrived
    late were refused, every write being a compare-and-swap against the state it read), and
    the Workloads' own history (a watch in resourceVersion order, each change given to a
    replica by its field manager in managedFields: no change of the old leader after the new
    leader's first change)."""
    cq, _ = kube.create_queues(api, namespace, {"cpu": 0})
    rng = random.Random(20)
    rounds: list[Round] = []
    try:
        for i in range(PAUSES):
            r = _one_pause(api, kubeconfig, namespace, tmp_path / f"r{i}", plane, i,
                           rng.randint(1, BURST - 1))
            changed = [w for w in r.late_requests if 200 <= w.code < 300]
            assert changed == [], (
                f"round {i}: writes of the paused leader that changed objects after the "
                f"new leader's first write (audit log): {changed}")
            assert r.late_changes == [], (
                f"round {i}: changes of the paused leader after the new leader's first "
                f"change (Workloads' history, resourceVersion order): {r.late_changes}")
            rounds.append(r)
            print(f"pause {i}: hand-over {r.handover:.1f}s, {r.writes} writes, {r.conflicts} "
                  f"conflicts, {r.changes} changes in the history ({r.inferred} same-second), "
                  f"burst boosted {r.burst_old} by the old leader, {BURST - r.burst_old} by the "
                  f"new, {len(r.late_requests)} late request(s) refused", flush=True)
        handovers = [r.handover for r in rounds]
        print(f"{PAUSES} pauses: hand-over after SIGSTOP {min(handovers):.1f}-"
              f"{max(handovers):.1f}s; {sum(0 < r.burst_old < BURST for r in rounds)} in the "
              f"middle of the write phase (the old leader had boosted "
              f"{min(r.burst_old for r in rounds)}-{max(r.burst_old for r in rounds)} of the "
              f"{BURST} Workloads of the burst); {sum(r.writes for r in rounds)} Workload writes "
              f"accepted, {sum(r.conflicts for r in rounds)} refused as conflicts; "
              f"{sum(r.changes for r in rounds)} changes in the Workloads' history given to a "
              f"replica ({sum(r.inferred for r in rounds)} same-second); requests of a paused "
              f"leader that arrived after the new leader's first write: "
              f"{sum(len(r.late_requests) for r in rounds)}, all refused; changes of a paused "
              f"leader after the new leader's first: 0 (audit log), 0 (history)")
    finally:
        h.cleanup(api, [namespace], [cq])


def _one_pause(api: k8s.ApiClient, kubeconfig: Path, namespace: str, tmp: Path, plane: Plane,
               round_: int, k: int) -> Round:
    tmp.mkdir(parents=True, exist_ok=True)
    lease = kube.unique_name("wdrf-pause")
    # 5 requests/s (the Lease is not limited): a write phase of seconds, as a large cluster's,
    # so the pause lands inside it, with writes waiting behind the limiter.
    env = replica_env(lease, CLIENT_QPS="5", CLIENT_BURST="1")
    logs = {r: tmp / f"replica-{r}.log" for r in ("a", "b")}
    watch = history.History(api, namespace).start()  # before any replica writes
    procs = {r: h.spawn_controller(kubeconfig, logs[r], **env) for r in ("a", "b")}
    try:
        first = holder(api, lease)
        leader = which(logs, first)
        follower = "b" if leader == "a" else "a"
        wl = new_job(api, namespace, f"first-{round_}")
        kube.wait_for(lambda: boosted(api, namespace, wl), 30, "the leader boosts")
        # A burst of arrivals; the leader is paused right after its k-th write of it.
        for i in range(BURST):
            h.create_job(api, namespace, f"burst-{round_}-{i}", "lq")
        prefix, old = f"job-burst-{round_}-", audit.UA_PREFIX + first
        watch.wait_for(lambda seen: sum(c.name.startswith(prefix) and old in c.writers
                                        for c in seen) >= k, 60, f"the leader's write {k}")
        with_signal(procs[leader], signal.SIGSTOP)
        paused_at = time.monotonic()
        second = holder(api, lease, ("", first), timeout=30)
        handover = time.monotonic() - paused_at
        # The Lease shows the new holder before its log line is flushed (seen under load).
        kube.wait_for(lambda: f"({second})" in logs[follower].read_text(), 15,
                      "the new leader's log line")
        wl2 = new_job(api, namespace, f"second-{round_}")
        kube.wait_for(lambda: boosted(api, namespace, wl2), 30, "the new leader boosts")
        time.sleep(2)  # the new leader writing while the old one resumes
        with_signal(procs[leader], signal.SIGCONT)
        assert procs[leader].wait(20) == 1, "the old leader exits on lost leadership"
        wl3 = new_job(api, namespace, f"third-{round_}")
        kube.wait_for(lambda: boosted(api, namespace, wl3), 30, "the new leader boosts again")
        burst = [h.job_workload(api, namespace, f"burst-{round_}-{i}") for i in range(BURST)]
        kube.wait_for(lambda: all(boosted(api, namespace, w) for w in burst), 30, "burst boosted")
        kube.wait_for(watch.caught_up, 30, "the watch to see every Workload as it is now")
        changes = watch.stop()
        assert not watch.error, watch.error
        sent = audit.controller_writes(plane.audit_events(audit.UA_PREFIX), ok_only=False)
        sent = [w for w in sent if w.identity in (first, second)]
        mine = [w for w in sent if 200 <= w.code < 300]
        epochs = audit.writer_epochs(mine)
        assert epochs == [first, second], epochs
        new_first = min(w2.at for w2 in mine if w2.identity == second)
        late = [w for w in sent if w.identity == first and w.at > new_first]
        by = {r: [c for c in changes if r in c.replicas()] for r in (first, second)}
        assert [c for c in changes if c.ambiguous or len(c.replicas()) > 1] == [], changes
        assert by[first] and by[second], f"each leader changed something: {changes}"
        for r in (first, second):  # the two witnesses agree on who changed which object
            patched = {w.name for w in mine if w.identity == r and w.resource == "workloads"}
            assert {c.name for c in by[r]} <= patched, (r, by[r], patched)
        new_first_rv = min(c.rv for c in by[second])
        workloads = [w for w in sent if w.resource == "workloads"]
        return Round(handover, sum(200 <= w.code < 300 for w in workloads),
                     sum(w.code in CONFLICT for w in workloads),
                     len(by[first]) + len(by[second]),
                     sum(c.inferred for c in changes if c.replicas()),
                     len({c.name for c in by[first]} & set(burst)), late,
                     [c for c in by[first] if c.rv > new_first_rv])
    finally:
        watch.stop()
        for p in procs.values():
            stop(p)


def test_slow_apiserver_for_the_leader_only_never_two_writers(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str, tmp_path: Path, plane: Plane
) -> None:
    cq, _ = kube.create_queues(api, namespace, {"cpu": 0})
    lease = kube.unique_name("wdrf-slow")
    env = replica_env(lease)
    proxy = Proxy(plane.ports["apiserver"])
    slow_kc = proxy.kubeconfig(kubeconfig, tmp_path / "slow-kubeconfig")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["slow"] = h.spawn_controller(slow_kc, tmp_path / "slow.log", **env)
        first = holder(api, lease)  # the replica behind the proxy leads
        procs["direct"] = h.spawn_controller(kubeconfig, tmp_path / "direct.log", **env)
        wl = new_job(api, namespace, "first")
        kube.wait_for(lambda: boosted(api, namespace, wl), 30, "the slow replica boosts")
        time.sleep(3)  # the direct replica is up and following
        proxy.delay = 6.0  # > RENEW_DEADLINE: every answer to the leader comes 6 s late
        slowed_at = time.monotonic()
        second = holder(api, lease, ("", first), timeout=40)
        handover = time.monotonic() - slowed_at
        wl2 = new_job(api, namespace, "second")
        kube.wait_for(lambda: boosted(api, namespace, wl2), 30, "the new leader boosts")
        assert procs["slow"].wait(30) == 1, "the slowed leader exits on lost leadership"
        writes = audit.controller_writes(plane.audit_events(audit.UA_PREFIX))
        mine = [w for w in writes if w.identity in (first, second)]
        assert audit.writer_epochs(mine) == [first, second]
        first_new = min(w.at for w in mine if w.identity == second)
        last_old = max(w.at for w in mine if w.identity == first)
        print(f"slow leader: hand-over {handover:.1f}s after the slowdown; old leader's last "
              f"write {(first_new - last_old).total_seconds():.1f}s before the new one's first")
    finally:
        for p in procs.values():
            stop(p)
        proxy.close()
        h.cleanup(api, [namespace], [cq])


def test_sigterm_saves_history_then_releases_the_lease_and_writes_nothing_after(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str, tmp_path: Path, plane: Plane
) -> None:
    cq, _ = kube.create_queues(api, namespace, {"cpu": 1})
    lease = kube.unique_name("wdrf-term")
    env = replica_env(lease, USAGE_HALF_LIFE="1h")
    log = tmp_path / "replica.log"
    proc = h.spawn_controller(kubeconfig, log, **env)
    try:
        identity = holder(api, lease)
        running = new_job(api, namespace, "running")  # admitted: history has usage
        kube.wait_for_workload_condition(api, namespace, running, "QuotaReserved", "True",
                                         timeout=30)
        waiting = new_job(api, namespace, "waiting")
        kube.wait_for(lambda: boosted(api, namespace, waiting), 30, "the leader boosts")
        time.sleep(2)  # the decayed usage moves on: the final save has something to write
        term_at = datetime.now(UTC)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        writes = audit.controller_writes(plane.audit_events(audit.UA_PREFIX + identity))
        releases = [w for w in writes if w.resource == "leases" and w.name == lease]
        history = [w for w in writes if w.resource == "configmaps"
                   and w.name == env["HISTORY_CONFIG_MAP"] and w.received >= term_at]
        assert history, "no history save after SIGTERM"
        release = releases[-1]
        assert history[-1].at <= release.received, "history saved before the Lease release"
        after = [w for w in writes if w.received > release.at]
        assert after == [], f"writes after the release: {after}"
        assert h.lease_holder(api, LEASE_NS, lease) == ""
        print(f"SIGTERM: history saved {(release.at - history[-1].at).total_seconds():.3f}s "
              "before the release")
    finally:
        stop(proc)
        h.cleanup(api, [namespace], [cq])


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status) == 200
    except urllib.error.HTTPError:
        return False


def test_broken_watches_make_the_leader_unready_pause_writes_and_rewatch_slowly(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str, tmp_path: Path, plane: Plane
) -> None:
    cq, _ = kube.create_queues(api, namespace, {"cpu": 0})
    lease = kube.unique_name("wdrf-stale")
    port = free_port()
    env = replica_env(lease, METRICS_PORT=str(port), CACHE_MAX_STALENESS="8s")
    proxy = Proxy(plane.ports["apiserver"])
    kc = proxy.kubeconfig(kubeconfig, tmp_path / "proxied-kubeconfig")
    proc = h.spawn_controller(kc, tmp_path / "replica.log", **env)
    try:
        identity = holder(api, lease)
        wl = new_job(api, namespace, "before")
        kube.wait_for(lambda: boosted(api, namespace, wl), 30, "the leader boosts")
        kube.wait_for(lambda: _ready(port), 30, "ready")
        proxy.cut_after = 1.5  # every watch dies 1.5 s after it was sent, again and again
        broken_at = datetime.now(UTC)
        t0 = time.monotonic()
        kube.wait_for(lambda: not _ready(port), 30, "not ready with a stale cache")
        unready_after = time.monotonic() - t0
        during = new_job(api, namespace, "during")
        time.sleep(8)
        assert not boosted(api, namespace, during), "wrote from a stale cache"
        assert not _ready(port)
        broken_for = time.monotonic() - t0
        proxy.cut_after = 0.0
        fixed_at = datetime.now(UTC)
        t1 = time.monotonic()
        kube.wait_for(lambda: boosted(api, namespace, during), 60, "writes resume")
        kube.wait_for(lambda: _ready(port), 30, "ready again")
        recovered = time.monotonic() - t1
        rewatches = [t for t in audit.watches(plane.audit_events(audit.UA_PREFIX), identity)
                     if broken_at <= t <= fixed_at]
        # Backoff with jitter from 0.5 s doubling to 30 s: a handful, not a request loop.
        assert 2 <= len(rewatches) <= 10, rewatches
        assert proc.poll() is None
        print(f"stale cache: not ready after {unready_after:.1f}s, {len(rewatches)} Workload "
              f"re-watches in {broken_for:.0f}s of broken streams, recovered in "
              f"{recovered:.1f}s")
    finally:
        stop(proc)
        proxy.close()
        h.cleanup(api, [namespace], [cq])


def test_workload_recreated_under_the_same_name_gets_no_stale_patch(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str, plane: Plane
) -> None:
    cq, _ = kube.create_queues(api, namespace, {"cpu": 0})
    try:
        wl_name = new_job(api, namespace, "reborn")
        s = h.live_settings()
        c = h.new_controller(kubeconfig, s)
        c.discover()
        c.build_informers()
        c.sync_once()
        report = c.run_cycle()
        (decision,) = [d for d in report.plan.decisions if d.key == f"{namespace}/{wl_name}"]
        old = c.informers["workloads"].get(f"{namespace}/{wl_name}")
        assert old is not None
        old = {**old, "metadata": {**old["metadata"], "annotations": {}}}  # before any boost
        stale = diff_priority(decision, old, c._resource(WORKLOADS), PriorityMode.BOOST)
        assert stale is not None
        # The Workload is deleted; Kueue recreates it for its Job under the same name (a new
        # UID) — the stale patch computed for the old one must not land on it.
        body = kube.get_workload(api, namespace, wl_name)
        kube.request(api, "DELETE", kube.kueue_path("workloads", wl_name, namespace))

        def recreated() -> dict[str, Any] | None:
            for w in kube.list_workloads(api, namespace):
                if w["metadata"]["name"] == wl_name and \
                        w["metadata"]["uid"] != body["metadata"]["uid"]:
                    return w
            return None

        created = kube.wait_for(recreated, 60, "Kueue recreates the Workload")
        sent_at = datetime.now(UTC)
        outcome = Applier(c.writer, Metrics()).apply([stale])
        assert outcome.counts() == {NOOP: 1}
        now = kube.get_workload(api, namespace, wl_name)
        assert now["metadata"]["uid"] == created["metadata"]["uid"]
        assert KUEUE_PRIORITY_BOOST_ANNOTATION not in (now["metadata"].get("annotations") or {})
        # The audit log saw the stale patch refused by its precondition (422), nothing applied.
        patches = [e for e in plane.audit_events("wdrf-controller") if e.get("verb") == "patch"
                   and (e.get("objectRef") or {}).get("name") == wl_name
                   and e.get("stage") == "ResponseComplete"
                   and audit.ts(e["requestReceivedTimestamp"]) >= sent_at]
        codes = [int((e.get("responseStatus") or {}).get("code") or 0) for e in patches]
        assert 422 in codes and not any(200 <= code < 300 for code in codes), codes
        c.shutdown()
    finally:
        h.cleanup(api, [namespace], [cq])


@pytest.mark.parametrize("mode", ["boost", "spec"])
def test_a_write_computed_from_a_stale_read_fails_and_the_next_cycle_writes_the_right_value(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str, plane: Plane, mode: str
) -> None:
    """Every write is a compare-and-swap: a Workload changed by someone else between the
    plan's read and the write (here an admin's priority-boost, or spec.priority) makes the
    write fail as a whole (422, in the audit log), nothing it carried lands, it is counted as a
    conflict and not resent; the next cycle plans from the changed object and writes the value
    the controller wants."""
    cq, _ = kube.create_queues(api, namespace, {"cpu": 0})
    try:
        wl_name = new_job(api, namespace, "stale")
        key = f"{namespace}/{wl_name}"
        c = h.new_controller(kubeconfig, h.live_settings(PRIORITY_MODE=mode))
        with h.started(c):
            plan, built = c.plan(datetime.now(UTC))
            (change,) = [ch for ch in c.diff(plan, built).changes if ch.ref.name == wl_name]
            # Another writer, after the plan's read.
            if mode == "boost":
                kube.set_priority_boost(api, namespace, wl_name, 12345)
            else:
                kube.set_priority(api, namespace, wl_name, 7)
            theirs = kube.get_workload(api, namespace, wl_name)
            sent_at = datetime.now(UTC)
            (outcome,) = c.applier.apply([change]).outcomes
            assert outcome.result == "conflict" and outcome.error is not None \
                and outcome.error.status == 422, outcome
            assert c.metrics.patches.labels("Workload", "conflict")._value.get() == 1
            after = kube.get_workload(api, namespace, wl_name)
            assert after["spec"].get("priority") == theirs["spec"].get("priority")
            assert (after["metadata"].get("annotations") or {}) == (
                theirs["metadata"].get("annotations") or {})  # none of our fields landed
            patches = [e for e in plane.audit_events("wdrf-controller")
                       if e.get("verb") == "patch" and e.get("stage") == "ResponseComplete"
                       and (e.get("objectRef") or {}).get("name") == wl_name
                       and audit.ts(e["requestReceivedTimestamp"]) >= sent_at]
            codes = [int((e.get("responseStatus") or {}).get("code") or 0) for e in patches]
            assert codes == [422], codes  # sent once, refused, not resent
            rv = int(theirs["metadata"]["resourceVersion"])
            kube.wait_for(lambda: int((c.informers["workloads"].get(key) or {}).get(
                "metadata", {}).get("resourceVersion") or 0) >= rv, 30,
                "the cache to see the change")
            report = h.converge(c)
            (decision,) = [d for d in report.plan.decisions if d.key == key]
        final = kube.get_workload(api, namespace, wl_name)
        ann = final["metadata"].get("annotations") or {}
        if mode == "boost":
            assert int(ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION, 0)) == decision.target_boost
        else:
            assert final["spec"]["priority"] == decision.target_priority
            assert decision.base_priority == 7  # the admin's value is the new base
    finally:
        h.cleanup(api, [namespace], [cq])
