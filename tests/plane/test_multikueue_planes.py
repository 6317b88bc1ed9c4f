"""MultiKueue on three real planes (a manager and two workers, Kueue v0.19.2): what Kueue does
with the writes a priority controller could make on the manager, and the deployment the
controller supports (one controller per worker, classes from the manager).

Witnesses are what Kueue writes: the workers' Workload copies (their UID, spec, conditions) and
the workers' apiserver audit logs (who deleted what), never the controller's own output.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.plane import live_audit as audit
from tests.support import kube
from tests.support.multikueue import MK_USER, ORIGIN, MultiKueuePlanes, Queues, remote_copy

pytestmark = [pytest.mark.plane, pytest.mark.e2e]
Obj = dict[str, Any]
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"


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
    """The worker whose copy Kueue admitted, once MultiKueue has deleted the others."""

    def probe() -> tuple[str, Obj] | None:
        copies = _copies(mk, ns, name)
        admitted = [(w, c) for w, c in copies.items() if kube.has_condition(c, "Admitted")]
        return admitted[0] if len(admitted) == 1 and len(copies) == 1 else None

    return kube.wait_for(probe, 60, f"{ns}/{name} admitted on exactly one worker",
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


def _submit(mk: MultiKueuePlanes, q: Queues, job: str, **kw: Any) -> str:
    m = mk.manager.api_client()
    kube.create_job(m, q.namespace, job, q.local_queue, **kw)
    name: str = kube.workload_for_job(m, q.namespace, job)["metadata"]["name"]
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
