"""Every API permission the live controller uses: the source for `--health-check` and the
RBAC table in docs/operations.md (which the ClusterRole/Role manifests follow)."""

from __future__ import annotations

from dataclasses import dataclass

from controller.config import Settings


@dataclass(frozen=True, slots=True)
class Permission:
    group: str  # "" = core
    resource: str
    verb: str
    namespace: str | None  # None = cluster-wide (all namespaces)
    why: str
    required: bool = True  # False: a fallback; missing it only degrades a feature

    def describe(self) -> str:
        res = f"{self.resource}.{self.group}" if self.group else self.resource
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
    for verb in ("get", "list", "watch", "patch"):
        out.append(Permission("batch", "jobs", verb, None,
                              "class annotations; HAMi settings on suspended Jobs"))
    for verb in ("list", "watch", "patch"):
        out.append(Permission("", "pods", verb, None, "HAMi annotations on gated pod groups"))
    if settings.capacity_source != "quota":
        for verb in ("list", "watch"):
            out.append(Permission("", "nodes", verb, None, "GPU inventory annotations"))
    out.append(Permission("", "events", "create", None, "Events on Workloads, Jobs, pods"))
    if settings.leader_election:
        for verb in ("get", "create", "update"):
            out.append(Permission("coordination.k8s.io", "leases", verb, ns_ctl,
                                  "leader election"))
    if settings.usage_half_life > 0:
        for verb in ("get", "create", "update"):
            out.append(Permission("", "configmaps", verb, ns_ctl, "decayed usage history"))
    out.append(Permission("", "configmaps", "get", ns_kueue,
                          "PriorityBoost gate in kueue-manager-config", required=False))
    out.append(Permission("apps", "deployments", "get", ns_kueue,
                          "PriorityBoost gate in the Kueue manager's args", required=False))
    return out
