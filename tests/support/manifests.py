"""The shipped manifests on a test plane: rendered with kustomize (with the usage-history
component, as a user enabling it would), server-side applied with strict field validation, the
admission policies' bindings scoped to test namespaces; and a kubeconfig for the controller's
ServiceAccount. Shared by the plane tests of the manifests, the red team and the downtime."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client as k8s

from controller.config import Settings, with_overrides
from tests.support import kube

if TYPE_CHECKING:
    from tests.support.plane import Plane

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NS = "kueue-system"
SA = "wdrf-controller"
FIELD_MANAGER = "wdrf-manifests-test"
# Test namespaces under the scoped admission bindings carry this label.
SCOPE_LABEL = "wdrf-test.x-k8s.io/admission"
LEAD_PREFIX = "wdrf:team-lead:"  # teamLeadGroupPrefix: leads of <namespace> are in <prefix><ns>
SCOPED_BINDINGS = ("wdrf-class-annotations", "wdrf-submitted-by", "wdrf-class-priority")

Obj = dict[str, Any]

# kind -> (API prefix, plural, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "Pod": ("/api/v1", "pods", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", False),
    "MutatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1", "mutatingadmissionpolicies", False),
    "MutatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1", "mutatingadmissionpolicybindings", False),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "ResourceFlavor": ("/apis/kueue.x-k8s.io/v1beta2", "resourceflavors", False),
    "ClusterQueue": ("/apis/kueue.x-k8s.io/v1beta2", "clusterqueues", False),
    "LocalQueue": ("/apis/kueue.x-k8s.io/v1beta2", "localqueues", True),
    "WorkloadPriorityClass": ("/apis/kueue.x-k8s.io/v1beta2", "workloadpriorityclasses", False),
}


def obj_path(obj: Obj) -> str:
    prefix, plural, namespaced = RESOURCES[obj["kind"]]
    assert obj["apiVersion"] in prefix, (obj["apiVersion"], prefix)
    ns = f"/namespaces/{obj['metadata']['namespace']}" if namespaced else ""
    return f"{prefix}{ns}/{plural}/{obj['metadata']['name']}"


def ssa(api: k8s.ApiClient, obj: Obj, dry_run: bool = False,
        field_manager: str = FIELD_MANAGER) -> Obj:
    """Server-side apply with strict field validation (unknown or duplicate fields fail)."""
    return kube.server_side_apply(api, obj_path(obj), obj, field_manager, dry_run)


def with_component(tmp: Path, component: Path) -> Path:
    """A kustomization in ``tmp`` that installs manifests/ plus one Component of it (as a user
    enabling that feature would); kustomize wants relative paths."""
    rel = Path(os.path.relpath(MANIFESTS, tmp))
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(rel)],
        "components": [str(rel / component.relative_to(MANIFESTS))]}), encoding="utf-8")
    return tmp


def with_history_component(tmp: Path) -> Path:
    """manifests/ plus components/usage-history/ (`with_component`)."""
    return with_component(tmp, MANIFESTS / "components" / "usage-history")


def install_manifests(admin: k8s.ApiClient, tmp: Path) -> list[Obj]:
    """manifests/ plus the usage-history component, rendered and applied; the class policy's,
    the submitter stamp's and the class stand-in's bindings scoped to namespaces labelled
    SCOPE_LABEL. The params guard and the controller-writes policy are applied as shipped (they
    only concern kueue-system/wdrf-admission-params and the controller's own identity)."""
    objs = kube.render_kustomize(with_history_component(tmp))
    for o in objs:
        if o["kind"].endswith("AdmissionPolicyBinding") and \
                o["metadata"]["name"] in SCOPED_BINDINGS:
            ssa(admin, o, dry_run=True)  # the shipped, cluster-wide binding is valid as is
            scoped = copy.deepcopy(o)
            scoped["spec"]["matchResources"] = {"namespaceSelector": {"matchExpressions": [
                {"key": SCOPE_LABEL, "operator": "Exists"}]}}
            ssa(admin, scoped)
        else:
            ssa(admin, o)
    return objs


def sa_kubeconfig(plane: Plane, token: str, path: Path) -> Path:
    """A kubeconfig at ``path`` that authenticates with the controller ServiceAccount's token."""
    kc = {"apiVersion": "v1", "kind": "Config", "current-context": "sa",
          "clusters": [{"name": "plane", "cluster": {
              "server": plane.server, "certificate-authority": str(plane.pki.ca_crt)}}],
          "users": [{"name": SA, "user": {"token": token}}],
          "contexts": [{"name": "sa", "context": {"cluster": "plane", "user": SA}}]}
    path.write_text(yaml.safe_dump(kc), encoding="utf-8")
    return path


# The controller's grants as controller/live/rbac.py derives them (what the manifests must hold).

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)
NamedRule = tuple[str, str, str, str | None]  # ... plus resourceName (None: any)


def all_features() -> Settings:
    """Settings under which the controller uses every permission it can: node inventory,
    leader election and the usage-history ConfigMap all on."""
    return with_overrides(Settings(), capacity_source="auto", leader_election=True,
                          usage_half_life=3600.0)


def expected_cluster_rules() -> frozenset[Rule]:
    """Cluster-wide grants: controller/live/rbac.py's cluster-wide rows, plus
    SelfSubjectAccessReview create for --health-check."""
    from controller.live.rbac import permissions

    rows = permissions(all_features())
    out = {(p.group, p.resource, p.verb) for p in rows if p.namespace is None}
    return frozenset(out | {("authorization.k8s.io", "selfsubjectaccessreviews", "create")})


def expected_namespace_rules(history: bool = True) -> frozenset[NamedRule]:
    """Grants in kueue-system (controller/live/rbac.py's namespaced rows), each narrowed to its
    object (resourceNames) except "create". ``history``: with the usage-history ConfigMap
    (USAGE_HALF_LIFE > 0, the component components/usage-history/)."""
    from controller.live.rbac import permissions

    settings = all_features() if history else with_overrides(
        all_features(), usage_half_life=0.0)
    out: set[NamedRule] = set()
    for p in permissions(settings):
        if p.namespace is None:
            continue
        assert p.namespace == NS, p
        assert (p.name is None) == (p.verb == "create"), p
        out.add((p.group, p.resource, p.verb, p.name))
    return frozenset(out)
