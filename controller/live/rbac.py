"""Every API permission the live controller uses: the source for `--health-check` and the
RBAC table in docs/operations.md (which the ClusterRole/Role manifests follow).

In its own and Kueue's namespace every object is named (`name`, RBAC `resourceNames`), except
for "create", which RBAC cannot narrow by name (manifests/controller-writes.yaml does, with a
ValidatingAdmissionPolicy). SelfSubjectAccessReviews carry the name, so `--health-check` asks
exactly what the controller will do.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.config import CapacitySourceSetting, Settings
from controller.live.discovery import KUEUE_CONFIG_MAP, KUEUE_DEPLOYMENT
from controller.live.owners import owner_resources


@dataclass(frozen=True, slots=True)
class Permission:
    group: str  # "" = core
    resource: str
    verb: str
    namespace: str | None  # None = cluster-wide (all namespaces)
    why: str
    required: bool = True  # False: a fallback; missing it only degrades a feature
    name: str | None = None  # the one object (RBAC resourceNames); None = any

    def describe(self) -> str:
        res = f"{self.resource}.{self.group}" if self.group else self.resource
        if self.name:
            res += f" {self.name}"
        where = f"in {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.verb} {res} ({where})"


def permissions(settings: Settings) -> list[Permission]:
    kueue = "kueue.x-k8s.io"
    ns_ctl = settings.controller_namespace
    ns_kueue = settings.kueue_namespace
    out: list[Permission] = []
    for verb in ("get", "list", "watch", "patch"):
        out.append(Permission(kueue, "workloads", verb, None,
                              "read Workloads; patch priority-boost / spec.priority"))
    for res in ("clusterqueues", "localqueues"):
        for verb in ("list", "watch"):
            out.append(Permission(kueue, res, verb, None, "read queues"))
    for verb in ("list", "watch"):
        out.append(Permission(kueue, "admissionchecks", verb, None,
                              "recognise MultiKueue ClusterQueues"))
    for verb in ("get", "list", "watch", "patch"):
        out.append(Permission("batch", "jobs", verb, None,
                              "class annotations; HAMi settings on suspended Jobs"))
    for verb in ("list", "watch", "patch"):
        out.append(Permission("", "pods", verb, None, "HAMi annotations on gated pod groups"))
    for owner in owner_resources():  # read only where the cluster serves the kind
        for verb in ("list", "watch"):
            out.append(Permission(owner.group, owner.plural, verb, None,
                                  "class annotations and team labels on the Workload's owner",
                                  required=False))
    if settings.capacity_source != CapacitySourceSetting.QUOTA:
        for verb in ("list", "watch"):
            out.append(Permission("", "nodes", verb, None, "GPU inventory annotations"))
    out.append(Permission("", "events", "create", None, "Events on Workloads, Jobs, pods"))
    if settings.metrics_cert_file:  # /metrics over HTTPS: check each scraper's token
        out.append(Permission("authentication.k8s.io", "tokenreviews", "create", None,
                              "authenticate /metrics scrapers"))
        out.append(Permission("authorization.k8s.io", "subjectaccessreviews", "create", None,
                              "authorize /metrics scrapers (get /metrics)"))
    if settings.leader_election:
        for verb in ("get", "create", "update"):
            out.append(Permission("coordination.k8s.io", "leases", verb, ns_ctl,
                                  "leader election",
                                  name=None if verb == "create" else settings.lease_name))
    if settings.usage_half_life > 0:
        for verb in ("get", "create", "update"):
            out.append(Permission("", "configmaps", verb, ns_ctl, "decayed usage history",
                                  name=None if verb == "create" else settings.history_config_map))
    out.append(Permission("", "configmaps", "get", ns_kueue,
                          "PriorityBoost gate in kueue-manager-config", required=False,
                          name=KUEUE_CONFIG_MAP))
    out.append(Permission("apps", "deployments", "get", ns_kueue,
                          "PriorityBoost gate in the Kueue manager's args", required=False,
                          name=KUEUE_DEPLOYMENT))
    return out


def manager_permissions(settings: Settings) -> list[Permission]:
    """What the controller on a MultiKueue worker reads on the manager cluster
    (MULTIKUEUE_MANAGER_KUBECONFIG; manifests/multikueue-manager grants it): the manager's
    Workloads, Kueue-managed Jobs and owners of the other integrated kinds it serves (JobSets,
    RayJobs, ...), each kept by a LIST + WATCH; nothing without the setting."""
    if not settings.multikueue_manager_kubeconfig:
        return []
    out: list[Permission] = []
    for group, resource in (("kueue.x-k8s.io", "workloads"), ("batch", "jobs")):
        for verb in ("list", "watch"):
            out.append(Permission(group, resource, verb, None,
                                  "classes of the copies' manager Workloads and Jobs"))
    for owner in owner_resources():  # read only where the manager serves the kind
        for verb in ("list", "watch"):
            out.append(Permission(owner.group, owner.plural, verb, None,
                                  "classes of the copies' manager JobSets, RayJobs, ...",
                                  required=False))
    return out
