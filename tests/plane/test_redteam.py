"""Red team on the real control plane (docs/security.md): every path of issue 13 tried by an
impersonated user, team lead, batch-admin, or with the controller's own token; each attempt is
refused (403), or has no effect on the order Kueue actually sees.

The manifests are installed as shipped (with the usage-history component); the class policy's
and the submitter stamp's bindings are scoped to namespaces labelled SCOPE_LABEL (as in
test_manifests_plane.py), the params guard and the controller-writes policy apply as shipped.
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.domain import URGENT_ANNOTATION
from controller.live.kube import KubeTransport
from controller.live.metrics import Health, Metrics
from controller.live.secure_metrics import SecureMetricsServer, TokenAuthorizer, tls_context
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.kube import denial
from tests.support.manifests import (
    LEAD_PREFIX,
    NS,
    SA,
    SCOPE_LABEL,
    install_manifests,
    sa_kubeconfig,
    ssa,
)
from tests.support.plane import Plane

pytestmark = pytest.mark.plane

Obj = dict[str, Any]
USERS = "wdrf-redteam:users"
BATCH_ADMINS = "wdrf-redteam:batch-admins"
APPROVED = "wdrf.x-k8s.io/approved"
URGENT = URGENT_ANNOTATION
OVERRIDE = "wdrf.x-k8s.io/priority-override"
SUBMITTER = "wdrf.x-k8s.io/submitted-by"
TERMS = "wdrf.x-k8s.io/priority-terms"
BOOST = "kueue.x-k8s.io/priority-boost"
PC_LABEL = "kueue.x-k8s.io/priority-class"
TEAM = "wdrf.x-k8s.io/team"
PARAMS = f"/api/v1/namespaces/{NS}/configmaps/wdrf-admission-params"
KUEUE_USER = f"system:serviceaccount:{NS}:kueue-controller-manager"
CRONJOB_CONTROLLER = "system:serviceaccount:kube-system:cronjob-controller"


def jobs(ns: str, name: str = "", sub: str = "") -> str:
    return f"/apis/batch/v1/namespaces/{ns}/jobs" + (f"/{name}" if name else "") + \
        (f"/{sub}" if sub else "")


def cronjobs(ns: str, name: str = "") -> str:
    return f"/apis/batch/v1/namespaces/{ns}/cronjobs" + (f"/{name}" if name else "")


def post(api: k8s.ApiClient, path: str, body: Obj) -> Obj:
    return kube.request(api, "POST", path, body, "application/json")


def patch(api: k8s.ApiClient, path: str, body: Obj) -> Obj:
    return kube.request(api, "PATCH", path, body)


def refused(call: Any, *needles: str) -> str:
    """`call` is answered 403 and the message names every needle."""
    status, message = denial(call)
    assert status == 403, (status, message)
    for n in needles:
        assert n in message, (n, message)
    return message


def name(prefix: str = "j") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def installed(admin: k8s.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return install_manifests(admin, tmp_path_factory.mktemp("kustomize"))


def _editor_rbac(admin: k8s.ApiClient, ns: str) -> None:
    ssa(admin, kube.binding("redteam-editor", "wdrf-redteam-editor", [kube.group(USERS)], ns))


@pytest.fixture(scope="module")
def spaces(admin: k8s.ApiClient, installed: list[Obj], suffix: str) -> Iterator[tuple[str, str]]:
    """Two team namespaces under the policy (users may edit Jobs, CronJobs, Workloads, pods
    and LocalQueues there) with a LocalQueue each; waits until the policy is enforced."""
    ssa(admin, kube.role("wdrf-redteam-editor", [
        {"apiGroups": ["batch"], "resources": ["jobs", "jobs/status", "cronjobs"],
         "verbs": ["get", "list", "create", "update", "patch"]},
        {"apiGroups": ["kueue.x-k8s.io"],
         "resources": ["workloads", "workloads/status", "localqueues"],
         "verbs": ["get", "list", "create", "update", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "update", "patch"]},
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"],
         "verbs": ["get", "create", "update", "patch"]}]))
    # Kueue's batch-admin can patch every Workload (S3): emulated with the same verbs.
    ssa(admin, kube.binding("wdrf-redteam-batch-admins", "wdrf-redteam-editor", [
        kube.group(BATCH_ADMINS), kube.service_account("kueue-controller-manager", NS)]))
    out = []
    cqs = []
    for prefix in ("rta", "rtb"):
        ns = kube.create_namespace(admin, f"{prefix}-{suffix}", {SCOPE_LABEL: suffix})
        _editor_rbac(admin, ns)
        cq, _lq = kube.create_queues(admin, ns, {"cpu": "1"})
        cqs.append(cq)
        out.append(ns)
    alice = kube.impersonating_client(admin, "alice", [USERS])
    probe = kube.job_manifest(out[0], "probe", None, annotations={URGENT: "true"})

    def enforced() -> bool:
        try:
            kube.request(alice, "POST", jobs(out[0]), probe, "application/json",
                         {"dryRun": "All"})
        except ApiException as e:
            return URGENT in str(e.body)
        return False

    kube.wait_for(enforced, 60, "the admission policy to be enforced")
    yield out[0], out[1]
    h.cleanup(admin, out, cqs)


@pytest.fixture(scope="module")
def people(admin: k8s.ApiClient, spaces: tuple[str, str]) -> Iterator[dict[str, k8s.ApiClient]]:
    a, b = spaces
    clients = {
        "alice": kube.impersonating_client(admin, "alice", [USERS]),
        "bob": kube.impersonating_client(admin, "bob", [USERS]),
        "lena": kube.impersonating_client(admin, "lena", [USERS, LEAD_PREFIX + a]),  # leads a
        "leo": kube.impersonating_client(admin, "leo", [USERS, LEAD_PREFIX + b]),  # leads b
        "bart": kube.impersonating_client(admin, "bart", [BATCH_ADMINS]),
        "adam": kube.impersonating_client(admin, "adam", [USERS, "wdrf:admins"]),
        "kueue": kube.impersonating_client(admin, KUEUE_USER, ["system:serviceaccounts"]),
        "cronjob-controller": kube.impersonating_client(
            admin, CRONJOB_CONTROLLER, ["system:serviceaccounts"]),
    }
    yield clients
    for c in clients.values():
        c.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def controller(admin: k8s.ApiClient, installed: list[Obj]) -> k8s.ApiClient:
    """The controller's own ServiceAccount token: what a thief would hold."""
    return kube.token_client(admin, kube.service_account_token(admin, NS, SA))


@pytest.fixture(scope="module")
def wpc(admin: k8s.ApiClient, suffix: str) -> str:
    """A WorkloadPriorityClass worth 2,000,000 (issue 13's S1 number) and a PriorityClass of
    the same name."""
    n = f"rt-top-{suffix}"
    post(admin, kube.kueue_path("workloadpriorityclasses"),
         {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
          "metadata": {"name": n}, "value": 2_000_000})
    post(admin, "/apis/scheduling.k8s.io/v1/priorityclasses",
         {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
          "metadata": {"name": n}, "value": 2_000_000})
    return n


@contextlib.contextmanager
def params_changed(admin: k8s.ApiClient, alice: k8s.ApiClient, ns: str, data: dict[str, str],
                   takes_effect: Any) -> Iterator[None]:
    """Patch wdrf-admission-params, wait for `takes_effect()`, restore afterwards."""
    old = kube.request(admin, "GET", PARAMS)["data"]
    patch(admin, PARAMS, {"data": data})
    try:
        kube.wait_for(takes_effect, 30, f"params {data} in effect")
        yield
    finally:
        patch(admin, PARAMS, {"data": {k: old.get(k, "") for k in data}})


# ---------------------------------------------------------------------------------------------
# S1 / S3: the base priority


def test_s1_users_cannot_choose_a_priority_class(
        spaces: tuple[str, str], people: dict[str, k8s.ApiClient], wpc: str,
        admin: k8s.ApiClient) -> None:
    ns, _ = spaces
    alice = people["alice"]
    # Kueue label on a Job, pod priorityClassName on a Job, on a Kueue-managed pod.
    body = kube.job_manifest(ns, name(), "lq", priority_class=wpc)
    refused(lambda: post(alice, jobs(ns), body), f"{PC_LABEL}={wpc} is not an allowed",
            "user alice")
    body = kube.job_manifest(ns, name(), "lq")
    body["spec"]["template"]["spec"]["priorityClassName"] = wpc
    refused(lambda: post(alice, jobs(ns), body), f"priorityClassName {wpc} is not an allowed")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name("p"), "namespace": ns,
                        "labels": {"kueue.x-k8s.io/queue-name": "lq", PC_LABEL: wpc}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    refused(lambda: post(alice, f"/api/v1/namespaces/{ns}/pods", pod), PC_LABEL)
    # Adding the label to an existing (suspended) Job.
    n = name()
    post(alice, jobs(ns), kube.job_manifest(ns, n, None))
    refused(lambda: patch(alice, jobs(ns, n), {"metadata": {"labels": {PC_LABEL: wpc}}}),
            PC_LABEL)
    # A Workload made by hand with a high spec.priority or class.
    wl = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
          "metadata": {"name": name("w"), "namespace": ns},
          "spec": {"queueName": "lq", "priority": 2_000_000, "podSets": [
              {"name": "main", "count": 1, "template": {"spec": {"restartPolicy": "Never",
               "containers": [{"name": "c", "image": "busybox",
                               "resources": {"requests": {"cpu": "1"}}}]}}}]}}
    refused(lambda: post(alice, kube.kueue_path("workloads", namespace=ns), wl),
            "spec.priority of a Workload")
    # With the class on the allow-list, anyone may use it; admins always may.
    probe = kube.job_manifest(ns, name(), None, priority_class=wpc)

    def allowed() -> bool:
        try:
            kube.request(alice, "POST", jobs(ns), probe, "application/json", {"dryRun": "All"})
        except ApiException:
            return False
        return True

    with params_changed(admin, alice, ns, {"allowedPriorityClasses": f"low,{wpc}"}, allowed):
        post(alice, jobs(ns), kube.job_manifest(ns, name(), None, priority_class=wpc))
    post(people["adam"], jobs(ns), kube.job_manifest(ns, name(), None, priority_class=wpc))


def test_s1_pod_templates_of_kueue_managed_deployments_are_guarded_too(
        spaces: tuple[str, str], people: dict[str, k8s.ApiClient], wpc: str,
        admin: k8s.ApiClient) -> None:
    """Kueue's pod-based integrations: the template decides the pods' class. The ReplicaSet
    controller creating the pods is exempt (it copies a guarded template)."""
    ns, _ = spaces
    alice = people["alice"]

    def deployment(labels: dict[str, str], pcn: str = "") -> Obj:
        spec: Obj = {"containers": [{"name": "c", "image": "busybox"}]}
        if pcn:
            spec["priorityClassName"] = pcn
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name("d"), "namespace": ns,
                             "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "x"}},
                         "template": {"metadata": {"labels": {"app": "x", **labels}},
                                      "spec": spec}}}

    deploys = f"/apis/apps/v1/namespaces/{ns}/deployments"
    refused(lambda: post(alice, deploys, deployment({PC_LABEL: wpc})),
            f"pod template label {PC_LABEL}={wpc}")
    refused(lambda: post(alice, deploys, deployment({}, wpc)), f"priorityClassName {wpc}")
    refused(lambda: post(alice, deploys, deployment({TEAM: "fresh"})), "team label")
    post(alice, deploys, deployment({}))
    rs = kube.impersonating_client(admin, "system:serviceaccount:kube-system:"
                                   "replicaset-controller", ["system:serviceaccounts"])
    ssa(admin, kube.binding("redteam-rs", "wdrf-redteam-editor",
                            [kube.service_account("replicaset-controller", "kube-system")], ns))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name("p"), "namespace": ns,
                        "labels": {"kueue.x-k8s.io/queue-name": "lq", PC_LABEL: wpc}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    post(rs, f"/api/v1/namespaces/{ns}/pods", pod)


@pytest.mark.parametrize("mode", ["boost", "spec"])
def test_s1_s3_a_two_million_base_does_not_outrank_urgent_in_kueues_order(
        admin: k8s.ApiClient, plane: Plane, people: dict[str, k8s.ApiClient], wpc: str,
        suffix: str, mode: str, installed: list[Obj]) -> None:
    """A normal Job whose WorkloadPriorityClass is worth 2,000,000 (set by someone allowed to,
    or before the policy) and an urgent Job wait behind a full ClusterQueue. After the
    controller's cycles, Kueue admits the urgent one first when a slot frees; in spec mode a
    batch-admin cannot raise spec.priority (403) and an admin's raise is not adopted beyond
    BASE_PRIORITY_CAP."""
    ns = kube.create_namespace(admin, f"rto-{mode}-{suffix}", {SCOPE_LABEL: suffix})
    cq, lq = kube.create_queues(admin, ns, {"cpu": "1"})
    try:
        h.create_job(admin, ns, "blocker", lq)
        blocker = h.job_workload(admin, ns, "blocker")
        kube.wait_for_workload_condition(admin, ns, blocker, "QuotaReserved")
        h.create_job(admin, ns, "big-base", lq, priority_class=wpc)
        big = h.job_workload(admin, ns, "big-base")
        h.create_job(admin, ns, "urgent", lq, annotations={URGENT: "true"})
        urgent = h.job_workload(admin, ns, "urgent")
        assert kube.get_workload(admin, ns, big)["spec"]["priority"] == 2_000_000

        def effective(wl_name: str) -> int:
            wl = kube.get_workload(admin, ns, wl_name)
            ann = wl["metadata"].get("annotations") or {}
            return int(wl["spec"].get("priority") or 0) + int(ann.get(BOOST, 0))

        c = h.new_controller(plane.kubeconfig, h.live_settings(PRIORITY_MODE=mode))
        with h.started(c):
            h.converge(c)
            assert effective(urgent) > effective(big), (effective(urgent), effective(big))
            if mode == "spec":
                # S3: Kueue's batch-admin may patch Workloads, but not their priority.
                refused(lambda: kube.set_priority(people["bart"], ns, big, 3_000_000),
                        "spec.priority of a Workload", "user bart")
                # An admin's (or Kueue's WorkloadPriorityClass controller's) new value is
                # taken as the new base, but counts at most BASE_PRIORITY_CAP.
                kube.set_priority(admin, ns, big, 3_000_000)

                def capped() -> bool:
                    c.run_cycle()
                    return effective(urgent) > effective(big)

                kube.wait_for(capped, 20, "the raised spec.priority to be capped",
                              interval=0.5)
                h.converge(c)
                assert effective(urgent) > effective(big), (effective(urgent), effective(big))
            h.release(admin, ns, blocker)
            got = h.next_admitted(admin, {f"{ns}/{big}": ns, f"{ns}/{urgent}": ns})
            assert got == f"{ns}/{urgent}", got
    finally:
        h.cleanup(admin, [ns], [cq])


# ---------------------------------------------------------------------------------------------
# S2 / S6: team identity and team leads


def test_s2_team_label_and_local_queues_only_by_the_namespaces_lead(
        admin: k8s.ApiClient, spaces: tuple[str, str], people: dict[str, k8s.ApiClient]) -> None:
    a, _b = spaces
    alice, lena, leo = people["alice"], people["lena"], people["leo"]
    body = kube.job_manifest(a, name(), None, labels={TEAM: "fresh-team"})
    refused(lambda: post(alice, jobs(a), body), f"team label {TEAM}", f"namespace {a}")
    n = name()
    post(alice, jobs(a), kube.job_manifest(a, n, None))
    refused(lambda: patch(alice, jobs(a, n), {"metadata": {"labels": {TEAM: "x"}}}), TEAM)
    refused(lambda: patch(leo, jobs(a, n), {"metadata": {"labels": {TEAM: "x"}}}), "user leo")
    patch(lena, jobs(a, n), {"metadata": {"labels": {TEAM: "vision"}}})
    # A Workload's team label: same rule.
    w = name()
    post(alice, jobs(a), kube.job_manifest(a, w, "lq", requests={"cpu": "4"}))
    wl = kube.workload_for_job(admin, a, w)["metadata"]["name"]
    refused(lambda: kube.patch_workload(alice, a, wl, {"metadata": {"labels": {TEAM: "x"}}}),
            f"team label {TEAM}", "user alice")
    kube.patch_workload(lena, a, wl, {"metadata": {"labels": {TEAM: "vision"}}})
    # guardLocalQueues (TEAM_SOURCE=localqueue): only the lead creates LocalQueues.
    lq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
          "metadata": {"name": name("lq"), "namespace": a}, "spec": {"clusterQueue": "x"}}
    lq_path = kube.kueue_path("localqueues", namespace=a)

    def guarded() -> bool:
        try:
            kube.request(alice, "POST", lq_path, lq, "application/json", {"dryRun": "All"})
        except ApiException as e:
            return "guardLocalQueues" in str(e.body)
        return False

    with params_changed(admin, alice, a, {"guardLocalQueues": "true"}, guarded):
        refused(lambda: post(alice, lq_path, lq), "LocalQueues are teams here", "user alice")
        refused(lambda: post(leo, lq_path, lq), "user leo")
        post(lena, lq_path, lq)


def test_s6_leads_approve_only_their_namespaces_and_never_their_own_work(
        admin: k8s.ApiClient, spaces: tuple[str, str], people: dict[str, k8s.ApiClient]) -> None:
    a, b = spaces
    alice, lena, leo = people["alice"], people["lena"], people["leo"]
    n = name()
    post(alice, jobs(a), kube.job_manifest(a, n, None))
    # The MutatingAdmissionPolicy recorded the submitter; nobody can forge or change it.
    assert kube.get_job(admin, a, n)["metadata"]["annotations"][SUBMITTER] == "alice"
    forged = kube.job_manifest(a, name(), None, annotations={SUBMITTER: "lena"})
    assert post(alice, jobs(a), forged)["metadata"]["annotations"][SUBMITTER] == "alice"
    refused(lambda: patch(alice, jobs(a, n), {"metadata": {"annotations": {SUBMITTER: "x"}}}),
            SUBMITTER)
    # Another namespace's lead may not approve; this namespace's lead may.
    refused(lambda: patch(leo, jobs(a, n), {"metadata": {"annotations": {APPROVED: "true"}}}),
            f"lead of namespace {a}", "user leo")
    patch(lena, jobs(a, n), {"metadata": {"annotations": {APPROVED: "true"}}})
    # A lead's own Job: not when created approved, not later.
    own = kube.job_manifest(a, name(), None, annotations={APPROVED: "true"})
    refused(lambda: post(lena, jobs(a), own), "may not approve their own work")
    m = name()
    post(lena, jobs(a), kube.job_manifest(a, m, None))
    refused(lambda: patch(lena, jobs(a, m), {"metadata": {"annotations": {APPROVED: "true"}}}),
            "lena may not approve their own work")
    # ... unless the admins allow it.
    probe = name()
    post(lena, jobs(a), kube.job_manifest(a, probe, None))

    def self_approval_allowed() -> bool:
        try:
            kube.request(lena, "PATCH", jobs(a, probe),
                         {"metadata": {"annotations": {APPROVED: "true"}}},
                         query={"dryRun": "All"})
        except ApiException:
            return False
        return True

    with params_changed(admin, alice, a, {"allowSelfApproval": "true"}, self_approval_allowed):
        patch(lena, jobs(a, m), {"metadata": {"annotations": {APPROVED: "true"}}})
    # Leads approve Jobs, not a Job's Workload (whose submitter the policy cannot see).
    _, lq = "", "lq"
    w = name()
    post(alice, jobs(a), kube.job_manifest(a, w, lq, requests={"cpu": "4"}))
    wl = kube.workload_for_job(admin, a, w)["metadata"]["name"]
    refused(lambda: patch(lena, kube.kueue_path("workloads", wl, a),
                          {"metadata": {"annotations": {APPROVED: "true"}}}),
            "team leads approve the Job itself")
    # The same lead in the other namespace: no.
    n_b = name()
    post(alice, jobs(b), kube.job_manifest(b, n_b, None))
    refused(lambda: patch(lena, jobs(b, n_b), {"metadata": {"annotations": {APPROVED: "true"}}}),
            f"lead of namespace {b}")


def test_s6_an_approval_does_not_survive_growth(
        spaces: tuple[str, str], people: dict[str, k8s.ApiClient]) -> None:
    a, _ = spaces
    alice, lena = people["alice"], people["lena"]
    n = name()
    post(alice, jobs(a), kube.job_manifest(a, n, None, requests={"cpu": "1"}))
    patch(lena, jobs(a, n), {"metadata": {"annotations": {APPROVED: "true"}}})
    refused(lambda: patch(alice, jobs(a, n), {"spec": {"parallelism": 4}}),
            "approved", "for the size it had")
    bigger = {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "resources": {"requests": {"cpu": "8"}}}]}}}}
    refused(lambda: kube.request(alice, "PATCH", jobs(a, n), bigger,
                                 "application/strategic-merge-patch+json"),
            "for the size it had")
    # Growing while dropping the approval is fine; so is a lead's re-approval of a bigger Job.
    out = patch(alice, jobs(a, n), {"metadata": {"annotations": {APPROVED: None}},
                                    "spec": {"parallelism": 2}})
    assert APPROVED not in out["metadata"]["annotations"]
    patch(lena, jobs(a, n), {"metadata": {"annotations": {APPROVED: "true"}}})
    patch(lena, jobs(a, n), {"spec": {"parallelism": 3}})


# ---------------------------------------------------------------------------------------------
# S4 / S9: other ways in


def test_s4_job_status_subresource_is_guarded_and_workload_status_drops_metadata(
        admin: k8s.ApiClient, spaces: tuple[str, str], people: dict[str, k8s.ApiClient]) -> None:
    a, _ = spaces
    alice, bart = people["alice"], people["bart"]
    n = name()
    post(alice, jobs(a), kube.job_manifest(a, n, "lq", requests={"cpu": "4"}))
    refused(lambda: patch(alice, jobs(a, n, "status"),
                          {"metadata": {"annotations": {URGENT: "true"}}}), URGENT)
    refused(lambda: patch(alice, jobs(a, n, "status"),
                          {"metadata": {"labels": {PC_LABEL: "x"}}}), PC_LABEL)
    # Workloads are a CRD: its status subresource keeps the old metadata (nothing persists).
    wl = kube.workload_for_job(admin, a, n)["metadata"]["name"]
    out = kube.patch_workload(bart, a, wl, {"metadata": {"annotations": {URGENT: "true"}}},
                              subresource="status")
    assert URGENT not in (out["metadata"].get("annotations") or {})
    assert URGENT not in (kube.get_workload(admin, a, wl)["metadata"].get("annotations") or {})


def test_s9_cronjobs_carry_only_what_their_author_may_and_their_jobs_inherit_it(
        admin: k8s.ApiClient, spaces: tuple[str, str], people: dict[str, k8s.ApiClient],
        wpc: str) -> None:
    a, _ = spaces
    alice, adam = people["alice"], people["adam"]

    def cron(n: str, annotations: dict[str, str], labels: dict[str, str] | None = None) -> Obj:
        job = kube.job_manifest(a, n, "lq", annotations=annotations, labels=labels)
        return {"apiVersion": "batch/v1", "kind": "CronJob",
                "metadata": {"name": n, "namespace": a},
                "spec": {"schedule": "0 3 * * *", "jobTemplate": {
                    "metadata": job["metadata"] | {"name": None, "namespace": None},
                    "spec": job["spec"]}}}

    def clean(o: Obj) -> Obj:
        md = o["spec"]["jobTemplate"]["metadata"]
        for k in ("name", "namespace"):
            md.pop(k, None)
        return o

    refused(lambda: post(alice, cronjobs(a), clean(cron(name("c"), {URGENT: "true"}))), URGENT)
    refused(lambda: post(alice, cronjobs(a), clean(cron(name("c"), {}, {PC_LABEL: wpc}))),
            PC_LABEL)
    n = name("c")
    post(alice, cronjobs(a), clean(cron(n, {})))
    refused(lambda: patch(alice, cronjobs(a, n), {"spec": {"jobTemplate": {"metadata": {
        "annotations": {APPROVED: "true"}}}}}), APPROVED)
    # An admin's urgent CronJob: the submitter is stamped into the template too.
    u = name("c")
    made = post(adam, cronjobs(a), clean(cron(u, {URGENT: "true"})))
    tmpl = made["spec"]["jobTemplate"]["metadata"]["annotations"]
    assert tmpl[URGENT] == "true" and tmpl[SUBMITTER] == "adam"
    # The CronJob controller creates the Job from that template: allowed, submitter kept.
    job = kube.job_manifest(a, f"{u}-29000000", "lq")
    job["metadata"]["annotations"] = dict(tmpl)
    job["metadata"]["ownerReferences"] = [{
        "apiVersion": "batch/v1", "kind": "CronJob", "name": u,
        "uid": made["metadata"]["uid"], "controller": True}]
    created = post(people["cronjob-controller"], jobs(a), job)
    assert created["metadata"]["annotations"][SUBMITTER] == "adam"
    assert created["metadata"]["annotations"][URGENT] == "true"
    # The same Job made by alice herself is refused.
    copy_ = kube.job_manifest(a, name(), "lq", annotations={URGENT: "true"})
    refused(lambda: post(alice, jobs(a), copy_), URGENT)


def test_s10_forged_controller_annotations_are_refused(
        admin: k8s.ApiClient, spaces: tuple[str, str], people: dict[str, k8s.ApiClient]) -> None:
    """Found here: the controller reads wdrf.x-k8s.io/priority-terms back (fairness-level
    hysteresis); a batch-admin forging it, or any other wdrf.x-k8s.io/ key of the controller's,
    is refused like base-priority and priority-boost."""
    a, _ = spaces
    n = name()
    post(people["alice"], jobs(a), kube.job_manifest(a, n, "lq", requests={"cpu": "4"}))
    wl = kube.workload_for_job(admin, a, n)["metadata"]["name"]
    for key, value in ((TERMS, "pool=x team=y level=50/50 "), (BOOST, "900000"),
                       ("wdrf.x-k8s.io/base-priority", "5"),
                       ("wdrf.x-k8s.io/anything-new", "1")):
        refused(lambda key=key, value=value: kube.patch_workload(
            people["bart"], a, wl, {"metadata": {"annotations": {key: value}}}),
            "written by the WDRF controller", "user bart")
    # Kueue's own writes are never blocked (exempt in the policy, not only in the params).
    kube.patch_workload(people["kueue"], a, wl, {"metadata": {"annotations": {URGENT: "true"}}})


# ---------------------------------------------------------------------------------------------
# S5: a stolen controller token


def test_s5_stolen_controller_token_cannot_touch_pods_beyond_hami_on_gated_pods(
        admin: k8s.ApiClient, controller: k8s.ApiClient, suffix: str) -> None:
    ns = kube.create_namespace(admin, f"rtp-{suffix}")
    victim = post(admin, "/api/v1/namespaces/kube-system/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"victim-{suffix}", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
    vpath = f"/api/v1/namespaces/kube-system/pods/{victim['metadata']['name']}"
    try:
        bad = {"spec": {"containers": [{"name": "c", "image": "evil.example/miner:1"}]}}
        refused(lambda: kube.request(controller, "PATCH", vpath, bad,
                                     "application/strategic-merge-patch+json"),
                "wdrf-controller-writes")
        refused(lambda: patch(controller, vpath, {"metadata": {
            "annotations": {"hami.io/node-scheduler-policy": "spread"}}}), "gated by Kueue")
        gated = post(admin, f"/api/v1/namespaces/{ns}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gated", "namespace": ns},
            "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
        gpath = f"/api/v1/namespaces/{ns}/pods/{gated['metadata']['name']}"
        for body in ({"metadata": {"annotations": {"other": "x"}}},
                     {"metadata": {"labels": {"x": "y"}}},
                     {"metadata": {"finalizers": ["example.com/block"]}},
                     {"spec": {"schedulingGates": None}}):
            refused(lambda body=body: patch(controller, gpath, body),
                    "wdrf-controller-writes")
        out = patch(controller, gpath, {"metadata": {"annotations": {
            "hami.io/node-scheduler-policy": "binpack", "hami.io/gpu-scheduler-policy": "spread"}}})
        assert out["metadata"]["annotations"]["hami.io/gpu-scheduler-policy"] == "spread"
    finally:
        with contextlib.suppress(ApiException):
            kube.request(admin, "DELETE", vpath)


def test_s5_stolen_controller_token_on_jobs_and_workloads_only_what_the_controller_writes(
        admin: k8s.ApiClient, controller: k8s.ApiClient, spaces: tuple[str, str]) -> None:
    a, _ = spaces
    n = name()
    kube.create_job(admin, a, n, "lq", requests={
        "cpu": "4", "nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"})
    path = jobs(a, n)
    for body in ({"spec": {"suspend": False}},  # start it, bypassing Kueue
                 {"spec": {"parallelism": 5}},
                 {"metadata": {"annotations": {URGENT: "true"}}},
                 {"metadata": {"labels": {PC_LABEL: "x"}}},
                 {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}},
                 {"spec": {"template": {"metadata": {"annotations": {"other": "x"}}}}},
                 {"spec": {"template": {"spec": {"nodeSelector": {"x": "y"}}}}}):
        refused(lambda body=body: patch(controller, path, body),
                "wdrf-controller-writes")
    steal = {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "resources": {"requests": {"cpu": "64"}}}]}}}}
    refused(lambda: kube.request(controller, "PATCH", path, steal,
                                 "application/strategic-merge-patch+json"),
            "wdrf-controller-writes")
    # What the controller does write goes through.
    patch(controller, path, {"spec": {"template": {"metadata": {"annotations": {
        "hami.io/node-scheduler-policy": "binpack"}}}}})
    frac = {"spec": {"template": {"spec": {"containers": [{"name": "main", "resources": {
        "requests": {"nvidia.com/gpucores": "50"}, "limits": {"nvidia.com/gpucores": "50"}}}]}}}}
    kube.request(controller, "PATCH", path, frac, "application/strategic-merge-patch+json")
    wl = kube.workload_for_job(admin, a, n)["metadata"]["name"]
    wl_bodies: list[Obj] = [{"spec": {"active": False}},  # hold someone else's work
                             {"spec": {"queueName": "elsewhere"}},
                             {"metadata": {"annotations": {URGENT: "true"}}},
                             {"metadata": {"annotations": {OVERRIDE: "1"}}},
                             {"metadata": {"labels": {"x": "y"}}}]
    for body in wl_bodies:
        refused(lambda body=body: kube.patch_workload(
            controller, a, wl, body), "wdrf-controller-writes")
    kube.patch_workload(controller, a, wl, {"metadata": {"annotations": {BOOST: "7"}},
                                            "spec": {"priority": 3}})


def test_s5_stolen_controller_token_in_kueue_system(
        admin: k8s.ApiClient, controller: k8s.ApiClient) -> None:
    c = controller
    cms = f"/api/v1/namespaces/{NS}/configmaps"
    # The admission params: neither read nor written (RBAC names its objects).
    refused(lambda: kube.request(c, "GET", PARAMS))
    refused(lambda: patch(c, PARAMS, {"data": {"adminGroups": "system:authenticated"}}))
    refused(lambda: kube.request(c, "PUT", f"{cms}/kueue-manager-config", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kueue-manager-config", "namespace": NS}}))
    refused(lambda: kube.request(c, "GET", f"/api/v1/namespaces/{NS}/secrets"))
    kube.request(c, "GET", f"{cms}/kueue-manager-config")  # read: the PriorityBoost gate
    # Creating: only its own Lease and history ConfigMap (dry run: admission runs).
    dry = {"dryRun": "All"}
    refused(lambda: kube.request(c, "POST", cms, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "wdrf-admission-params-2", "namespace": NS}},
        "application/json", dry), "only create its usage history")
    kube.request(c, "POST", cms, {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "wdrf-usage-history", "namespace": NS}},
                 "application/json", dry) if not _exists(admin, f"{cms}/wdrf-usage-history") \
        else None
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    refused(lambda: kube.request(c, "POST", leases, {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kueue-leader-x", "namespace": NS}}, "application/json", dry),
        "only create its own Lease")
    post(admin, leases, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": f"other-{uuid.uuid4().hex[:5]}", "namespace": NS}})
    other = next(x for x in kube.request(admin, "GET", leases)["items"]
                 if x["metadata"]["name"].startswith("other-"))
    refused(lambda: kube.request(c, "PUT", f"{leases}/{other['metadata']['name']}", other))
    refused(lambda: kube.request(c, "DELETE", f"{leases}/{other['metadata']['name']}"))
    # Events: only in its own name (not as the kubelet or Kueue).
    event = {"apiVersion": "v1", "kind": "Event",
             "metadata": {"generateName": "x.", "namespace": "default"},
             "involvedObject": {"kind": "Node", "name": "n1", "apiVersion": "v1"},
             "reason": "NodeNotReady", "message": "forged", "type": "Warning",
             "source": {"component": "kubelet"}, "reportingComponent": "kubelet",
             "reportingInstance": "n1", "firstTimestamp": "2026-01-01T00:00:00Z",
             "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1}
    events = "/api/v1/namespaces/default/events"
    refused(lambda: kube.request(c, "POST", events, event, "application/json", dry),
            "reported by wdrf-controller")
    own = event | {"source": {"component": "wdrf-controller"},
                   "reportingComponent": "wdrf-controller"}
    kube.request(c, "POST", events, own, "application/json", dry)


def _exists(api: k8s.ApiClient, path: str) -> bool:
    try:
        kube.request(api, "GET", path)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


# ---------------------------------------------------------------------------------------------
# S7: the params ConfigMap's failure modes


def configmap_editor(admin: k8s.ApiClient) -> k8s.ApiClient:
    """opal: may edit ConfigMaps in kueue-system, and is no WDRF admin."""
    ssa(admin, kube.role("redteam-cm-editor", [
        {"apiGroups": [""], "resources": ["configmaps"],
         "verbs": ["get", "create", "update", "patch", "delete"]}], NS))
    ssa(admin, kube.binding("redteam-cm-editor", "redteam-cm-editor", [kube.user("opal")], NS,
                            cluster_role=False))
    opal = kube.impersonating_client(admin, "opal", [])
    return opal


def test_s7_params_are_guarded_and_their_absence_locks_out_neither_kueue_nor_the_controller(
        admin: k8s.ApiClient, spaces: tuple[str, str], people: dict[str, k8s.ApiClient],
        controller: k8s.ApiClient) -> None:
    a, _ = spaces
    # Someone who may edit ConfigMaps in kueue-system but is not a WDRF admin.
    opal = configmap_editor(admin)
    refused(lambda: patch(opal, PARAMS, {"data": {"adminGroups": "system:authenticated"}}),
            "only members of its adminGroups", "user opal")
    refused(lambda: kube.request(opal, "DELETE", PARAMS), "user opal")
    # Not even an admin may open it to everyone.
    for data in ({"adminGroups": "wdrf:admins,system:authenticated"},
                 {"teamLeadGroups": "system:serviceaccounts"},
                 {"teamLeadScopes": "system:authenticated=*"},
                 {"teamLeadGroupPrefix": "system:serviceaccounts:"}):
        status, message = denial(lambda data=data: patch(admin, PARAMS,  # type: ignore[misc]
                                                         {"data": data}))
        assert status in (403, 422) and "everyone" in message, (data, status, message)
    # Deleted by an admin: Kueue still makes Workloads and the controller still writes.
    saved = kube.request(admin, "GET", PARAMS)
    alice = people["alice"]
    probe = kube.job_manifest(a, name(), None, annotations={URGENT: "true"})

    def params_gone() -> bool:  # the policy has no params: it does not run (documented)
        try:
            kube.request(alice, "POST", jobs(a), probe, "application/json", {"dryRun": "All"})
        except ApiException:
            return False
        return True

    kube.request(admin, "DELETE", PARAMS)
    try:
        kube.wait_for(params_gone, 30, "the apiserver to see the params deleted")
        n = name()
        kube.create_job(admin, a, n, "lq", requests={"cpu": "4"},
                        annotations={APPROVED: "true"})
        wl = kube.workload_for_job(admin, a, n)["metadata"]["name"]  # Kueue created it
        kube.patch_workload(people["kueue"], a, wl, {"metadata": {"annotations": {
            "kueue.x-k8s.io/test": "1"}}})
        kube.set_priority_boost(controller, a, wl, 11)
        kube.set_priority(controller, a, wl, 12)
    finally:
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "wdrf-admission-params", "namespace": NS},
                "data": saved["data"]}
        post(admin, f"/api/v1/namespaces/{NS}/configmaps", body)
    kube.wait_for(lambda: not params_gone(), 30, "the params back in force")


# ---------------------------------------------------------------------------------------------
# S8: metrics over HTTPS with TokenReview + SubjectAccessReview; health apart


def test_s8_metrics_refused_without_a_token_served_with_one(
        admin: k8s.ApiClient, plane: Plane, installed: list[Obj], tmp_path: Path) -> None:
    # The controller's identity reviews tokens (system:auth-delegator, as the secure-metrics
    # component grants); a scraper is bound to the metrics-reader ClusterRole.
    ssa(admin, kube.binding("wdrf-redteam-auth-delegator", "system:auth-delegator",
                            [kube.service_account(SA, NS)]))
    reader = next(o for o in installed if o["kind"] == "ClusterRole"
                  and o["metadata"]["name"] == "wdrf-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    ssa(admin, kube.binding("wdrf-redteam-metrics-reader", "wdrf-metrics-reader",
                            [kube.service_account("prometheus", NS)]))
    scraper = kube.service_account_token(admin, NS, "prometheus")
    stranger = kube.service_account_token(admin, NS, "stranger")
    sa_token = kube.service_account_token(admin, NS, SA)
    # as the running controller builds it: its own field manager goes on every POST, the
    # reviews included, and the apiserver must take it there too
    name = "wdrf-controller/wdrf-controller-7d9f-redteam"
    transport = KubeTransport.from_config(
        str(sa_kubeconfig(plane, sa_token, tmp_path / "sa-kubeconfig")),
        user_agent=name, field_manager=name)
    metrics, health = Metrics(), Health(stale_after=60)
    metrics.is_leader.set(1)
    tls = tls_context(str(plane.pki.serving_crt), str(plane.pki.serving_key))
    server = SecureMetricsServer(metrics, health, TokenAuthorizer(transport), tls, 0, 0,
                                 host="127.0.0.1")
    server.start()
    ctx = ssl.create_default_context(cafile=str(plane.pki.ca_crt))

    def get(url: str, token: str | None = None, context: ssl.SSLContext | None = ctx
            ) -> tuple[int, str]:
        req = urllib.request.Request(url)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        url = f"https://127.0.0.1:{server.port}/metrics"
        assert get(url)[0] == 401
        assert get(url, "not-a-token")[0] == 401
        code, body = get(url, stranger)
        assert code == 403 and "may not get /metrics" in body, (code, body)
        code, body = get(url, scraper)
        assert code == 200 and "wdrf_is_leader 1.0" in body, (code, body[:300])
        # Plain HTTP on the metrics port does not work; health is plain, without a token,
        # on its own port, and serves no metrics.
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
        hp = f"http://127.0.0.1:{server.health_port}"
        health.beat()
        health.set_ready(True)
        assert get(f"{hp}/healthz", context=None)[0] == 200
        assert get(f"{hp}/readyz", context=None)[0] == 200
        assert get(f"{hp}/metrics", context=None)[0] == 404
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Holes found by the second red team: owners, withdrawn approvals, Workloads without a Job,
# queue moves, the controller's ConfigMaps


SCHEDULING_POLICY = "wdrf.x-k8s.io/scheduling-policy"
GC_USER = "system:serviceaccount:kube-system:generic-garbage-collector"


def _terms(api: k8s.ApiClient, ns: str, wl: str) -> str:
    ann = kube.get_workload(api, ns, wl)["metadata"].get("annotations") or {}
    return str(ann.get(TERMS, ""))


def _hand_made_workload(ns: str, n: str, owner: Obj | None = None) -> Obj:
    meta: Obj = {"name": n, "namespace": ns}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": meta,
            "spec": {"queueName": "lq", "podSets": [
                {"name": "main", "count": 1, "template": {"spec": {"restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "busybox",
                                 "resources": {"requests": {"cpu": "4"}}}]}}}]}}


def test_forged_owner_references_are_refused_and_never_lend_a_class(
        admin: k8s.ApiClient, plane: Plane, spaces: tuple[str, str],
        people: dict[str, k8s.ApiClient]) -> None:
    """A user points her own Workload at an admin's urgent Job of the namespace (an
    ownerReference `batch/v2 Job`, which Kueue ignores): the policy refuses to set or change
    a Workload's owners for anyone but Kueue, the garbage collector and admins; and where an
    admin (or an old object) has such a reference, the controller does not take the class from
    it."""
    a, _ = spaces
    alice, adam = people["alice"], people["adam"]
    wl_path = kube.kueue_path("workloads", namespace=a)
    hot = name("hot")
    post(adam, jobs(a), kube.job_manifest(a, hot, "lq", requests={"cpu": "4"},
                                          annotations={URGENT: "true"}))
    uid = kube.get_job(admin, a, hot)["metadata"]["uid"]
    forged = {"apiVersion": "batch/v2", "kind": "Job", "name": hot, "uid": uid,
              "controller": True}
    own = name("w")
    post(alice, wl_path, _hand_made_workload(a, own))
    refused(lambda: kube.patch_workload(alice, a, own, {"metadata": {
        "ownerReferences": [forged]}}), "ownerReferences", "user alice")
    refused(lambda: post(alice, wl_path, _hand_made_workload(a, name("w"), forged)),
            "ownerReferences")
    # Kueue's own ownerReference on a Job's Workload: not removable by the user either.
    jw = h.job_workload(admin, a, hot)
    refused(lambda: kube.patch_workload(people["bart"], a, jw, [
        {"op": "remove", "path": "/metadata/ownerReferences"}]), "ownerReferences")
    # The garbage collector (orphaning) may.
    ssa(admin, kube.binding("redteam-gc", "wdrf-redteam-editor",
                            [kube.service_account("generic-garbage-collector", "kube-system")], a))
    gc = kube.impersonating_client(admin, GC_USER, ["system:serviceaccounts"])
    kube.request(gc, "PATCH", kube.kueue_path("workloads", jw, a),
                 [{"op": "remove", "path": "/metadata/ownerReferences"}],
                 "application/json-patch+json", {"dryRun": "All"})
    # An admin may set one; the controller still trusts only batch/v1 Jobs.
    kube.patch_workload(adam, a, own, {"metadata": {"ownerReferences": [forged]}})
    c = h.new_controller(plane.kubeconfig, h.live_settings())
    with h.started(c):
        h.converge(c)
    assert " class=normal " in _terms(admin, a, own), _terms(admin, a, own)
    assert " class=urgent " in _terms(admin, a, jw), _terms(admin, a, jw)


def test_a_bad_hint_never_keeps_a_withdrawn_approval(
        admin: k8s.ApiClient, plane: Plane, spaces: tuple[str, str],
        people: dict[str, k8s.ApiClient]) -> None:
    """Approved by the lead, then the user adds an invalid scheduling hint and the lead
    withdraws the approval: the hint is reported and ignored, the priority follows the class
    down to normal (it stayed at the approved priority)."""
    a, _ = spaces
    alice, lena = people["alice"], people["lena"]
    n, plain = name(), name()
    post(alice, jobs(a), kube.job_manifest(a, n, "lq", requests={"cpu": "4"}))
    post(alice, jobs(a), kube.job_manifest(a, plain, "lq", requests={"cpu": "4"}))
    patch(lena, jobs(a, n), {"metadata": {"annotations": {APPROVED: "true"}}})
    wl, plain_wl = h.job_workload(admin, a, n), h.job_workload(admin, a, plain)

    def effective(w: str) -> int:
        obj = kube.get_workload(admin, a, w)
        ann = obj["metadata"].get("annotations") or {}
        return int(obj["spec"].get("priority") or 0) + int(ann.get(BOOST, 0))

    c = h.new_controller(plane.kubeconfig, h.live_settings())
    with h.started(c):
        h.converge(c)
        assert " class=approved " in _terms(admin, a, wl)
        approved = effective(wl)
        assert approved > effective(plain_wl)
        patch(alice, jobs(a, n), {"metadata": {"annotations": {SCHEDULING_POLICY: "fastest"}}})
        patch(lena, jobs(a, n), {"metadata": {"annotations": {APPROVED: "false"}}})

        def lowered() -> bool:
            c.run_cycle()
            return " class=normal " in _terms(admin, a, wl)

        kube.wait_for(lowered, 30, "the withdrawn approval to lower the priority", interval=0.5)
        h.converge(c)
    assert effective(wl) < approved
    # Same class, same team: now within the normal band, next to the plain Job.
    assert abs(effective(wl) - effective(plain_wl)) < approved - effective(plain_wl)
    problems = h.events_for(admin, a, wl) + h.events_for(admin, a, n)
    assert any(SCHEDULING_POLICY in e["message"] for e in problems), problems


def test_workloads_and_pods_without_a_job_are_approved_only_by_admins(
        admin: k8s.ApiClient, spaces: tuple[str, str], people: dict[str, k8s.ApiClient]) -> None:
    """No Job records who submitted a hand-made Workload, a pod group or a single pod, so a
    lead could approve her own: only admins approve those."""
    a, _ = spaces
    alice, lena, adam = people["alice"], people["lena"], people["adam"]
    wl_path = kube.kueue_path("workloads", namespace=a)
    own = name("w")
    post(lena, wl_path, _hand_made_workload(a, own))
    refused(lambda: kube.patch_workload(lena, a, own, {"metadata": {"annotations": {
        APPROVED: "true"}}}), "only be set by an admin", "Workload or a pod")
    other = name("w")
    post(alice, wl_path, _hand_made_workload(a, other))
    refused(lambda: kube.patch_workload(lena, a, other, {"metadata": {"annotations": {
        APPROVED: "true"}}}), "only be set by an admin")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name("p"), "namespace": a, "annotations": {APPROVED: "true"},
                        "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    refused(lambda: post(lena, f"/api/v1/namespaces/{a}/pods", pod), APPROVED)
    kube.patch_workload(adam, a, other, {"metadata": {"annotations": {APPROVED: "true"}}})
    # Withdrawing stays open to anyone who may edit it.
    kube.patch_workload(alice, a, other, {"metadata": {"annotations": {APPROVED: "false"}}})


def test_moving_work_to_another_local_queue_is_the_leads_when_queues_are_teams(
        admin: k8s.ApiClient, spaces: tuple[str, str], people: dict[str, k8s.ApiClient]) -> None:
    """With TEAM_SOURCE=localqueue (guardLocalQueues) the queue-name label decides the team:
    relabelling a suspended Job, or a Workload's spec.queueName, is a lead's call."""
    a, _ = spaces
    alice, lena, bart = people["alice"], people["lena"], people["bart"]
    n = name()
    post(alice, jobs(a), kube.job_manifest(a, n, "lq", requests={"cpu": "4"}))
    wl = h.job_workload(admin, a, n)
    move = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "lq-other"}}}
    probe = name()
    post(alice, jobs(a), kube.job_manifest(a, probe, "lq", requests={"cpu": "4"}))

    back = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "lq"}}}

    def guarded() -> bool:
        try:
            kube.request(alice, "PATCH", jobs(a, probe), back, query={"dryRun": "All"})
        except ApiException as e:
            return "guardLocalQueues" in str(e.body)
        return False

    patch(alice, jobs(a, probe), move)  # not guarded by default
    with params_changed(admin, alice, a, {"guardLocalQueues": "true"}, guarded):
        refused(lambda: patch(alice, jobs(a, n), move), "move work to another LocalQueue",
                "user alice")
        refused(lambda: kube.patch_workload(bart, a, wl, {"spec": {"queueName": "lq-other"}}),
                "spec.queueName", "user bart")
        patch(lena, jobs(a, n), move)
        # Creating work in any LocalQueue of the namespace stays open.
        post(alice, jobs(a), kube.job_manifest(a, name(), "lq-other"))


def test_the_controllers_config_maps_are_writable_only_by_admins(
        admin: k8s.ApiClient, plane: Plane, installed: list[Obj],
        controller: k8s.ApiClient) -> None:
    """Someone who may edit ConfigMaps in kueue-system (refused for the params) may not edit
    the controller's settings or its usage history either; the controller still writes its
    history. A history with a bad timestamp (an admin's typo) is dropped with an Event, and
    the cycle writes as usual."""
    cms = f"/api/v1/namespaces/{NS}/configmaps"
    opal = configmap_editor(admin)
    config = next(o["metadata"]["name"] for o in installed if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"].startswith("wdrf-controller-config"))
    refused(lambda: patch(opal, f"{cms}/{config}", {"data": {
        "config.yaml": "TEAM_WEIGHTS: {team-a: 1000000}\n"}}), "user opal", "adminGroups")
    refused(lambda: kube.request(opal, "DELETE", f"{cms}/{config}"), "user opal")
    history = f"{cms}/wdrf-usage-history"
    if not _exists(admin, history):
        post(admin, cms, {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "wdrf-usage-history", "namespace": NS},
                          "data": {}})
    future = ('{"version": 1, "timestamp": "2099-01-01T00:00:00+00:00", '
              '"usage": {"cq/x|team-a": {"cpu": 25.0}}}')
    refused(lambda: patch(opal, history, {"data": {"history.json": future}}), "user opal")
    refused(lambda: post(opal, cms, {"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {"name": "wdrf-controller-config-x",
                                                  "namespace": NS}}), "user opal")
    current = kube.request(controller, "GET", history)
    kube.request(controller, "PUT", history, current)  # the controller's own update
    # A bad history read by a controller: reset with an Event, never a failed cycle.
    own = kube.unique_name("wdrf-history")
    post(admin, cms, {"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": own, "namespace": NS},
                      "data": {"history.json": '{"version": 1, "timestamp": '
                               '"2026-01-01T00:00:00", "usage": {}}'}})
    c = h.new_controller(plane.kubeconfig, h.live_settings(
        USAGE_HALF_LIFE="1h", HISTORY_CONFIG_MAP=own, CONTROLLER_NAMESPACE=NS))
    with h.started(c):
        report = c.run_cycle()
        assert report.leader and report.applied is not None
    [event] = h.events_for(admin, NS, own, "UsageHistoryReset")
    assert "no time zone" in event["message"], event
    saved = kube.request(admin, "GET", f"{cms}/{own}")["data"]["history.json"]
    assert "+00:00" in saved, saved
    kube.request(admin, "DELETE", f"{cms}/{own}")
