"""MultiKueue on three real planes (a manager and two workers, Kueue v0.19.2): what Kueue does
with the writes a priority controller could make on the manager, and the deployment the
controller supports (one controller per worker, classes from the manager).

Witnesses are what Kueue writes: the workers' Workload copies (their UID, spec, conditions) and
the workers' apiserver audit logs (who deleted what), never the controller's own output.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.domain import APPROVED_ANNOTATION as APPROVED
from controller.domain import URGENT_ANNOTATION as URGENT
from controller.live.main import make_manager_transport, make_transport
from controller.live.runner import LiveController
from tests.plane import live_audit as audit
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.multikueue import MK_USER, ORIGIN, MultiKueuePlanes, Queues, remote_copy

pytestmark = [pytest.mark.plane, pytest.mark.e2e]
Obj = dict[str, Any]
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mk() -> Iterator[MultiKueuePlanes]:
    with MultiKueuePlanes.temporary() as planes:
        yield planes


def _copies(mk: MultiKueuePlanes, ns: str, name: str) -> dict[str, Obj]:
    out = {}
    for w, plane in mk.workers.items():
        c = remote_copy(plane.api_client(), ns, name)
        if c is not None:
            out[w] = c
    return out


def _admitted_copy(mk: MultiKueuePlanes, ns: str, name: str) -> tuple[str, Obj]:
    """The worker MultiKueue chose for manager Workload ``ns/name`` (its status.clusterName)
    and the copy admitted there, once the copies on the other workers are gone. (Copies are
    created one worker at a time: a single admitted copy alone is not yet the choice.)"""
    manager = mk.manager.api_client()

    def probe() -> tuple[str, Obj] | None:
        chosen = (kube.get_workload(manager, ns, name).get("status") or {}).get("clusterName")
        copies = _copies(mk, ns, name)
        if not chosen or set(copies) != {chosen}:
            return None
        return (chosen, copies[chosen]) if kube.has_condition(copies[chosen], "Admitted") \
            else None

    return kube.wait_for(probe, 60, f"{ns}/{name} admitted on the worker MultiKueue chose",
                         lambda: str({w: kube.describe_workload(c)
                                      for w, c in _copies(mk, ns, name).items()}))


def _running_job(worker: k8s.ApiClient, ns: str, job: str) -> Obj:
    def probe() -> Obj | None:
        j = kube.get_job(worker, ns, job)  # NotFound until MultiKueue creates it: retried
        return j if (j.get("status") or {}).get("active") else None

    return kube.wait_for(probe, 60, f"Job {ns}/{job} running on the worker")


def _deletes_by_multikueue(mk: MultiKueuePlanes, worker: str, resource: str, ns: str,
                           name: str, after: datetime) -> list[Obj]:
    return [e for e in mk.workers[worker].audit_events()
            if e.get("verb") == "delete" and e.get("stage") == "ResponseComplete"
            and (e.get("user") or {}).get("username") == MK_USER
            and (e.get("objectRef") or {}).get("resource") == resource
            and (e.get("objectRef") or {}).get("namespace") == ns
            and (e.get("objectRef") or {}).get("name") == name
            and audit.ts(e["requestReceivedTimestamp"]) >= after]


def _wpc(mk: MultiKueuePlanes, name: str, value: int) -> None:
    for plane in mk.planes.values():
        kube.request(plane.api_client(), "POST", kube.kueue_path("workloadpriorityclasses"), {
            "apiVersion": f"{kube.KUEUE_GROUP}/{kube.KUEUE_VERSION}",
            "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value})


def _submit(mk: MultiKueuePlanes, q: Queues, job: str, ns: str | None = None,
            **kw: Any) -> str:
    """Job ``job`` in ``ns`` (default: the first namespace) on the manager; its Workload's
    name."""
    m = mk.manager.api_client()
    ns = ns or q.namespace
    kube.create_job(m, ns, job, q.local_queue, **kw)
    name: str = kube.workload_for_job(m, ns, job)["metadata"]["name"]
    return name


def _fill_workers(mk: MultiKueuePlanes, q: Queues) -> None:
    """One long Job admitted on each worker (worker quota: one Job), so later ones wait there."""
    names = [_submit(mk, q, f"blocker-{i}", run_seconds=600) for i in range(len(mk.workers))]
    where = {_admitted_copy(mk, q.namespace, n)[0] for n in names}
    assert where == set(mk.workers), where


# -- what Kueue does with the manager-side writes ----------------------------------------------


def test_spec_priority_write_without_a_class_deletes_the_running_copy(
    mk: MultiKueuePlanes,
) -> None:
    """spec.priority of a manager Workload without a WorkloadPriorityClass, rewritten after
    dispatch (what spec mode would do): MultiKueue deletes the worker's copy and its running
    Job. The same write on a Workload with a WorkloadPriorityClass is forwarded instead."""
    q = mk.add_queues({"cpu": 10}, {"cpu": 4})
    wpc = kube.unique_name("wpc")
    _wpc(mk, wpc, 100)
    m = mk.manager.api_client()
    plain = _submit(mk, q, "plain", run_seconds=600)
    classed = _submit(mk, q, "classed", run_seconds=600, priority_class=wpc)
    w_plain, copy_plain = _admitted_copy(mk, q.namespace, plain)
    w_classed, copy_classed = _admitted_copy(mk, q.namespace, classed)
    worker = mk.workers[w_plain].api_client()
    _running_job(worker, q.namespace, "plain")
    _running_job(mk.workers[w_classed].api_client(), q.namespace, "classed")
    assert copy_classed["spec"]["priority"] == 100

    written_at = datetime.now(UTC).replace(microsecond=0)
    kube.set_priority(m, q.namespace, plain, 1000)
    kube.set_priority(m, q.namespace, classed, 1000)

    # The copy without a class: deleted by MultiKueue's identity (the worker's audit log), its
    # running Job with it; what is on the workers afterwards is a new object, if any.
    kube.wait_for(lambda: _deletes_by_multikueue(mk, w_plain, "workloads", q.namespace, plain,
                                                 written_at), 60,
                  f"MultiKueue deleting the copy of {plain} on {w_plain}")
    assert _deletes_by_multikueue(mk, w_plain, "jobs", q.namespace, "plain", written_at)
    uid0 = copy_plain["metadata"]["uid"]
    assert all(c["metadata"]["uid"] != uid0 for c in _copies(mk, q.namespace, plain).values())

    # The copy with a class: updated in place (same object, still admitted, priority forwarded).
    def forwarded() -> Obj | None:
        c = remote_copy(mk.workers[w_classed].api_client(), q.namespace, classed)
        return c if c is not None and c["spec"]["priority"] == 1000 else None

    after = kube.wait_for(forwarded, 60, f"priority 1000 forwarded to {classed}'s copy")
    assert after["metadata"]["uid"] == copy_classed["metadata"]["uid"]
    assert kube.has_condition(after, "Admitted")
    assert not _deletes_by_multikueue(mk, w_classed, "workloads", q.namespace, classed,
                                      written_at)


def test_priority_boost_change_after_dispatch_is_not_forwarded(mk: MultiKueuePlanes) -> None:
    """The kueue.x-k8s.io/priority-boost annotation set on the manager's Workload after its
    copies exist never reaches them, even while MultiKueue forwards a later spec change of the
    same Workload (the positive control that MultiKueue did reconcile it afterwards)."""
    q = mk.add_queues({"cpu": 10}, {"cpu": 1})
    wpc = kube.unique_name("wpc")
    _wpc(mk, wpc, 100)
    m = mk.manager.api_client()
    _fill_workers(mk, q)
    waiting = _submit(mk, q, "waiting", run_seconds=600, priority_class=wpc)
    copies = kube.wait_for(lambda: (lambda c: c if len(c) == 2 else None)(
        _copies(mk, q.namespace, waiting)), 60, f"copies of {waiting} on both workers")
    assert all(kube.is_pending(c) for c in copies.values()), copies

    kube.set_priority_boost(m, q.namespace, waiting, 5000)
    # MultiKueue's reconcile of this spec change reads the Workload with the boost already set.
    kube.set_priority(m, q.namespace, waiting, 200)

    def spec_forwarded() -> dict[str, Obj] | None:
        now = _copies(mk, q.namespace, waiting)
        ok = len(now) == 2 and all(c["spec"]["priority"] == 200 for c in now.values())
        return now if ok else None

    now = kube.wait_for(spec_forwarded, 60, f"spec.priority 200 forwarded to {waiting}'s copies")
    for w, c in now.items():
        assert c["metadata"]["uid"] == copies[w]["metadata"]["uid"]
        assert kube.PRIORITY_BOOST not in (c["metadata"].get("annotations") or {}), (w, c)
        assert c["metadata"]["labels"][ORIGIN_LABEL] == ORIGIN
    manager_wl = kube.get_workload(m, q.namespace, waiting)
    assert manager_wl["metadata"]["annotations"][kube.PRIORITY_BOOST] == "5000"


def test_spec_mode_on_the_manager_leaves_a_dispatched_copy_alone(mk: MultiKueuePlanes) -> None:
    """The controller in spec mode on the manager, where preemption can reach a dispatched
    normal Workload (no WorkloadPriorityClass, running on a worker) and an approved one waits
    for the manager's quota: the plan wants the running one's class guard in spec.priority
    (the write the first test shows MultiKueue turns into a deletion); the MultiKueue rule
    leaves it unchanged, and the worker's copy lives on."""
    q = mk.add_queues({"cpu": 1}, {"cpu": 4},
                      cq_spec={"preemption": {"withinClusterQueue": "LowerPriority"}})
    ns = q.namespace
    running = _submit(mk, q, "normal", run_seconds=600)
    w, copy0 = _admitted_copy(mk, ns, running)
    _running_job(mk.workers[w].api_client(), ns, "normal")
    waiting = _submit(mk, q, "approved", run_seconds=600, annotations={APPROVED: "true"})
    since = datetime.now(UTC).replace(microsecond=0)
    settings = h.live_settings(PRIORITY_MODE="spec", KUBECONFIG_PATH=str(mk.manager.kubeconfig))
    c = LiveController(settings, make_transport(settings, "manager-spec"), identity="manager-spec")
    with h.started(c):
        report = h.converge(c)
    written = [x for x in audit.controller_writes(mk.manager.audit_events(audit.UA_PREFIX))
               if x.resource == "workloads" and x.namespace == ns]
    assert not written, written
    assert not _deletes_by_multikueue(mk, w, "workloads", ns, running, since)
    copy1 = remote_copy(mk.workers[w].api_client(), ns, running)
    assert copy1 is not None and copy1["metadata"]["uid"] == copy0["metadata"]["uid"]
    assert kube.has_condition(copy1, "Admitted")
    by = {d.key: d for d in report.plan.decisions}
    assert {f"{ns}/{running}", f"{ns}/{waiting}"} <= set(by), list(by)
    for d in (by[f"{ns}/{running}"], by[f"{ns}/{waiting}"]):
        # what the plan wanted differs from what is there: only the rule kept it from writing
        assert d.target_priority != (d.current_priority or 0), d
        assert d.leave_unchanged and "MultiKueue" in d.problems[-1].message, d


# -- the deployment: a controller per worker, classes from the manager ----------------------------


WORKER_USERS = "wdrf-test:worker-users"


def _install_admission_policy(api: k8s.ApiClient, ns: str, exempt: str = "") -> None:
    """manifests/admission as shipped (with ``exempt`` in exemptUsers: on a worker, MultiKueue's
    identity, which mirrors the manager whose own policy already checked each annotation), and
    an editor Role in ``ns`` for people who have rights on this cluster only."""
    from tests.support.manifests import ssa

    for obj in kube.render_kustomize(REPO / "manifests" / "admission"):
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "wdrf-admission-params":
            obj["data"]["exemptUsers"] = exempt
        ssa(api, obj)
    ssa(api, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": {"name": "editor", "namespace": ns},
                 "rules": [{"apiGroups": ["batch", kube.KUEUE_GROUP],
                            "resources": ["jobs", "workloads"],
                            "verbs": ["get", "list", "create", "update", "patch"]}]})
    ssa(api, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": "editor", "namespace": ns},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": "editor"},
                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                               "name": WORKER_USERS}]})


def _effective(c: Obj) -> int:
    boost = (c["metadata"].get("annotations") or {}).get(kube.PRIORITY_BOOST, "0")
    return int(c["spec"].get("priority") or 0) + int(boost)


def test_controllers_on_the_workers_order_the_copies_by_the_managers_classes(
    mk: MultiKueuePlanes,
) -> None:
    """A controller per worker (boost mode, MULTIKUEUE_MANAGER_KUBECONFIG): worker-1's Kueue
    admits the copies urgent, then approved, then normal; an urgent set on the manager's Job
    after dispatch reorders both workers' queues within one cycle; someone with rights on a
    worker only cannot promote a copy there. Witnesses: which copy worker-1's Kueue admits
    next (QuotaReserved), the worker's admission policy's denial, the audit logs."""
    q = mk.add_queues({"cpu": 10}, {"cpu": 1})
    ns = q.namespace
    m = mk.manager.api_client()
    workers = {w: p.api_client() for w, p in mk.workers.items()}
    # Everywhere, as the deployment says: users submit to the manager under its policy (and
    # its class stand-ins); the workers exempt MultiKueue's identity.
    _install_admission_policy(m, ns)
    for api in workers.values():
        _install_admission_policy(api, ns, exempt=MK_USER)
    blockers = {_admitted_copy(mk, ns, n)[0]: n for n in (
        _submit(mk, q, f"blocker-{i}", run_seconds=600) for i in range(len(workers)))}
    assert set(blockers) == set(workers), blockers
    jobs = {"n1": {}, "a1": {APPROVED: "true"}, "u1": {URGENT: "true"}, "n2": {}}
    wl = {j: _submit(mk, q, j, run_seconds=600, annotations=ann) for j, ann in jobs.items()}
    first_uid: dict[tuple[str, str], str] = {}

    def dispatched() -> bool:
        for j, name in wl.items():
            for w, c in _copies(mk, ns, name).items():
                first_uid.setdefault((w, j), c["metadata"]["uid"])
        return len(first_uid) == len(wl) * len(workers)

    kube.wait_for(dispatched, 60, "every Job's copy on both workers")
    # The manager's class stand-ins reached the copies (their spec is the manager's).
    u1_copy = remote_copy(workers["worker-2"], ns, wl["u1"])
    assert u1_copy is not None
    assert u1_copy["spec"]["priorityClassRef"]["name"] == "wdrf-urgent", u1_copy["spec"]

    # Built as `python -m controller` builds them (main.make_transport and
    # make_manager_transport), each naming itself in its User-Agent.
    controllers = {}
    for w, p in mk.workers.items():
        settings = h.live_settings(
            LOOP_INTERVAL="30", PRIORITY_MODE="boost", KUBECONFIG_PATH=str(p.kubeconfig),
            MULTIKUEUE_MANAGER_KUBECONFIG=str(mk.manager.kubeconfig))
        controllers[w] = LiveController(settings, make_transport(settings, w), identity=w,
                                        manager=make_manager_transport(settings, w))
    with contextlib.ExitStack() as stack:
        for ctl in controllers.values():
            stack.enter_context(h.started(ctl, loop=True))

        def ordered(w: str) -> bool:
            eff = {j: _effective(c) for j in wl
                   if (c := remote_copy(workers[w], ns, wl[j])) is not None}
            return len(eff) == len(wl) and eff["u1"] > eff["a1"] > eff["n1"]

        for w in workers:
            kube.wait_for(lambda w=w: ordered(w), 60, f"the controller on {w} ordering")  # type: ignore[misc]

        # Someone with rights on worker-2 only tries to make n1 urgent there: the worker's
        # admission policy refuses (and the controller would read the manager's Job anyway).
        wendy = kube.impersonating_client(workers["worker-2"], "wendy", [WORKER_USERS])

        copy_path = kube.kueue_path("workloads", wl["n1"], ns)
        urgent_patch = {"metadata": {"annotations": {URGENT: "true"}}}

        def enforced() -> bool:  # policies load asynchronously: probe without effect first
            try:
                kube.request(wendy, "PATCH", copy_path, urgent_patch, query={"dryRun": "All"})
            except ApiException as e:
                return URGENT in str(e.body)
            return False

        kube.wait_for(enforced, 60, "worker-2's admission policy enforced")
        for attempt in (lambda: kube.request(wendy, "PATCH", copy_path, urgent_patch),
                        lambda: kube.create_job(wendy, ns, "sneaky", q.local_queue,
                                                annotations={URGENT: "true"})):
            code, text = kube.denial(attempt)
            assert code in (403, 422) and URGENT in text, (code, text)

        # worker-1 frees its slot: its Kueue admits the urgent copy first.
        w1 = "worker-1"
        order = [_release_and_next(mk, ns, blockers[w1], w1, wl)]
        # n2 becomes urgent on the manager after dispatch: both workers reorder within a cycle.
        # LOOP_INTERVAL is long: cycles here come from the prompt trigger of the change.
        cycles_before = {w: c.cycles for w, c in controllers.items()}
        kube.request(m, "PATCH", f"/apis/batch/v1/namespaces/{ns}/jobs/n2",
                     {"metadata": {"annotations": {URGENT: "true"}}})
        seen_at: dict[str, int] = {}  # worker -> cycles finished before the GET that saw it

        def reordered() -> bool:
            for w in set(workers) - set(seen_at):
                cycles = controllers[w].cycles
                eff = {j: _effective(c) for j in ("n2", "a1")
                       if (c := remote_copy(workers[w], ns, wl[j])) is not None}
                if eff.get("n2", 0) > eff.get("a1", 0):
                    seen_at[w] = cycles
            return len(seen_at) == len(workers)

        kube.wait_for(reordered, 60, "n2 above a1 on both workers")
        for w in workers:  # written by the cycle running at the change or the next one
            assert seen_at[w] - cycles_before[w] <= 2, (w, cycles_before, seen_at)
        seen: list[dict[str, str]] = []  # the queue on worker-1 before each release
        released_at: list[str] = []
        for _ in range(3):  # then n2 (urgent now), a1 (approved), n1 (normal)
            # Released once the controller has acted on the last admission: a write of its
            # landing in the second after a release would let Kueue admit the rewritten copy
            # ahead of the parked ones (Kueue requeues parked Workloads in 1 s batches;
            # docs/evaluation.md, "Kueue's batched requeue"). What the release itself
            # makes the controller write is still in the test.
            _settled(controllers[w1], f"{ns}/{wl[order[-1]]}")
            seen.append(_queue(workers[w1], ns, wl))
            released_at.append(datetime.now(UTC).isoformat(timespec="milliseconds"))
            order.append(_release_and_next(mk, ns, wl[order[-1]], w1, wl))

        def why() -> str:
            # Kueue hands quota it has just freed to a parked Workload only after its batched
            # requeue (1 s); a boost written to a lower one within that second admits it first
            # (docs/evaluation.md, "Kueue's batched requeue"): the writes and their instants
            # tell whether that happened.
            writes = [(x.at.isoformat(timespec="milliseconds"), x.identity, x.name)
                      for x in audit.controller_writes(
                          mk.workers[w1].audit_events(audit.UA_PREFIX))
                      if x.resource == "workloads" and x.namespace == ns]
            return str({"order": order, "before each release": seen,
                        "released at": released_at, "after": _queue(workers[w1], ns, wl),
                        "controller writes on worker-1": writes})

        assert order == ["u1", "n2", "a1", "n1"], why()

    # The copies Kueue admitted on worker-1 are those MultiKueue created at dispatch (nothing
    # the controllers wrote made MultiKueue recreate one); the controllers only patched
    # Workloads on the workers (besides Events) and wrote nothing on the manager.
    for j in order:
        c = remote_copy(workers[w1], ns, wl[j])
        assert c is None or c["metadata"]["uid"] == first_uid[(w1, j)], j
    audit_w1 = audit.controller_writes(mk.workers[w1].audit_events(audit.UA_PREFIX))
    assert {x.verb for x in audit_w1 if x.resource == "workloads"} == {"patch"}, audit_w1
    on_manager = mk.manager.audit_events(audit.UA_PREFIX)
    assert not [x for x in audit.controller_writes(on_manager) if x.identity in workers]
    assert all(audit.watches(on_manager, w) for w in workers)  # they did read the manager


def _settled(c: LiveController, admitted: str) -> None:
    """Wait until ``c`` has seen Workload ``admitted`` (namespace/name) admitted and a whole
    cycle has run after that (prompted, not at LOOP_INTERVAL)."""
    kube.wait_for(lambda: (o := c.informers["workloads"].get(admitted)) is not None
                  and kube.has_condition(o, "QuotaReserved"), 60,
                  f"the controller seeing {admitted} admitted")
    target = c.cycles + 2  # the cycle running now may have planned before it saw it

    def cycled() -> bool:
        if c.cycles >= target:
            return True
        c.trigger.set()  # promptly, not at LOOP_INTERVAL
        return False

    kube.wait_for(cycled, 60, "a controller cycle after the admission")


def _queue(worker: k8s.ApiClient, ns: str, wl: dict[str, str]) -> dict[str, str]:
    """Each Job's copy on ``worker`` as Kueue orders it: priority, boost, conditions, UID."""
    return {j: f"{kube.describe_workload(c)} uid={c['metadata']['uid']}" for j in wl
            if (c := remote_copy(worker, ns, wl[j])) is not None}


def _release_and_next(mk: MultiKueuePlanes, ns: str, running: str, worker: str,
                      wl: dict[str, str]) -> str:
    """Deactivate ``running`` on the manager (MultiKueue removes its copy and frees the
    worker's slot) and return the Job whose copy ``worker``'s Kueue admits next."""
    h.deactivate(mk.manager.api_client(), ns, running)
    api = mk.workers[worker].api_client()

    def next_one() -> str | None:
        got = [j for j, name in wl.items() if name != running and (
            c := remote_copy(api, ns, name)) is not None and kube.has_condition(
                c, "QuotaReserved")]
        return got[0] if len(got) == 1 else None

    return kube.wait_for(next_one, 60, f"the next admission on {worker}")


# -- team fairness on the workers ----------------------------------------------------------------


def test_controllers_on_the_workers_order_the_copies_by_team_fairness(
    mk: MultiKueuePlanes, tmp_path: Path,
) -> None:
    """Three teams' normal Jobs submitted to the manager wait on both workers; each worker's
    Kueue admits them in the order of that worker's team shares (what runs there), not in
    submission order; a team's running Job ending on worker-1 (a fairness move after dispatch)
    reorders worker-1's queue in the controller's next cycle after it sees the change, and its
    Kueue admits that team's Job ahead of an older one. Witnesses: which copy each worker's
    Kueue admits when a slot frees (QuotaReserved).

    Each worker has 4 cpu and runs, placed there by holding the other worker's ClusterQueue:
    worker-1 b 0.5, c 1.5, d 2; worker-2 b 1, c 1, d 2 (team d frees the slots; it waits for
    nothing, so its usage orders nobody). The pending Jobs need 2 cpu each, so a slot is 2 cpu.
    The controllers read the manager as the reader manifests/multikueue-manager creates there.
    """
    q = mk.add_queues({"cpu": 20}, {"cpu": 4}, teams=4)
    a, b, c, d = q.namespaces
    m = mk.manager.api_client()
    workers = {w: p.api_client() for w, p in mk.workers.items()}
    w1, w2 = "worker-1", "worker-2"
    runs = {w1: {b: "500m", c: "1500m", d: "2"}, w2: {b: "1", c: "1", d: "2"}}
    running: dict[tuple[str, str], str] = {}  # (worker, team) -> manager Workload
    mk.hold(w2, q.cluster_queue)  # worker-1's Jobs land there; then worker-1 is full
    for w, cpus in runs.items():
        names = {ns: _submit(mk, q, f"run-{w}", ns=ns, run_seconds=600,
                             requests={"cpu": cpu}) for ns, cpu in cpus.items()}
        for ns, name in names.items():
            assert _admitted_copy(mk, ns, name)[0] == w, (ns, name)
            running[(w, ns)] = name
        if w == w1:
            mk.hold(w2, q.cluster_queue, held=False)

    # b1 first, a1 last (1.1 s apart: distinct queue times): Kueue alone admits b1 first.
    pending: dict[str, tuple[str, str]] = {}  # job -> (namespace, manager Workload)
    for i, (job, ns) in enumerate((("b1", b), ("c1", c), ("a1", a))):
        if i:
            time.sleep(1.1)
        pending[job] = (ns, _submit(mk, q, job, ns=ns, run_seconds=600,
                                    requests={"cpu": "2"}))
    first_uid: dict[tuple[str, str], str] = {}

    def dispatched() -> bool:
        for j, (ns, name) in pending.items():
            for w, cp in _copies(mk, ns, name).items():
                assert kube.is_pending(cp), (w, kube.describe_workload(cp))
                first_uid.setdefault((w, j), cp["metadata"]["uid"])
        return len(first_uid) == len(pending) * len(workers)

    kube.wait_for(dispatched, 60, "every pending Job's copy on both workers")

    def fair_order(w: str, jobs: set[str], freed: frozenset[str] = frozenset()) -> list[str]:
        """Progressive filling on worker ``w``: each Job's team's cpu at its turn (what the
        team runs there plus the Job) over the worker's 4 cpu; equal shares by queue time."""
        usage = {ns: float(cpu.rstrip("m")) / (1000 if cpu.endswith("m") else 1)
                 for ns, cpu in runs[w].items() if ns not in freed}
        share = {j: (usage.get(pending[j][0], 0.0) + 2) / 4 for j in jobs}
        return sorted(jobs, key=lambda j: (share[j], list(pending).index(j)))

    # worker-1: a 0.5 < b 0.625 < c 0.875; worker-2: a 0.5 < b = c 0.75.
    assert fair_order(w1, set(pending)) == ["a1", "b1", "c1"]
    assert fair_order(w2, set(pending)) == ["a1", "b1", "c1"]

    reader = _manager_reader_kubeconfig(mk, tmp_path / "manager-reader.kubeconfig")
    controllers = {}
    for w, p in mk.workers.items():
        settings = h.live_settings(
            LOOP_INTERVAL="30", PRIORITY_MODE="boost", KUBECONFIG_PATH=str(p.kubeconfig),
            MULTIKUEUE_MANAGER_KUBECONFIG=str(reader))
        controllers[w] = LiveController(settings, make_transport(settings, f"{w}-fair"),
                                        identity=f"{w}-fair",
                                        manager=make_manager_transport(settings, f"{w}-fair"))

    def effective(w: str) -> dict[str, int]:
        return {j: _effective(cp) for j, (ns, name) in pending.items()
                if (cp := remote_copy(workers[w], ns, name)) is not None}

    def heads(w: str, expected: list[str]) -> bool:
        """The copies on ``w`` in ``expected`` order by priority + boost (ties allowed only
        after the first)."""
        eff = effective(w)
        if set(eff) != set(expected):
            return False
        vals = [eff[j] for j in expected]
        return vals[0] > max(vals[1:], default=vals[0] - 1) and vals == sorted(vals, reverse=True)

    with contextlib.ExitStack() as stack:
        for ctl in controllers.values():
            stack.enter_context(h.started(ctl, loop=True))
        for w, ctl in controllers.items():
            def ordered(w: str = w, ctl: LiveController = ctl) -> bool:
                ok = heads(w, fair_order(w, set(pending)))
                if not ok:
                    ctl.trigger.set()  # a cycle now rather than at LOOP_INTERVAL
                return ok

            kube.wait_for(ordered, 60, f"the controller on {w} ordering by team shares",
                          lambda w=w: str(effective(w)))  # type: ignore[misc]
            _cycles(ctl, 1)

        # worker-2 frees 2 cpu (d's Job ends): its Kueue admits a1, the youngest, whose team
        # runs nothing there. a1's copy on worker-1 goes.
        h.deactivate(m, d, running[(w2, d)])
        assert _next_admitted(mk, w2, pending) == "a1", _queue_of(workers[w2], pending)
        kube.wait_for(lambda: remote_copy(workers[w1], *pending["a1"]) is None, 60,
                      "a1's copy gone from worker-1")
        rest = {"b1", "c1"}
        assert fair_order(w1, rest) == ["b1", "c1"]
        kube.wait_for(lambda: heads(w1, ["b1", "c1"]), 60, "b1 above c1 on worker-1",
                      lambda: str(effective(w1)))

        # The fairness move: c's running Job on worker-1 ends (1.5 cpu freed, too little for
        # a 2-cpu Job, so nobody is admitted). c's share at c1's turn drops to 0.5, below b's
        # 0.625: c1 must pass b1 within one cycle of the controller seeing the change.
        assert fair_order(w1, rest, frozenset({c})) == ["c1", "b1"]
        ctl = controllers[w1]
        h.deactivate(m, c, running[(w1, c)])
        gone = f"{c}/{running[(w1, c)]}"
        kube.wait_for(lambda: (o := ctl.informers["workloads"].get(gone)) is None
                      or not kube.has_condition(o, "QuotaReserved"), 60,
                      "the controller on worker-1 seeing c's Job end")
        # A usage change prompts no cycle (LOOP_INTERVAL 30 s here): the test runs the next
        # one now, and nothing else prompts one until the reorder is seen.
        cycles_before = ctl.cycles
        ctl.trigger.set()
        seen_at: list[int] = []

        def moved() -> bool:
            cycles = ctl.cycles
            if heads(w1, ["c1", "b1"]):
                seen_at.append(cycles)
            return bool(seen_at)

        kube.wait_for(moved, 60, "c1 above b1 on worker-1", lambda: str(effective(w1)))
        # written by the cycle running when the controller saw it, or the next one
        assert seen_at[0] - cycles_before <= 2, (cycles_before, seen_at)
        assert all(kube.is_pending(cp) for j in rest
                   if (cp := remote_copy(workers[w1], *pending[j])) is not None)
        _cycles(ctl, 1)

        # worker-1 frees 2 cpu (d's Job ends): its Kueue admits c1, though b1 waited longer.
        h.deactivate(m, d, running[(w1, d)])
        assert _next_admitted(mk, w1, {j: pending[j] for j in rest}) == "c1", \
            _queue_of(workers[w1], pending)

    # The admitted copies are those MultiKueue created at dispatch; nothing was written on
    # the manager.
    for w, j in ((w2, "a1"), (w1, "c1")):
        cp = remote_copy(workers[w], *pending[j])
        assert cp is not None and cp["metadata"]["uid"] == first_uid[(w, j)], (w, j)
    on_manager = audit.controller_writes(mk.manager.audit_events(audit.UA_PREFIX))
    assert not [x for x in on_manager if x.identity in {f"{w}-fair" for w in workers}]


def _manager_reader_kubeconfig(mk: MultiKueuePlanes, path: Path) -> Path:
    """manifests/multikueue-manager applied on the manager and a kubeconfig with a token of
    its ServiceAccount (a TokenRequest: the manager runs no token controller to fill the
    shipped token Secret). `--health-check`'s manager review passes with it, and the reader
    may not write there."""
    from controller.live.health import OK, access_review, check_manager
    from controller.live.kube import KubeTransport
    from controller.live.rbac import Permission, manager_permissions
    from tests.support.manifests import sa_kubeconfig, ssa

    m = mk.manager.api_client()
    for obj in kube.render_kustomize(REPO / "manifests" / "multikueue-manager"):
        ssa(m, obj)
    token = kube.service_account_token(m, "kueue-system", "wdrf-multikueue-reader")
    sa_kubeconfig(mk.manager, token, path)
    t = KubeTransport.from_config(str(path))
    settings = h.live_settings(MULTIKUEUE_MANAGER_KUBECONFIG=str(path))
    checks = check_manager(t, settings)
    assert len(checks) == 1 + len(manager_permissions(settings))
    assert all(c.status == OK for c in checks), [c.line() for c in checks]
    for verb in ("patch", "delete"):
        allowed, _ = access_review(t, Permission("kueue.x-k8s.io", "workloads", verb, None, ""))
        assert not allowed, verb
    return path


def _cycles(c: LiveController, n: int) -> None:
    """Wait until ``c`` has finished ``n`` more cycles (prompted, not at LOOP_INTERVAL)."""
    target = c.cycles + n

    def done() -> bool:
        if c.cycles >= target:
            return True
        c.trigger.set()
        return False

    kube.wait_for(done, 60, f"{n} more controller cycles")


def _queue_of(worker: k8s.ApiClient, pending: dict[str, tuple[str, str]]) -> str:
    return str({j: kube.describe_workload(cp) for j, (ns, name) in pending.items()
                if (cp := remote_copy(worker, ns, name)) is not None})


def _next_admitted(mk: MultiKueuePlanes, worker: str,
                   candidates: dict[str, tuple[str, str]]) -> str:
    """The one Job of ``candidates`` whose copy ``worker``'s Kueue admits (QuotaReserved)."""
    api = mk.workers[worker].api_client()

    def admitted() -> str | None:
        got = [j for j, (ns, name) in candidates.items()
               if (cp := remote_copy(api, ns, name)) is not None
               and kube.has_condition(cp, "QuotaReserved")]
        assert len(got) <= 1, got  # one slot was freed
        return got[0] if got else None

    return kube.wait_for(admitted, 60, f"the next admission on {worker}",
                         lambda: _queue_of(api, candidates))
