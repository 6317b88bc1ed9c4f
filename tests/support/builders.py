"""Builders for tests: Kubernetes dicts (Workload, ClusterQueue, LocalQueue, Job) and domain
objects (Workload, Job, ClusterSnapshot, Settings) with sane defaults; the one place tests build
them."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

from controller.config import Settings
from controller.domain import (
    GPU,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    Admission,
    ClusterQueue,
    ClusterSnapshot,
    Container,
    JobInfo,
    KueueApiVersion,
    LocalQueue,
    ObjectRef,
    PodSet,
    ResourceQuota,
    Workload,
    frozen_resources,
)
from controller.parse import parse_workload
from controller.plan import Plan, WorkloadDecision
from controller.workload import WorkloadInfo

NOW = datetime(2025, 11, 20, 12, 0, 0, tzinfo=UTC)
V1B2 = "kueue.x-k8s.io/v1beta2"
V1B1 = "kueue.x-k8s.io/v1beta1"


def ts(seconds_ago: float = 0) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def workload_dict(
    name: str = "wl",
    namespace: str = "team-a",
    *,
    api: str = V1B2,
    queue: str = "default",
    age: float = 60,
    requests: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    count: int = 1,
    annotations: Mapping[str, Any] | None = None,
    labels: Mapping[str, Any] | None = None,
    priority: int | None = 0,
    priority_class: str | None = None,
    admitted_to: str | None = None,
    usage: Mapping[str, Any] | None = None,
    finished: bool = False,
    owner_job: str | None = None,
    owner: tuple[str, str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    created: str | None = None,
    active: bool | None = None,
) -> dict[str, Any]:
    """A Kueue Workload as the API returns it. `owner` = (kind, name) of its controller owner
    (`owner_job`: a batch/v1 Job); `conditions` are added to those `admitted_to` and `finished`
    set; `created` an RFC 3339 creation time instead of `age` seconds before NOW."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "creationTimestamp": created or ts(age),
        "resourceVersion": "1",
    }
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if labels is not None:
        meta["labels"] = dict(labels)
    if owner_job:
        owner = ("Job", owner_job)
    if owner:
        kind, owner_name = owner
        group = {"Job": "batch/v1", "RayJob": "ray.io/v1", "JobSet": "jobset.x-k8s.io/v1alpha2",
                 "Pod": "v1"}.get(kind, "example.com/v1")
        meta["ownerReferences"] = [{"apiVersion": group, "kind": kind, "name": owner_name,
                                    "uid": f"{kind.lower()}-{namespace}-{owner_name}",
                                    "controller": True}]
    res: dict[str, Any] = {"requests": dict(requests or {"cpu": "1", GPU: "1"})}
    if limits:
        res["limits"] = dict(limits)
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [{"name": "main", "count": count,
                     "template": {"spec": {"containers": [{"name": "c", "resources": res}]}}}],
    }
    if priority is not None:
        spec["priority"] = priority
    if active is not None:
        spec["active"] = active
    if priority_class:
        if api == V1B1:
            spec["priorityClassName"] = priority_class
            spec["priorityClassSource"] = "kueue.x-k8s.io/workloadpriorityclass"
        else:
            spec["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                        "name": priority_class}
    obj: dict[str, Any] = {"apiVersion": api, "kind": "Workload", "metadata": meta, "spec": spec}
    conds = []
    if admitted_to:
        conds += [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": ts(age - 1)},
                  {"type": "Admitted", "status": "True", "lastTransitionTime": ts(age - 1)}]
        obj["status"] = {"admission": {"clusterQueue": admitted_to, "podSetAssignments": [
            {"name": "main", "count": count, "resourceUsage": dict(usage or res["requests"])}]}}
    if finished:
        conds.append({"type": "Finished", "status": "True", "lastTransitionTime": ts(0)})
    conds += conditions or []
    if conds:
        obj.setdefault("status", {})["conditions"] = conds
    return obj


def cluster_queue_dict(
    name: str = "cq",
    *,
    api: str = V1B2,
    cohort: str | None = "pool",
    quotas: Mapping[str, Any] | None = None,
    preemption: Mapping[str, Any] | None = None,
    afs: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceGroups": [{
            "coveredResources": list((quotas or {"cpu": "64", GPU: "8"}).keys()),
            "flavors": [{"name": "default", "resources": [
                {"name": k, "nominalQuota": v}
                for k, v in (quotas or {"cpu": "64", GPU: "8"}).items()
            ]}],
        }],
    }
    if cohort:
        spec["cohort" if api == V1B1 else "cohortName"] = cohort
    if preemption:
        spec["preemption"] = dict(preemption)
    if afs:
        spec["admissionScope"] = {"admissionMode": "UsageBasedAdmissionFairSharing"}
    return {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue_dict(namespace: str, name: str = "default", cq: str = "cq",
                     api: str = V1B2) -> dict[str, Any]:
    return {"apiVersion": api, "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cq}}


def job_dict(name: str, namespace: str = "team-a", *, annotations: Mapping[str, Any] | None = None,
             template_annotations: Mapping[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "uid": f"job-{namespace}-{name}"}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    tmeta: dict[str, Any] = {}
    if template_annotations is not None:
        tmeta["annotations"] = dict(template_annotations)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"suspend": True, "template": {"metadata": tmeta, "spec": {"containers": [
                {"name": "c", "resources": {"requests": {GPU: "1"}}}]}}}}


def as_list(*items: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def workload_infos(objs: Iterable[Mapping[str, Any]]) -> dict[str, WorkloadInfo]:
    """The Workloads among `objs` as the snapshot builder observes them, by key (what
    `plan_diff` reads); those that do not parse are left out, as there."""
    out: dict[str, WorkloadInfo] = {}
    for obj in objs:
        if obj.get("kind", "Workload") != "Workload":
            continue
        workload, _ = parse_workload(obj)
        if workload is not None:
            out[workload.key] = WorkloadInfo.of(obj, workload)
    return out


# --------------------------------------------------------------------------------------------
# Domain objects directly (fast, for property tests)


def wl(
    name: str,
    namespace: str = "team-a",
    *,
    wait: float = 0.0,
    gpu: str | None = "1",
    resources: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    admitted: bool = False,
    priority: int | None = 0,
    queue: str = "default",
    count: int = 1,
    owner: str | None = None,
) -> Workload:
    res = {k: Decimal(v) for k, v in (resources or {}).items()}
    if gpu is not None:
        res.setdefault(GPU, Decimal(gpu))
    usage = frozen_resources({k: v * count for k, v in res.items()})
    return Workload(
        namespace=namespace,
        name=name,
        uid=f"uid-{namespace}-{name}",
        api_version=KueueApiVersion.V1BETA2,
        queue_name=queue,
        created=NOW - timedelta(seconds=wait),
        pod_sets=(PodSet("main", count, (Container("c", frozen_resources(res)),)),),
        priority=priority,
        quota_reserved=admitted,
        admitted=admitted,
        admission=Admission("cq", usage) if admitted else None,
        annotations=dict(annotations or {}),
        owner=ObjectRef("Job", owner, namespace, f"job-{namespace}-{owner}", "batch/v1")
        if owner else None,
    )


def job(name: str, namespace: str = "team-a", annotations: Mapping[str, str] | None = None,
        template_annotations: Mapping[str, str] | None = None) -> JobInfo:
    return JobInfo(namespace=namespace, name=name, uid=f"job-{namespace}-{name}",
                   annotations=dict(annotations or {}),
                   template_annotations=dict(template_annotations or {}))


def snapshot(
    workloads: list[Workload],
    *,
    gpus: int = 8,
    cpu: int = 64,
    teams: tuple[str, ...] = ("team-a", "team-b", "team-c"),
    jobs: tuple[JobInfo, ...] = (),
    cq: ClusterQueue | None = None,
) -> ClusterSnapshot:
    queue = cq or ClusterQueue(
        "cq", KueueApiVersion.V1BETA2,
        quotas=(ResourceQuota("default", GPU, Decimal(gpus)),
                ResourceQuota("default", "cpu", Decimal(cpu))),
    )
    namespaces = sorted({*teams, *(w.namespace for w in workloads)})
    return ClusterSnapshot(
        workloads=tuple(workloads),
        cluster_queues=(queue,),
        local_queues=tuple(LocalQueue(ns, "default", queue.name) for ns in namespaces),
        jobs=jobs,
    )


def settings(**changes: Any) -> Settings:
    from controller.config import with_overrides

    return with_overrides(Settings(), **changes)


def carried(w: Workload) -> int:
    """The effective priority `w` carries now: its spec.priority plus Kueue's boost annotation
    (boost mode)."""
    return (w.priority or 0) + int(w.annotations.get(KUEUE_PRIORITY_BOOST_ANNOTATION, "0"))


def written(snap: ClusterSnapshot, plan: Plan, *, boost: bool) -> ClusterSnapshot:
    """The snapshot once the live controller applied `plan`: the terms annotation, and in
    boost mode the boost annotation, else spec.priority where the Workload had none."""
    by_key = {d.key: d for d in plan.decisions}
    out = []
    for w in snap.workloads:
        d = by_key.get(w.key)
        if d is None or d.leave_unchanged:
            out.append(w)
            continue
        ann = {**w.annotations, PRIORITY_TERMS_ANNOTATION: d.terms}
        if boost:
            ann[KUEUE_PRIORITY_BOOST_ANNOTATION] = str(d.target_boost)
            out.append(replace(w, annotations=ann))
        else:
            out.append(replace(w, annotations=ann, priority=d.target_priority
                               if w.priority is None else w.priority))
    return replace(snap, workloads=tuple(out))


def needs_pure_policy() -> None:
    """Skip the test under the compiled planner (tools/compile.py): it replaces a function of
    `controller.policy`, which compiled code calls directly."""
    import pytest

    from controller import policy

    if not policy.__file__.endswith(".py"):
        pytest.skip("replaces a function of controller.policy: needs the pure-Python build")


def plan_without_keep_order(snap: ClusterSnapshot, s: Settings) -> Plan:
    """`compute_plan` with every moved fairness level written (`policy.keep_order` off): the
    reference the kept values are checked against."""
    from controller import policy

    needs_pure_policy()
    saved = policy.keep_order
    policy.keep_order = lambda *_a: None  # type: ignore[assignment]
    try:
        return policy.compute_plan(snap, s, NOW)
    finally:
        policy.keep_order = saved


def kueue_key(d: WorkloadDecision) -> tuple[int, float, str]:
    """Kueue's order of pending Workloads within a queue: priority, queue time, UID."""
    assert d.breakdown is not None
    return (-d.target_priority, d.breakdown.queued_since.timestamp(), d.uid)


def kueue_order(plan: Plan) -> list[str]:
    """Keys of `plan`'s pending Workloads in Kueue's order (`kueue_key`)."""
    return [d.key for d in sorted(plan.pending, key=kueue_key)]


def pending_writes(snap: ClusterSnapshot, plan: Plan) -> list[str]:
    """Keys of the pending Workloads of `snap` that `plan` writes in boost mode (their boost or
    their terms change)."""
    now = {w.key: w for w in snap.workloads}
    out = []
    for d in plan.pending:
        w = now[d.key]
        if d.target_boost != int(w.annotations.get(KUEUE_PRIORITY_BOOST_ANNOTATION, "0")) \
                or d.terms != w.annotations.get(PRIORITY_TERMS_ANNOTATION):
            out.append(d.key)
    return out


def evicted_while_admitted(w: Workload, value: int, terms: str) -> Workload:
    """Pending `w` as Kueue requeues it after evicting it while admitted (PodsReadyTimeout,
    preemption): it still carries the effective priority `value` (boost mode) and the
    priority-terms written then (a guard's or an exposure's)."""
    return replace(w, last_eviction=NOW, annotations={
        **w.annotations, PRIORITY_TERMS_ANNOTATION: terms,
        KUEUE_PRIORITY_BOOST_ANNOTATION: str(value - (w.priority or 0))})


# -- fuzzing raw objects ------------------------------------------------------------------------


def json_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a decoded JSON object (keys and list indices)."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += json_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += json_paths(v, (*prefix, i))
    return out


def set_at(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    """Replace the value at `path` (from `json_paths`) in place."""
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def compile_tool() -> ModuleType:
    """This tree's tools/compile.py (not a package): the modules it compiles, the stamp it
    writes and the hashes of their sources."""
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("compile_tool", root / "tools" / "compile.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool
