"""Plan + current objects -> the minimal writes (pure; no I/O).

Every function here compares a decision with the object as the cache holds it and returns
only what differs, so a steady cycle produces no `Change` at all.

Every Workload, Job and Pod write is a compare-and-swap JSON patch (`workload.compare_and_swap`):
its first op tests `/metadata/uid` (a patch computed for an object that was deleted never lands
on a new one with the same name), then it tests the value as read (or the absence) of every
field it replaces. A write computed from a stale read fails as a whole with 422; the applier
counts it as a conflict and the next cycle plans again from fresh state.

* boost mode: `kueue.x-k8s.io/priority-boost` only (removed when the boost is 0). A base
  priority left behind by spec mode is restored in the same patch.
* spec mode: `test`s the `spec.priority` it read, sets the target, and keeps the base priority
  in `wdrf.x-k8s.io/base-priority` and the target it wrote in `wdrf.x-k8s.io/applied-priority`
  (both dropped once the priority is back at the base). A boost annotation left behind by
  boost mode is removed.
* In both modes the decision's terms (`wdrf.x-k8s.io/priority-terms`) go in the same patch
  whenever the priority is written.
* HAMi: template annotations and the GPU fraction (container resources, by index, each
  container's name tested) of a suspended, never-started owner Job, with `test /spec/suspend
  == true` so a Job Kueue has just unsuspended is never touched; annotations of a pod group's
  gated pods.
* `plan_diff`: all of the above for a whole plan, from the Workloads the plan read
  (`controller.workload.WorkloadInfo`) and lookups into the Job and pod caches.

Anything that should be written but cannot be is returned as a `Notice` (an Event to emit).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from controller.domain import GPU, GPUCORES, GPUMEM_PERCENTAGE, ObjectRef
from controller.hami import fraction_values, resource_changes, template_annotation_changes
from controller.live.api import JSON, JSON_PATCH, Resource
from controller.plan import HamiDecision, PriorityMode, WorkloadDecision
from controller.workload import (
    PriorityTarget,
    WorkloadInfo,
    annotation_ops,
    annotations_of,
    compare_and_swap,
    meta,
    pointer,
    priority_patch,
)

ADMISSION_GATE = "kueue.x-k8s.io/admission"


class What(enum.StrEnum):
    """What a change is about (the `what` label in logs and metrics, and the Event reason)."""

    PRIORITY = "priority"
    HAMI_ANNOTATIONS = "hami-annotations"
    GPU_FRACTION = "gpu-fraction"


PRIORITY, HAMI_ANNOTATIONS, GPU_FRACTION = What.PRIORITY, What.HAMI_ANNOTATIONS, What.GPU_FRACTION


@dataclass(frozen=True, slots=True)
class Notice:
    """An Event to emit: something the operator or user should know about one object."""

    ref: ObjectRef
    reason: str
    message: str
    type: str = "Warning"


@dataclass(frozen=True, slots=True)
class Change:
    """One minimal write to one object."""

    ref: ObjectRef
    resource: Resource
    what: What
    content_type: str
    # The request body, or a function of no arguments that builds it again (`body`): a
    # priority patch is built when it is sent, since all but WRITE_BUDGET of a cold start's
    # changes wait for a later cycle (their patches were about 2 KB each, 100 MiB at 50,000).
    patch: Any
    summary: str  # human text for the log and the success Event
    decision: WorkloadDecision
    mode: PriorityMode | None = None
    old_terms: str | None = None  # the terms annotation before this write (priority only)

    @property
    def body(self) -> Any:
        """The request body."""
        return self.patch() if callable(self.patch) else self.patch

    @property
    def namespace(self) -> str:
        return self.ref.namespace

    @property
    def name(self) -> str:
        return self.ref.name


@dataclass(frozen=True, slots=True)
class Diff:
    changes: tuple[Change, ...] = ()
    notices: tuple[Notice, ...] = ()


@dataclass
class _Builder:
    changes: list[Change] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)

    def add(self, item: Change | Notice | None) -> None:
        if isinstance(item, Change):
            self.changes.append(item)
        elif isinstance(item, Notice):
            self.notices.append(item)

    def freeze(self) -> Diff:
        return Diff(tuple(self.changes), tuple(self.notices))


def ref_of(obj: Mapping[str, Any], resource: Resource) -> ObjectRef:
    m = meta(obj)
    return ObjectRef(
        resource.kind,
        str(m.get("name", "")),
        str(m.get("namespace", "") or ""),
        str(m.get("uid", "")),
        resource.api_version,
    )


# -- priority ---------------------------------------------------------------------------


def diff_priority(
    decision: WorkloadDecision, workload: Mapping[str, Any], resource: Resource,
    mode: PriorityMode,
) -> Change | None:
    """The write (if any) that brings one Workload's priority to the decision
    (`controller.workload.priority_patch`)."""
    if decision.leave_unchanged:
        return None
    target = PriorityTarget(decision.base_priority, decision.target_priority,
                            decision.target_boost, decision.terms, pending=not decision.admitted)
    patch = priority_patch(workload, mode, target)
    if patch is None:
        return None
    return Change(ref_of(workload, resource), resource, PRIORITY, JSON_PATCH,
                  partial(_priority_ops, workload, mode, target), patch.summary, decision,
                  mode, patch.old_terms)


def _priority_ops(workload: Mapping[str, Any], mode: PriorityMode,
                  target: PriorityTarget) -> list[JSON]:
    """The ops of `priority_patch` again (a pure function of the object as read, which the
    cache replaces and never changes)."""
    patch = priority_patch(workload, mode, target)
    if patch is None:  # cannot be: the same inputs gave a patch when the change was made
        raise ValueError("a priority patch could not be built again from the same inputs")
    return patch.ops


# -- HAMi on the owner Job ----------------------------------------------------------------


def job_is_pristine(job: Mapping[str, Any]) -> bool:
    """Suspended and never started: its pod template may still change."""
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    return bool(spec.get("suspend")) and not status.get("startTime")


def _template(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((job.get("spec") or {}).get("template")) or {}


def diff_job_hami(
    decision: WorkloadDecision,
    job: JSON,
    job_resource: Resource,
    resources_mutable: bool | None,
) -> Diff:
    """HAMi annotations and GPU fraction on a Job's pod template (what differs from the
    decision: `controller.hami.template_annotation_changes` and `resource_changes`).

    `resources_mutable`: None = not known yet (try), False = the cluster refused before. The
    fraction is not written where the plan says why not (`HamiDecision.fraction_blocked`).
    """
    hami = decision.hami
    out = _Builder()
    if decision.leave_unchanged or hami is None:
        return out.freeze()
    ref = ref_of(job, job_resource)
    tmpl_ann = annotations_of(_template(job))
    missing = template_annotation_changes(tmpl_ann, hami)
    fraction = container_fraction_patch(job, hami)
    if not job_is_pristine(job):
        if missing or fraction:
            out.add(Notice(ref, "HamiSettingsNotApplied",
                           "HAMi settings not applied: the Job is not suspended or has already "
                           "started, so its pod template can no longer change."))
        return out.freeze()
    guard = [{"op": "test", "path": "/spec/suspend", "value": True}]
    if missing:
        ops = list(guard)
        if not isinstance(meta(_template(job)).get("annotations"), Mapping):
            if not isinstance(_template(job).get("metadata"), Mapping):
                ops.append({"op": "add", "path": pointer("spec", "template", "metadata"),
                            "value": {}})
            ops.append({"op": "add", "path": pointer("spec", "template", "metadata",
                                                     "annotations"), "value": {}})
        ops += [{"op": "add", "path": pointer("spec", "template", "metadata", "annotations", k),
                 "value": v} for k, v in sorted(missing.items())]
        text = ", ".join(f"{k}={v}" for k, v in sorted(missing.items()))
        out.add(Change(ref, job_resource, HAMI_ANNOTATIONS, JSON_PATCH,
                       compare_and_swap(job, ops), f"pod template annotations {text}",
                       decision))
    if fraction:
        if hami.fraction_blocked:
            out.add(Notice(ref, "GpuFractionNotApplied",
                           f"GPU fraction ({fraction_text(hami)}) not applied: "
                           f"{hami.fraction_blocked}"))
        elif resources_mutable is False:
            out.add(fraction_refused_notice(ref, hami))
        else:
            out.add(Change(ref, job_resource, GPU_FRACTION, JSON_PATCH,
                           compare_and_swap(job, guard + fraction),
                           f"GPU fraction {fraction_text(hami)}", decision))
    return out.freeze()


def fraction_text(hami: HamiDecision) -> str:
    parts = []
    if hami.gpucores is not None:
        parts.append(f"{GPUCORES}={hami.gpucores}")
    if hami.gpumem_percentage is not None:
        parts.append(f"{GPUMEM_PERCENTAGE}={hami.gpumem_percentage}")
    return ", ".join(parts)


def fraction_refused_notice(ref: ObjectRef, hami: HamiDecision) -> Notice:
    return Notice(
        ref, "GpuFractionNotApplied",
        f"GPU fraction ({fraction_text(hami)}) not applied: this cluster does not allow "
        "changing container resources of a suspended Job (needs Kubernetes >= 1.36 with "
        "MutablePodResourcesForSuspendedJobs). Set the resources in the Job instead.",
    )


def container_fraction_patch(job: Mapping[str, Any], hami: HamiDecision) -> list[JSON]:
    """JSON patch ops setting the fraction on every GPU container where it differs (each
    container addressed by index, its name tested first); [] when nothing differs."""
    want = fraction_values(hami)
    if not want:
        return []
    pod_spec = _template(job).get("spec") or {}
    ops: list[JSON] = []
    for i, container in enumerate(pod_spec.get("containers") or []):
        ops += _container_fraction(i, container, want)
    return ops


def _container_fraction(index: int, container: Mapping[str, Any],
                        want: Mapping[str, str]) -> list[JSON]:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if GPU not in limits and GPU not in requests:
        return []
    base = ("spec", "template", "spec", "containers", str(index), "resources")
    ops: list[JSON] = []
    # Extended resources need requests == limits when both are set: write both where GPU is.
    for section_name, section in (("limits", limits), ("requests", requests)):
        if GPU not in section:
            continue
        for k, v in resource_changes(section, want).items():
            ops.append({"op": "add", "path": pointer(*base, section_name, k), "value": v})
    if not ops:
        return []
    return [{"op": "test", "path": pointer("spec", "template", "spec", "containers",
                                           str(index), "name"),
             "value": container.get("name")}, *ops]


# -- HAMi on a pod group's gated pods -----------------------------------------------------


def pod_is_gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def diff_pods_hami(
    decision: WorkloadDecision, pods: Sequence[JSON], pod_resource: Resource
) -> Diff:
    """HAMi annotations on the gated pods of a pod group (resources of a pod cannot change)."""
    hami = decision.hami
    out = _Builder()
    if decision.leave_unchanged or hami is None:
        return out.freeze()
    for pod in pods:
        if not pod_is_gated(pod):
            continue
        ref = ref_of(pod, pod_resource)
        missing = template_annotation_changes(annotations_of(pod), hami)
        if missing:
            text = ", ".join(f"{k}={v}" for k, v in sorted(missing.items()))
            # UID-tested like every Workload and Job patch: a pod deleted and recreated under
            # the same name (a pod group's replacement) is never patched with this intent.
            ops = compare_and_swap(pod, annotation_ops(pod, missing, ()))
            out.add(Change(ref, pod_resource, HAMI_ANNOTATIONS, JSON_PATCH, ops,
                           f"pod annotations {text}", decision))
        if container_fraction_patch(
            {"spec": {"template": {"spec": pod.get("spec") or {}}}}, hami
        ):
            out.add(Notice(ref, "GpuFractionNotApplied",
                           f"GPU fraction ({fraction_text(hami)}) not applied: container "
                           "resources of a pod cannot change. Set them when creating the pods."))
    return out.freeze()


# -- after a conflict -----------------------------------------------------------------------


def redo(change: Change, fresh: JSON, resources_mutable: bool | None = None) -> Change | None:
    """The same intent recomputed against a freshly read object (after 409 / failed test).
    None when there is nothing left to do, or when the object is not the one the change was
    computed for (deleted and recreated under the same name: another UID)."""
    if change.ref.uid and str(meta(fresh).get("uid") or "") != change.ref.uid:
        return None
    if change.what == PRIORITY and change.mode is not None:
        return diff_priority(change.decision, fresh, change.resource, change.mode)
    if change.resource.kind == "Pod":
        candidates = diff_pods_hami(change.decision, [fresh], change.resource).changes
    else:
        candidates = diff_job_hami(
            change.decision, fresh, change.resource, resources_mutable
        ).changes
    return next((c for c in candidates if c.what == change.what), None)


# -- a whole plan -----------------------------------------------------------------------------


Lookup = Callable[[str], JSON | None]


def plan_diff(
    decisions: Sequence[WorkloadDecision],
    mode: PriorityMode,
    workload_resource: Resource,
    workloads: Mapping[str, WorkloadInfo],
    job: Lookup,
    pods_by_uid: Mapping[str, JSON],
    fraction_refused: Callable[[str], bool] = lambda _uid: False,
    job_resource: Resource | None = None,
    pod_resource: Resource | None = None,
) -> Diff:
    """Every write (HAMi first, then priorities) and notice for the decisions of a plan.

    `workloads`: the Workloads the plan was computed from, by "namespace/name" (each write is
    computed against the very object the plan read); `job(key)` looks an owner Job up in the
    cache by "namespace/name"; `fraction_refused(job_uid)`: the cluster refused that Job's
    GPU-fraction change before. Decisions for admitted Workloads get their priority written,
    nothing else."""
    from controller.live.api import JOBS, PODS

    jobs_res = job_resource or JOBS
    pods_res = pod_resource or PODS
    hami: list[Change] = []
    priority: list[Change] = []
    notices: list[Notice] = []
    for d in decisions:
        if d.leave_unchanged:
            continue
        info = workloads.get(d.key)
        if info is None:
            continue
        change = diff_priority(d, info.obj, workload_resource, mode)
        if change is not None:
            priority.append(change)
        if d.hami is None or d.admitted:
            continue
        if info.owner_job_key is not None:
            owner_job = job(info.owner_job_key)
            if owner_job is None:
                continue
            uid = str(meta(owner_job).get("uid") or "")
            if not uid or uid != info.owner_job_uid:
                continue  # not the Job the reference names (recreated, or a forged reference)
            part = diff_job_hami(d, owner_job, jobs_res,
                                 False if fraction_refused(uid) else None)
        else:
            owned = [pods_by_uid[uid] for uid in info.owner_uids if uid in pods_by_uid]
            part = diff_pods_hami(d, owned, pods_res)
        hami.extend(part.changes)
        notices.extend(part.notices)
    return Diff(tuple(hami + priority), tuple(notices))
