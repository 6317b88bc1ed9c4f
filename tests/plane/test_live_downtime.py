"""Class order while the controller is down, on the real plane (docs/operations.md).

The shipped manifests are installed (the class stand-in policy's binding scoped to this
module's namespaces, as in test_manifests_plane.py): new Jobs get their class's
WorkloadPriorityClass at creation (`wdrf-urgent` 1,500,000; `wdrf-approved`, `wdrf-normal` 0).

Witnesses the controller cannot write: the API server's answers to impersonated users, the
priorities and conditions Kueue sets on the Workloads, Kueue's `Preempted` Events, and the
API server's audit log (every write the returning controller sent).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.domain import (
    APPROVED_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    URGENT_ANNOTATION,
)
from controller.live.kube import KubeTransport
from controller.live.main import user_agent
from controller.live.runner import LiveController
from tests.plane import live_audit as audit
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.kube import denial
from tests.support.manifests import SCOPE_LABEL, install_manifests, ssa
from tests.support.plane import Plane, go_module_dir, load_yaml_docs

pytestmark = pytest.mark.plane

Obj = dict[str, Any]
PC_LABEL = "kueue.x-k8s.io/priority-class"
USERS = "wdrf-downtime:users"
URGENT_VALUE = 1_500_000
_PREEMPTED = re.compile(r"Preempted to accommodate a workload \(UID: ([^,]+),")


def jobs(ns: str, name: str = "") -> str:
    return f"/apis/batch/v1/namespaces/{ns}/jobs" + (f"/{name}" if name else "")


@pytest.fixture(scope="module")
def space(admin: k8s.ApiClient, suffix: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namespace under the shipped admission policies, users may edit Jobs there; waits
    until both policies act (they load asynchronously)."""
    install_manifests(admin, tmp_path_factory.mktemp("kustomize"))
    ns = kube.create_namespace(admin, f"down-{suffix}", {SCOPE_LABEL: suffix})
    ssa(admin, kube.role("editor", [{"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"],
                                     "verbs": ["get", "list", "create", "update", "patch"]}],
                         ns))
    ssa(admin, kube.binding("editor", "editor", [kube.group(USERS)], ns, cluster_role=False))
    probe = kube.job_manifest(ns, "probe", "lq")

    def stamped() -> bool:
        got = kube.request(admin, "POST", jobs(ns), probe, "application/json",
                           {"dryRun": "All"})
        return got["metadata"].get("labels", {}).get(PC_LABEL) == "wdrf-normal"

    alice = kube.impersonating_client(admin, "alice", [USERS])
    urgent = kube.job_manifest(ns, "probe", "lq", annotations={URGENT_ANNOTATION: "true"})

    def refused() -> bool:
        try:
            kube.request(alice, "POST", jobs(ns), urgent, "application/json", {"dryRun": "All"})
        except ApiException as e:
            return URGENT_ANNOTATION in str(e.body)
        return False

    kube.wait_for(stamped, 60, "the class stand-in policy to stamp new Jobs")
    kube.wait_for(refused, 60, "the class policy to be enforced")
    yield ns


def _label(job: Obj) -> str | None:
    return (job["metadata"].get("labels") or {}).get(PC_LABEL)


def test_new_jobs_get_their_class_stand_in_and_nobody_picks_a_higher_one(
    admin: k8s.ApiClient, space: str
) -> None:
    ns = space
    alice = kube.impersonating_client(admin, "alice", [USERS])
    dry = {"dryRun": "All"}

    def create(api: k8s.ApiClient, body: Obj) -> Obj:
        return kube.request(api, "POST", jobs(ns), body, "application/json", dry)

    # By class, at creation: the user's normal Job, an admin's approved and urgent ones.
    assert _label(create(alice, kube.job_manifest(ns, "n", "lq"))) == "wdrf-normal"
    assert _label(create(admin, kube.job_manifest(
        ns, "a", "lq", annotations={APPROVED_ANNOTATION: "true"}))) == "wdrf-approved"
    assert _label(create(admin, kube.job_manifest(
        ns, "u", "lq", annotations={URGENT_ANNOTATION: "true"}))) == "wdrf-urgent"
    # Urgent replaces a class the Job named; a Job that names its own keeps it otherwise.
    assert _label(create(admin, kube.job_manifest(
        ns, "u2", "lq", annotations={URGENT_ANNOTATION: "true"},
        priority_class="wdrf-normal"))) == "wdrf-urgent"
    assert _label(create(admin, kube.job_manifest(
        ns, "own", "lq", priority_class="wdrf-approved"))) == "wdrf-approved"
    # Work Kueue does not queue is left alone.
    assert _label(create(alice, kube.job_manifest(ns, "plain", None))) is None
    # A CronJob's job template is stamped (its Jobs inherit it).
    cron = {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "c", "namespace": ns},
            "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {
                k: v for k, v in kube.job_manifest(ns, "c", "lq").items()
                if k in ("metadata", "spec")}}}
    cron["spec"]["jobTemplate"]["metadata"].pop("name")
    cron["spec"]["jobTemplate"]["metadata"].pop("namespace")
    got = kube.request(alice, "POST", f"/apis/batch/v1/namespaces/{ns}/cronjobs", cron,
                       "application/json", dry)
    assert got["spec"]["jobTemplate"]["metadata"]["labels"][PC_LABEL] == "wdrf-normal"

    # Nobody picks a stand-in above their class: at creation, or by relabelling later.
    for pc in ("wdrf-urgent", "wdrf-approved"):
        status, message = denial(lambda pc=pc: create(  # type: ignore[misc]
            alice, kube.job_manifest(ns, "x", "lq", priority_class=pc)))
        assert status == 403 and pc in message and "wdrf-normal" in message, message
    kube.request(alice, "POST", jobs(ns), kube.job_manifest(ns, "mine", "lq"),
                 "application/json")
    for pc in ("wdrf-urgent", "wdrf-approved"):
        status, message = denial(lambda pc=pc: kube.request(  # type: ignore[misc]
            alice, "PATCH", jobs(ns, "mine"), {"metadata": {"labels": {PC_LABEL: pc}}}))
        assert status == 403 and pc in message, message
    with pytest.raises(ApiException):  # and no higher class by the annotation either
        kube.request(alice, "PATCH", jobs(ns, "mine"),
                     {"metadata": {"annotations": {URGENT_ANNOTATION: "true"}}})
    assert _label(kube.request(alice, "GET", jobs(ns, "mine"))) == "wdrf-normal"
    wl = kube.workload_for_job(admin, ns, "mine")
    assert wl["spec"]["priorityClassRef"]["name"] == "wdrf-normal"
    assert wl["spec"]["priority"] == 0
    h.deactivate(admin, ns, wl["metadata"]["name"])  # out of later plans


@pytest.fixture
def jobset_crd(admin: k8s.ApiClient) -> Iterator[str]:
    """JobSet's CRD (as pinned by Kueue's go.mod) for the length of one test: the API server
    runs the admission policies on JobSets; no JobSet controller runs, and this plane's Kueue
    does not manage them."""
    path = go_module_dir("kueue", "sigs.k8s.io/jobset") / "config" / "components" / "crd" / \
        "bases" / "jobset.x-k8s.io_jobsets.yaml"
    crd = load_yaml_docs(path)[0]
    name = crd["metadata"]["name"]
    url = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    kube.server_side_apply(admin, url, crd, "wdrf-downtime-test")

    def established() -> bool:
        conditions = (kube.request(admin, "GET", url).get("status") or {}).get("conditions")
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in conditions or [])

    try:
        kube.wait_for(established, 60, "the JobSet CRD established")
        yield "/apis/jobset.x-k8s.io/v1alpha2"
    finally:
        kube.request(admin, "DELETE", url)

        def gone() -> bool:
            try:
                kube.request(admin, "GET", url)
            except ApiException as e:
                return e.status == 404
            return False

        kube.wait_for(gone, 60, "the JobSet CRD deleted")


def test_a_jobset_gets_its_class_stand_in_and_users_cannot_pick_a_higher_one(
    admin: k8s.ApiClient, space: str, jobset_crd: str
) -> None:
    ns = space
    path = f"{jobset_crd}/namespaces/{ns}/jobsets"
    alice = kube.impersonating_client(admin, "alice", [USERS])
    ssa(admin, kube.role("jobsets", [{"apiGroups": ["jobset.x-k8s.io"],
                                      "resources": ["jobsets"], "verbs": ["create"]}], ns))
    ssa(admin, kube.binding("jobsets", "jobsets", [kube.group(USERS)], ns, cluster_role=False))

    def jobset(labels: dict[str, str], annotations: dict[str, str] | None = None) -> Obj:
        job = kube.job_manifest(ns, "js", None)
        return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "metadata": {"name": "js", "namespace": ns,
                             "labels": {"kueue.x-k8s.io/queue-name": "lq", **labels},
                             "annotations": dict(annotations or {})},
                "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {
                    "spec": job["spec"]}}]}}

    def create(api: k8s.ApiClient, body: Obj) -> Obj:
        return kube.request(api, "POST", path, body, "application/json", {"dryRun": "All"})

    def created(api: k8s.ApiClient, body: Obj) -> Obj:
        return kube.wait_for(lambda: create(api, body), 30, "a JobSet accepted")

    assert _label(created(alice, jobset({}))) == "wdrf-normal"
    assert _label(created(admin, jobset({}, {URGENT_ANNOTATION: "true"}))) == "wdrf-urgent"
    status, message = denial(lambda: create(alice, jobset({PC_LABEL: "wdrf-urgent"})))
    assert status == 403 and "wdrf-urgent" in message, message


def _preemptions(api: k8s.ApiClient, ns: str) -> list[tuple[str, str]]:
    """(victim Workload, preemptor UID) from Kueue's own Events."""
    out = []
    for e in kube.request(api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]:
        if e.get("reason") != "Preempted" or e["involvedObject"].get("kind") != "Workload":
            continue
        m = _PREEMPTED.search(e.get("message", ""))
        assert m, e.get("message")
        out += [(e["involvedObject"]["name"], m.group(1))] * int(e.get("count") or 1)
    return out


def _effective(wl: Obj) -> int:
    ann = wl["metadata"].get("annotations") or {}
    return int(wl["spec"].get("priority") or 0) + int(ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION) or 0)


def _controller(kubeconfig: Path, identity: str, mode: str) -> LiveController:
    transport = KubeTransport.from_config(str(kubeconfig), user_agent=user_agent(identity))
    return LiveController(h.live_settings(PRIORITY_MODE=mode), transport, identity=identity)


@pytest.mark.parametrize("mode", ["boost", "spec"])
def test_urgent_preempts_written_normal_work_while_the_controller_is_down_and_its_return_changes_nothing(  # noqa: E501
    admin: k8s.ApiClient, space: str, kubeconfig: Path, plane: Plane, mode: str
) -> None:
    """A normal team fills a 3-cpu ClusterQueue that preempts by priority (LowerPriority);
    the controller writes its pending and admitted work (normal band, guards), then stops.
    An urgent Job created now is admitted by Kueue alone, preempting one normal Job; a normal
    Job created now waits (it preempts nothing). The controller returns: nothing is evicted
    because of it, and it writes only the Workloads whose state changed meanwhile (the audit
    log), the written pending ones keep their values. In spec mode the written spec.priority
    of a Workload with a stand-in stays: Kueue re-resolves a class only when its name changes."""
    # A namespace of its own under the policies (their bindings select the label).
    ns = kube.create_namespace(admin, kube.unique_name(f"down-{mode}"), {SCOPE_LABEL: space})
    cq = f"cq-{ns}"
    lq = "down"
    kube.create_cluster_queue(
        admin, cq, {"cpu": 3}, preemption={"withinClusterQueue": "LowerPriority"},
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": ns}})
    kube.create_local_queue(admin, ns, lq, cq)
    names: dict[str, str] = {}  # Job -> Workload
    try:
        for i in range(5):
            h.create_job(admin, ns, f"n-{i}", lq)
            names[f"n-{i}"] = h.job_workload(admin, ns, f"n-{i}")
            if i < 3:  # distinct creation times, the first three admitted
                kube.wait_for_workload_condition(admin, ns, names[f"n-{i}"], "QuotaReserved")
            time.sleep(1.1)

        # The controller writes what it would (pending values in the normal band, guards on
        # the admitted ones they reach), then stops.
        first = _controller(kubeconfig, f"down-first-{mode}-{ns}", mode)
        with h.started(first):
            h.converge(first)
        written = {j: kube.get_workload(admin, ns, w) for j, w in names.items()}
        for j in ("n-3", "n-4"):
            assert kube.is_pending(written[j]), kube.describe_workload(written[j])
            assert PRIORITY_TERMS_ANNOTATION in written[j]["metadata"]["annotations"]
            assert 1500 <= _effective(written[j]) < URGENT_VALUE
        guards = {_effective(written[j]) for j in ("n-0", "n-1", "n-2")}
        assert len(guards) == 1 and max(guards) < URGENT_VALUE, guards

        # Controller down: a normal and an urgent Job arrive.
        h.create_job(admin, ns, "late", lq)
        created = time.monotonic()
        h.create_job(admin, ns, "urgent", lq, annotations={URGENT_ANNOTATION: "true"})
        names["late"] = h.job_workload(admin, ns, "late")
        names["urgent"] = h.job_workload(admin, ns, "urgent")
        urgent = kube.get_workload(admin, ns, names["urgent"])
        assert urgent["spec"]["priorityClassRef"]["name"] == "wdrf-urgent"
        assert urgent["spec"]["priority"] == URGENT_VALUE
        kube.wait_for_workload_condition(admin, ns, names["urgent"], "QuotaReserved",
                                         timeout=60)
        admitted_after = time.monotonic() - created
        victims = kube.wait_for(lambda: _preemptions(admin, ns), 30, "Kueue's Preempted Event")
        assert len(victims) == 1 and victims[0][1] == urgent["metadata"]["uid"], victims
        victim = victims[0][0]
        assert victim in {names["n-0"], names["n-1"], names["n-2"]}, victims
        late = kube.get_workload(admin, ns, names["late"])
        assert kube.is_pending(late) and late["spec"]["priority"] == 0, \
            kube.describe_workload(late)
        admitted = {w["metadata"]["name"] for w in kube.list_workloads(admin, ns)
                    if kube.has_condition(w, "QuotaReserved")}
        assert admitted == {names["n-0"], names["n-1"], names["n-2"], names["urgent"]} - {
            victim}, h.dump_workloads(admin, [ns])

        # The controller returns.
        identity = f"down-back-{mode}-{ns}"
        back = _controller(kubeconfig, identity, mode)
        with h.started(back):
            report = h.converge(back)
        time.sleep(5)  # Kueue's next scheduling passes
        assert _preemptions(admin, ns) == victims, h.dump_workloads(admin, [ns])
        now_admitted = {w["metadata"]["name"] for w in kube.list_workloads(admin, ns)
                        if kube.has_condition(w, "QuotaReserved")}
        assert now_admitted == admitted, h.dump_workloads(admin, [ns])
        for j in ("n-3", "n-4"):
            wl = kube.get_workload(admin, ns, names[j])
            assert _effective(wl) == _effective(written[j]), kube.describe_workload(wl)
        # The written order stands: the pending work written before the downtime first.
        order = [d.key.split("/", 1)[1] for d in sorted(h.planned_in(report, cq),
                                                        key=lambda d: d.rank) if d.rank >= 0]
        assert order[:2] == [names["n-3"], names["n-4"]], order
        sent = {w.name for w in audit.controller_writes(plane.audit_events(
            audit.UA_PREFIX + identity)) if w.resource == "workloads" and w.namespace == ns}
        assert sent == {names["late"], victim}, sent
        print(f"\nurgent Job admitted {admitted_after:.1f} s after creation, controller down "
              f"(1 normal Workload preempted); the returning controller wrote {len(sent)} "
              f"Workloads of {len(names)}, evicted none")
    finally:
        h.cleanup(admin, [ns], [cq])
