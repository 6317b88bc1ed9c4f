"""manifests/ and examples/ on the real control plane (kube-apiserver with RBAC + Kueue).

- every rendered manifest and every example is server-side applied with strict field
  validation (Kueue objects are checked against the CRD schemas of the pinned Kueue module);
- the ValidatingAdmissionPolicy is proven with impersonated users and with the controller's
  ServiceAccount token;
- the controller's ServiceAccount can do what the controller needs and is denied what it must
  not do (delete Workloads, read Secrets, change ClusterQueues).

Isolation on the shared plane: example namespaces, ClusterQueues and the cohort get a random
suffix, and the bindings of the class policy and the submitter stamp get a namespaceSelector for
namespaces labelled SCOPE_LABEL (this module's and tests/plane/test_redteam.py's; the shipped,
unscoped bindings are validated with a server-side dry run). Installed with the usage-history
component (the controller runs here with USAGE_HALF_LIFE > 0).
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.config import KEYS
from tests.support import kube
from tests.support.kube import denial
from tests.support.manifests import (
    LEAD_PREFIX,
    NS,
    SA,
    SCOPE_LABEL,
    install_manifests,
    obj_path,
    sa_kubeconfig,
    ssa,
)
from tests.support.plane import Plane

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
SA_USER = f"system:serviceaccount:{NS}:{SA}"
KUEUE_SA_USER = f"system:serviceaccount:{NS}:kueue-controller-manager"
APPROVED = "wdrf.x-k8s.io/approved"
URGENT = "wdrf.x-k8s.io/urgent"
OVERRIDE = "wdrf.x-k8s.io/priority-override"
BOOST = "kueue.x-k8s.io/priority-boost"
BASE = "wdrf.x-k8s.io/base-priority"
APPLIED = "wdrf.x-k8s.io/applied-priority"
USERS_GROUP = "wdrf-test:users"  # RBAC for the impersonated people below
ORDINARY = ("alice", [USERS_GROUP])
ADMIN = ("adam", [USERS_GROUP, "wdrf:admins"])

Obj = dict[str, Any]
_CONFIG_KEYS = frozenset(KEYS)

def job_path(ns: str, name: str = "") -> str:
    return f"/apis/batch/v1/namespaces/{ns}/jobs" + (f"/{name}" if name else "")


def annotate(api: k8s.ApiClient, path: str, annotations: dict[str, str | None]) -> Obj:
    return kube.request(api, "PATCH", path, {"metadata": {"annotations": annotations}})


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def installed(admin: k8s.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    """The rendered manifests (with the usage-history component), applied."""
    return install_manifests(admin, tmp_path_factory.mktemp("kustomize"))


@pytest.fixture(scope="module", autouse=True)
def leave_no_queues_behind(plane: Plane, suffix: str) -> Iterator[None]:
    """After this module: deactivate the Workloads in its namespaces and delete its
    ClusterQueues, so later plans on the shared plane (shares, capacity) do not see them."""
    yield
    admin = plane.api_client()
    for ns in kube.request(admin, "GET", "/api/v1/namespaces")["items"]:
        name = ns["metadata"]["name"]
        if not name.endswith(f"-{suffix}"):
            continue
        with contextlib.suppress(ApiException):
            for wl in kube.list_workloads(admin, name):
                if wl["spec"].get("active", True):
                    with contextlib.suppress(ApiException):
                        kube.patch_workload(admin, name, wl["metadata"]["name"],
                                            {"spec": {"active": False}})
    for cq in kube.request(admin, "GET", kube.kueue_path("clusterqueues"))["items"]:
        name = cq["metadata"]["name"]
        if name.endswith(f"-{suffix}"):  # examples' and cq-<namespace> queues
            with contextlib.suppress(ApiException):
                kube.request(admin, "DELETE", kube.kueue_path("clusterqueues", name))
    admin.close()


@pytest.fixture(scope="module")
def policy_ready(admin: k8s.ApiClient, installed: list[Obj], suffix: str) -> str:
    """A namespace under the policy, with RBAC for the test people; waits until the policy
    is enforced (policies are loaded asynchronously). Returns the namespace."""
    ns = kube.create_namespace(admin, f"adm-{suffix}", {SCOPE_LABEL: suffix})
    ssa(admin, kube.role("editor", [
        {"apiGroups": ["batch"], "resources": ["jobs"],
         "verbs": ["get", "list", "create", "update", "patch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
         "verbs": ["get", "list", "create", "update", "patch"]}], ns))
    ssa(admin, kube.binding("editor", "editor", [
        kube.group(USERS_GROUP), kube.service_account("kueue-controller-manager", NS)], ns,
        cluster_role=False))
    alice = kube.impersonating_client(admin, *ORDINARY)
    probe = kube.job_manifest(ns, "probe", None, annotations={URGENT: "true"})

    def enforced() -> bool:
        try:
            kube.request(alice, "POST", job_path(ns), probe, "application/json",
                         {"dryRun": "All"})
        except ApiException as e:
            return "wdrf.x-k8s.io/urgent" in str(e.body)
        return False

    kube.wait_for(enforced, 60, "the admission policy to be enforced")
    return ns


@pytest.fixture
def people(admin: k8s.ApiClient, policy_ready: str) -> Iterator[dict[str, k8s.ApiClient]]:
    """alice (ordinary), lena (lead of the policy namespace) and adam (admin)."""
    clients = {
        "ordinary": kube.impersonating_client(admin, *ORDINARY),
        "lead": kube.impersonating_client(admin, "lena",
                                          [USERS_GROUP, LEAD_PREFIX + policy_ready]),
        "admin": kube.impersonating_client(admin, *ADMIN),
    }
    yield clients
    for c in clients.values():
        c.close()


@pytest.fixture(scope="module")
def controller_client(admin: k8s.ApiClient, installed: list[Obj]) -> k8s.ApiClient:
    """An ApiClient with a token of the controller's own ServiceAccount (not admin)."""
    token = kube.service_account_token(admin, NS, SA)
    c = kube.token_client(admin, token)
    assert kube.whoami(c)["username"] == SA_USER
    return c


# ---------------------------------------------------------------------------------------------
# Apply


def test_every_rendered_manifest_applies(admin: k8s.ApiClient, installed: list[Obj]) -> None:
    for o in installed:
        live = kube.request(admin, "GET", obj_path(o))
        assert live["metadata"]["name"] == o["metadata"]["name"]
    dep = kube.request(admin, "GET", obj_path(next(o for o in installed
                                                   if o["kind"] == "Deployment")))
    assert dep["spec"]["replicas"] == 2


def test_strict_apply_rejects_an_unknown_field(admin: k8s.ApiClient) -> None:
    """The apply check has teeth: a misspelt field in a Kueue object is refused."""
    cq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
          "metadata": {"name": f"typo-{uuid.uuid4().hex[:5]}"},
          "spec": {"cohortNmae": "x", "resourceGroups": []}}
    status, message = denial(lambda: ssa(admin, cq, dry_run=True))
    # kube-apiserver 1.36 answers a server-side apply that names an undeclared field with 500
    # "failed to create typed patch object ... field not declared in schema".
    assert status in (400, 422, 500) and "cohortNmae" in message, message
    assert "not declared in schema" in message or "unknown field" in message, message


def _examples(suffix: str) -> list[Obj]:
    """examples/queues and examples/jobs with namespaces, ClusterQueues and the cohort renamed
    so this test cannot collide with others on the shared plane."""
    docs: list[Obj] = []
    renames = {"team-a": f"team-a-{suffix}", "team-b": f"team-b-{suffix}",
               "team-c": f"team-c-{suffix}", "shared-h100": f"shared-h100-{suffix}",
               "h100-pool": f"h100-pool-{suffix}"}
    for sub in ("queues", "jobs"):
        for f in sorted((ROOT / "examples" / sub).glob("*.yaml")):
            text = f.read_text(encoding="utf-8")
            for old, new in renames.items():
                text = text.replace(old, new)
            docs += [d for d in yaml.safe_load_all(text) if d]
    order = ["Namespace", "ResourceFlavor", "ClusterQueue", "LocalQueue", "Job", "Pod"]
    return sorted(docs, key=lambda d: order.index(d["kind"]))


def test_every_example_applies_and_kueue_takes_it(admin: k8s.ApiClient, suffix: str,
                                                  installed: list[Obj]) -> None:
    docs = _examples(suffix)
    for d in docs:
        if d["kind"] == "Namespace":
            d["metadata"].setdefault("labels", {})[SCOPE_LABEL] = suffix  # under the policy
        ssa(admin, d)
    # Queues are usable: every ClusterQueue and LocalQueue turns Active.
    for d in docs:
        if d["kind"] in ("ClusterQueue", "LocalQueue"):
            kube.wait_for(lambda d=d: kube.has_condition(  # type: ignore[misc]
                kube.request(admin, "GET", obj_path(d)), "Active"), 30,
                f"{d['kind']} {d['metadata']['name']} Active")
    cohort = [d for d in docs if d["kind"] == "ClusterQueue" and d["spec"].get("cohortName")]
    assert len(cohort) >= 2
    # Kueue made a Workload for every Job and for the pod group; class annotations are not
    # copied onto Workloads (Kueue copies only provisioning-request annotations by default).
    for d in docs:
        ns = d["metadata"].get("namespace")
        if d["kind"] == "Job":
            wl = kube.workload_for_job(admin, ns, d["metadata"]["name"])
            assert not [k for k in (wl["metadata"].get("annotations") or {})
                        if k.startswith("wdrf.x-k8s.io/")], wl["metadata"]
        if d["kind"] == "Pod":
            # Kueue's pod webhook took the pod (it is gated by kueue.x-k8s.io/admission until
            # the group is admitted; here the queue has room, so the gate may be gone already).
            pod = kube.request(admin, "GET", obj_path(d))
            assert pod["metadata"]["labels"].get("kueue.x-k8s.io/managed") == "true", \
                pod["metadata"]
            group = d["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
            kube.wait_for(lambda ns=ns, group=group: any(  # type: ignore[misc]
                w["metadata"]["name"] == group for w in kube.list_workloads(admin, ns)),
                30, f"the pod group Workload {ns}/{group}")
    # The fractional-GPU example is admitted: its ClusterQueue covers HAMi's gpucores and
    # gpumem-percentage (Kueue's BlockUndeclared would otherwise hold it forever).
    frac = next(d for d in docs if d["kind"] == "Job" and any(
        "nvidia.com/gpucores" in (c.get("resources") or {}).get("limits", {})
        for c in d["spec"]["template"]["spec"]["containers"]))
    ns = frac["metadata"]["namespace"]
    kube.wait_for(lambda: kube.has_condition(kube.workload_for_job(
        admin, ns, frac["metadata"]["name"]), "QuotaReserved"), 30,
        f"the fractional example {ns}/{frac['metadata']['name']} admitted")


# ---------------------------------------------------------------------------------------------
# Admission policy


def test_ordinary_user_cannot_set_class_annotations_on_jobs(
        policy_ready: str, people: dict[str, k8s.ApiClient]) -> None:
    ns, alice = policy_ready, people["ordinary"]
    for key, who in ((APPROVED, f"may only be set by a lead of namespace {ns} (groups "
                                f"{LEAD_PREFIX}{ns}, wdrf:admins"),
                     (URGENT, "may only be set, changed or removed by members of the groups "
                              "wdrf:admins"),
                     (OVERRIDE, "may only be set, changed or removed by members of the groups "
                                "wdrf:admins")):
        body = kube.job_manifest(ns, f"j-{uuid.uuid4().hex[:5]}", None, annotations={key: "1"})
        status, message = denial(lambda body=body: kube.request(  # type: ignore[misc]
            alice, "POST", job_path(ns), body, "application/json"))
        assert status == 403, (status, message)
        assert f"{key} {who}" in message, message
        assert "user alice is in none of them" in message, message
    # A Job without class annotations is fine, and so are unrelated annotations.
    name = f"j-{uuid.uuid4().hex[:5]}"
    kube.request(alice, "POST", job_path(ns),
                 kube.job_manifest(ns, name, None, annotations={"team/note": "x"}),
                 "application/json")
    for key in (APPROVED, URGENT, OVERRIDE):
        status, message = denial(lambda key=key: annotate(  # type: ignore[misc]
            alice, job_path(ns, name), {key: "true"}))
        assert status == 403 and key in message, message
    annotate(alice, job_path(ns, name), {"team/note": "y"})


def test_team_lead_may_approve_but_not_make_urgent(
        policy_ready: str, people: dict[str, k8s.ApiClient]) -> None:
    ns, lena, alice = policy_ready, people["lead"], people["ordinary"]
    name = f"j-{uuid.uuid4().hex[:5]}"
    kube.request(alice, "POST", job_path(ns), kube.job_manifest(ns, name, None),
                 "application/json")
    job = annotate(lena, job_path(ns, name), {APPROVED: "true"})
    assert job["metadata"]["annotations"][APPROVED] == "true"
    status, message = denial(lambda: annotate(lena, job_path(ns, name), {URGENT: "true"}))
    assert status == 403 and "wdrf.x-k8s.io/urgent" in message and "wdrf:admins" in message
    assert "user lena" in message
    denial(lambda: annotate(lena, job_path(ns, name), {OVERRIDE: "900"}))
    # The owner may still edit the Job when the approved value stays as it is ...
    annotate(alice, job_path(ns, name), {"team/note": "after approval"})
    # ... and may withdraw it (that only lowers the priority), but not approve it again.
    annotate(alice, job_path(ns, name), {APPROVED: "false"})
    status, message = denial(lambda: annotate(alice, job_path(ns, name), {APPROVED: "true"}))
    assert status == 403 and APPROVED in message
    annotate(alice, job_path(ns, name), {APPROVED: None})


def test_admin_may_set_every_class_annotation(
        policy_ready: str, people: dict[str, k8s.ApiClient]) -> None:
    ns, adam = policy_ready, people["admin"]
    name = f"j-{uuid.uuid4().hex[:5]}"
    kube.request(adam, "POST", job_path(ns), kube.job_manifest(
        ns, name, None, annotations={URGENT: "true", APPROVED: "true"}), "application/json")
    job = annotate(adam, job_path(ns, name), {OVERRIDE: "5000", URGENT: None})
    ann = job["metadata"]["annotations"]
    assert ann[OVERRIDE] == "5000" and URGENT not in ann and ann[APPROVED] == "true"


def _workload(admin: k8s.ApiClient, ns: str) -> Obj:
    """A pending Workload made by Kueue for a fresh Job in `ns` (via a LocalQueue)."""
    lq = "lq"
    try:
        kube.create_queues(admin, ns, {"cpu": "1"})
    except ApiException as e:
        if e.status != 409:
            raise
    name = f"w-{uuid.uuid4().hex[:5]}"
    kube.create_job(admin, ns, name, lq, requests={"cpu": "4"})  # never fits: stays pending
    return kube.workload_for_job(admin, ns, name)


def test_workload_class_annotations_follow_the_same_rules(
        admin: k8s.ApiClient, policy_ready: str, people: dict[str, k8s.ApiClient]) -> None:
    ns = policy_ready
    wl = _workload(admin, ns)
    path = kube.kueue_path("workloads", wl["metadata"]["name"], ns)
    alice, lena, adam = people["ordinary"], people["lead"], people["admin"]
    for key in (APPROVED, URGENT, OVERRIDE, BOOST, BASE, APPLIED):
        status, message = denial(lambda key=key: annotate(  # type: ignore[misc]
            alice, path, {key: "7"}))
        assert status == 403 and key in message and "alice" in message, message
    # A Job's Workload: its lead approves the Job, not the Workload (S6).
    status, message = denial(lambda: annotate(lena, path, {APPROVED: "true"}))
    assert status == 403 and "team leads approve the Job itself" in message, message
    status, message = denial(lambda: annotate(lena, path, {URGENT: "true"}))
    assert status == 403 and "wdrf:admins" in message
    out = annotate(adam, path, {URGENT: "true", OVERRIDE: "100", APPROVED: "true"})
    assert out["metadata"]["annotations"][URGENT] == "true"
    out = annotate(adam, path, {BASE: "7", APPLIED: "7"})  # admins may, like the controller
    assert out["metadata"]["annotations"][APPLIED] == "7"
    # The same rules through the served v1beta1 API (converted by Kueue's webhook).
    v1 = kube.kueue_path("workloads", wl["metadata"]["name"], ns, version="v1beta1")
    status, message = denial(lambda: annotate(alice, v1, {OVERRIDE: None}))
    assert status == 403 and OVERRIDE in message, message


def test_controller_and_kueue_service_accounts_are_not_blocked(
        admin: k8s.ApiClient, policy_ready: str, controller_client: k8s.ApiClient) -> None:
    ns = policy_ready
    wl = _workload(admin, ns)
    name = wl["metadata"]["name"]
    # What the controller writes in boost mode and in spec mode.
    kube.set_priority_boost(controller_client, ns, name, 1234)
    out = kube.patch_workload(controller_client, ns, name,
                              {"metadata": {"annotations": {BASE: "0", APPLIED: "1234"}},
                               "spec": {"priority": 1234}})
    assert out["metadata"]["annotations"][BOOST] == "1234"
    assert out["metadata"]["annotations"][BASE] == "0" and out["spec"]["priority"] == 1234
    assert out["metadata"]["annotations"][APPLIED] == "1234"
    # HAMi annotations on a suspended Job's pod template (no class annotation involved, but the
    # Job carries one, so the policy evaluates the request).
    jname = f"j-{uuid.uuid4().hex[:5]}"
    kube.create_job(admin, ns, jname, None, annotations={APPROVED: "true"})
    kube.request(controller_client, "PATCH", job_path(ns, jname), {"spec": {"template": {
        "metadata": {"annotations": {"hami.io/node-scheduler-policy": "binpack"}}}}})
    # Kueue's ServiceAccount creating a Workload that carries a class annotation (as it would if
    # configured to copy it from the Job) is allowed.
    kueue = kube.impersonating_client(admin, KUEUE_SA_USER, ["system:serviceaccounts"])
    copy_of = copy.deepcopy(wl)
    body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"copy-{uuid.uuid4().hex[:5]}", "namespace": ns,
                         "annotations": {APPROVED: "true", URGENT: "true"}},
            "spec": {"queueName": "lq", "podSets": copy_of["spec"]["podSets"]}}
    created = kube.request(kueue, "POST", kube.kueue_path("workloads", namespace=ns), body,
                           "application/json")
    assert created["metadata"]["annotations"][URGENT] == "true"


def test_changing_the_params_changes_who_may_approve(
        admin: k8s.ApiClient, policy_ready: str, people: dict[str, k8s.ApiClient]) -> None:
    """The group names are configuration: with teamLeadGroups set, its members lead every
    namespace; emptied again, they do not."""
    ns = policy_ready
    cm_path = f"/api/v1/namespaces/{NS}/configmaps/wdrf-admission-params"
    old = kube.request(admin, "GET", cm_path)["data"]["teamLeadGroups"]
    name, probe = f"j-{uuid.uuid4().hex[:5]}", f"p-{uuid.uuid4().hex[:5]}"
    kube.create_job(admin, ns, name, None)
    kube.create_job(admin, ns, probe, None)  # never approved: the dry runs below
    abe = kube.impersonating_client(admin, "abe", [USERS_GROUP, "wdrf:approvers"])

    def abe_may_approve() -> bool:
        try:
            kube.request(abe, "PATCH", job_path(ns, probe),
                         {"metadata": {"annotations": {APPROVED: "true"}}},
                         query={"dryRun": "All"})
        except ApiException as e:
            assert "user abe is in none of them" in str(e.body), e.body
            return False
        return True

    assert not abe_may_approve()
    try:
        kube.request(admin, "PATCH", cm_path, {"data": {"teamLeadGroups": "wdrf:approvers"}})
        kube.wait_for(abe_may_approve, 30, "the new teamLeadGroups to take effect")
        annotate(abe, job_path(ns, name), {APPROVED: "true"})
    finally:
        kube.request(admin, "PATCH", cm_path, {"data": {"teamLeadGroups": old}})
    kube.wait_for(lambda: not abe_may_approve(), 30, "teamLeadGroups restored")


# ---------------------------------------------------------------------------------------------
# The controller's identity: allowed exactly what it needs


def _can(api: k8s.ApiClient, verb: str, group: str, resource: str,
         namespace: str | None = None, name: str | None = None) -> bool:
    attrs: Obj = {"verb": verb, "group": group, "resource": resource}
    if namespace:
        attrs["namespace"] = namespace
    if name:
        attrs["name"] = name
    r = kube.request(api, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                     {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                      "spec": {"resourceAttributes": attrs}}, "application/json")
    return bool(r["status"]["allowed"])


def test_controller_identity_can_do_what_it_needs(controller_client: k8s.ApiClient) -> None:
    from tests.support.manifests import expected_cluster_rules, expected_namespace_rules

    for group, resource, verb in sorted(expected_cluster_rules()):
        assert _can(controller_client, verb, group, resource, "team-x"), (group, resource, verb)
    for group, resource, verb, name in sorted(expected_namespace_rules(), key=str):
        assert _can(controller_client, verb, group, resource, NS, name), (resource, verb, name)
    # Really reads Kueue's manager configuration (the plane has it), and the health check's
    # own view agrees: every permission the live controller lists is granted.
    kube.request(controller_client, "GET",
                 f"/api/v1/namespaces/{NS}/configmaps/kueue-manager-config")
    from controller.config import Settings, with_overrides
    from controller.live.rbac import permissions

    s = with_overrides(Settings(), usage_half_life=3600.0)
    for p in permissions(s):
        assert _can(controller_client, p.verb, p.group, p.resource, p.namespace or "team-x",
                    p.name), p


def test_controller_identity_is_denied_what_it_must_not_do(
        admin: k8s.ApiClient, controller_client: k8s.ApiClient, suffix: str) -> None:
    c = controller_client
    for verb, group, resource, ns in (
            ("delete", "kueue.x-k8s.io", "workloads", "team-x"),
            ("create", "kueue.x-k8s.io", "workloads", "team-x"),
            ("update", "kueue.x-k8s.io", "workloads", "team-x"),
            ("get", "", "secrets", NS), ("list", "", "secrets", None),
            ("watch", "", "secrets", "team-x"),
            ("patch", "kueue.x-k8s.io", "clusterqueues", None),
            ("update", "kueue.x-k8s.io", "clusterqueues", None),
            ("delete", "kueue.x-k8s.io", "clusterqueues", None),
            ("create", "kueue.x-k8s.io", "clusterqueues", None),
            ("delete", "batch", "jobs", "team-x"), ("create", "batch", "jobs", "team-x"),
            ("delete", "", "pods", "team-x"), ("create", "", "pods", "team-x"),
            ("patch", "", "nodes", None), ("delete", "", "configmaps", NS),
            ("get", "", "configmaps", "team-x"), ("create", "", "configmaps", "team-x"),
            ("list", "", "configmaps", NS), ("watch", "", "configmaps", NS),
            ("delete", "coordination.k8s.io", "leases", NS),
            ("patch", "kueue.x-k8s.io", "workloads/status", "team-x"),
            ("update", "apps", "deployments", NS),
            ("create", "", "serviceaccounts/token", NS),
            ("impersonate", "", "users", None), ("escalate", "rbac.authorization.k8s.io",
                                                  "clusterroles", None)):
        assert not _can(c, verb, group, resource, ns), (verb, group, resource, ns)
    # In kueue-system: nothing is patched or deleted there, Kueue's Deployment is only read.
    for verb, group, resource in (("patch", "", "configmaps"), ("delete", "", "configmaps"),
                                  ("patch", "coordination.k8s.io", "leases"),
                                  ("patch", "apps", "deployments"),
                                  ("update", "apps", "deployments")):
        assert not _can(c, verb, group, resource, NS, None), (verb, resource)
    # Every kueue-system object other than its own is out of reach, by name (S5).
    for verb, group, resource, name in (
            ("get", "", "configmaps", "wdrf-admission-params"),
            ("update", "", "configmaps", "wdrf-admission-params"),
            ("update", "", "configmaps", "kueue-manager-config"),
            ("get", "coordination.k8s.io", "leases", "kueue-leader"),
            ("update", "coordination.k8s.io", "leases", "kueue-leader"),
            ("get", "apps", "deployments", "wdrf-controller")):
        assert not _can(c, verb, group, resource, NS, name), (verb, resource, name)

    # And real attempts fail with 403.
    ns = kube.create_namespace(admin, f"deny-{suffix}")
    cq, lq = kube.create_queues(admin, ns, {"cpu": "1"})
    kube.create_job(admin, ns, "victim", lq, requests={"cpu": "4"})
    wl = kube.workload_for_job(admin, ns, "victim")
    status, _ = denial(lambda: kube.request(
        c, "DELETE", kube.kueue_path("workloads", wl["metadata"]["name"], ns)))
    assert status == 403
    status, _ = denial(lambda: kube.request(c, "GET", f"/api/v1/namespaces/{NS}/secrets"))
    assert status == 403
    status, _ = denial(lambda: kube.request(c, "GET", "/api/v1/secrets"))
    assert status == 403
    status, _ = denial(lambda: kube.request(
        c, "PATCH", kube.kueue_path("clusterqueues", cq), {"spec": {"stopPolicy": "Hold"}}))
    assert status == 403
    # The patches it does need go through.
    kube.set_priority_boost(c, ns, wl["metadata"]["name"], 5)


# ---------------------------------------------------------------------------------------------
# The controller itself, run with the ServiceAccount's token (not admin)


def _deployment_command(installed: list[Obj]) -> tuple[list[str], dict[str, str]]:
    """The rendered Deployment's container args and env, made runnable here: the mounted
    config file becomes manifests/config.yaml (the generated ConfigMap's content), downward-API
    fields get the values the kubelet would give them."""
    dep = next(o for o in installed if o["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    config_dir = mounts["config"]
    args = [a.replace(config_dir, str(ROOT / "manifests")) for a in c.get("args", [])]
    fields = {"metadata.namespace": NS, "metadata.name": "wdrf-controller-test-pod"}
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return args, env


def _run_controller(installed: list[Obj], kubeconfig: Path, *extra: str,
                    **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m controller` with the Deployment's args and env (the image's ENTRYPOINT is
    `python -m controller`), plus `extra` flags (--once, --health-check) and test settings."""
    args, dep_env = _deployment_command(installed)
    full = {k: v for k, v in os.environ.items() if k not in _CONFIG_KEYS}
    full.update(dep_env)
    full.update({"KUBECONFIG": str(kubeconfig), "METRICS_PORT": "0", **env})
    return subprocess.run([sys.executable, "-m", "controller", *args, *extra], cwd=ROOT,
                          env=full, capture_output=True, text=True, timeout=180, check=False)


def _lease_free(admin: k8s.ApiClient) -> bool:
    try:
        lease = kube.request(admin, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/"
                             f"leases/{SA}")
    except ApiException as e:
        return e.status == 404
    return not (lease.get("spec") or {}).get("holderIdentity")


@pytest.fixture(scope="module")
def workload_for_cycles(admin: k8s.ApiClient, suffix: str,
                        installed: list[Obj]) -> Iterator[tuple[str, str, str]]:
    """A pending, approved, fractional-GPU Job's Workload in a fresh namespace: something for
    the controller to boost and to give HAMi settings. Cleaned up afterwards so later tests'
    plans do not see it."""
    ns = kube.create_namespace(admin, f"cyc-{suffix}")
    cq, lq = kube.create_queues(admin, ns, {"cpu": "1", "nvidia.com/gpu": "1"})
    kube.create_job(admin, ns, "frac", lq, annotations={APPROVED: "true"},
                    requests={"cpu": "4", "nvidia.com/gpu": "1", "nvidia.com/gpucores": "50",
                              "nvidia.com/gpumem-percentage": "50"})
    wl = kube.workload_for_job(admin, ns, "frac")
    yield ns, wl["metadata"]["name"], cq
    with contextlib.suppress(ApiException):
        kube.patch_workload(admin, ns, wl["metadata"]["name"], {"spec": {"active": False}})
    with contextlib.suppress(ApiException):
        kube.request(admin, "DELETE", kube.kueue_path("clusterqueues", cq))


def test_controller_with_its_service_account_runs_full_cycles_in_every_mode(
        plane: Plane, admin: k8s.ApiClient, tmp_path: Path, installed: list[Obj],
        workload_for_cycles: tuple[str, str, str]) -> None:
    ns, name, _cq = workload_for_cycles
    token = kube.service_account_token(admin, NS, SA)
    kubeconfig = sa_kubeconfig(plane, token, tmp_path / "sa-kubeconfig")
    # Every permission is used: nodes (CAPACITY_SOURCE auto), the Lease (LEADER_ELECTION),
    # the history ConfigMap (USAGE_HALF_LIFE > 0), Kueue's config (PRIORITY_MODE auto), Events.
    common = {"CAPACITY_SOURCE": "auto", "LEADER_ELECTION": "true", "USAGE_HALF_LIFE": "1h",
              "LOG_LEVEL": "INFO"}

    args, _ = _deployment_command(installed)
    assert args == [f"--config={ROOT / 'manifests'}/config.yaml"], args
    health = _run_controller(installed, kubeconfig, "--health-check", **common)
    assert health.returncode == 0, health.stdout + health.stderr

    def cycle(mode: str) -> Obj:
        kube.wait_for(lambda: _lease_free(admin), 30, "the Lease to be free")
        r = _run_controller(installed, kubeconfig, "--once", PRIORITY_MODE=mode, **common)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        assert " 403" not in out and "Forbidden" not in out and "forbidden" not in out, out[-4000:]
        return kube.get_workload(admin, ns, name)

    wl = cycle("boost")
    ann = wl["metadata"].get("annotations") or {}
    boost = int(ann[BOOST])
    assert boost > 25000, ann  # the approved class term alone is 100 x 1020
    assert wl["spec"].get("priority", 0) == 0 and BASE not in ann

    wl = cycle("spec")
    ann = wl["metadata"].get("annotations") or {}
    assert BOOST not in ann, ann  # mode switch cleans up
    assert ann[BASE] == "0" and wl["spec"]["priority"] >= boost, (ann, wl["spec"])
    assert ann[APPLIED] == str(wl["spec"]["priority"]), (ann, wl["spec"])

    wl = cycle("auto")  # the plane's Kueue has PriorityBoost on: auto resolves to boost
    ann = wl["metadata"].get("annotations") or {}
    assert int(ann[BOOST]) >= boost and BASE not in ann and APPLIED not in ann, ann
    assert wl["spec"].get("priority", 0) == 0, wl["spec"]

    # HAMi settings reached the suspended Job's pod template (fractional -> binpack/binpack),
    # Events were written, the Lease and the usage history exist under the controller's name.
    job = kube.get_job(admin, ns, "frac")
    tmpl = job["spec"]["template"]["metadata"].get("annotations") or {}
    assert tmpl.get("hami.io/node-scheduler-policy") == "binpack", tmpl
    assert tmpl.get("hami.io/gpu-scheduler-policy") == "binpack", tmpl
    events = kube.request(admin, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
    assert any(e.get("reason") == "PriorityChanged" for e in events), \
        [e.get("reason") for e in events]
    kube.request(admin, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{SA}")
    history = kube.request(admin, "GET", f"/api/v1/namespaces/{NS}/configmaps/"
                           "wdrf-usage-history")
    assert history["data"], history
