"""Plan + current objects -> the minimal writes (pure; no I/O).

Every function here compares a decision with the object as the cache holds it and returns
only what differs, so a steady cycle produces no `Change` at all.

* boost mode: a merge patch of `kueue.x-k8s.io/priority-boost` only (removed when the boost is
  0). A base priority left behind by spec mode is restored in the same patch.
* spec mode: a JSON patch that `test`s the `spec.priority` it read, sets the target, and keeps
  the base priority in `wdrf.x-k8s.io/base-priority` and the target it wrote in
  `wdrf.x-k8s.io/applied-priority` (both dropped once the priority is back at the base). A
  boost annotation left behind by boost mode is removed.
* HAMi: template annotations of a suspended, never-started owner Job (merge patch), GPU
  fraction as container resources of that Job (strategic merge patch, by container name) when
  the cluster allows it, or annotations of a pod group's gated pods.

Anything that should be written but cannot be is returned as a `Notice` (an Event to emit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.domain import (
    APPLIED_PRIORITY_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    GPU,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    ObjectRef,
)
from controller.live.api import JSON, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, Resource
from controller.plan import HamiDecision, PriorityMode, WorkloadDecision
from controller.policy import implied_base

ADMISSION_GATE = "kueue.x-k8s.io/admission"

# What a change is about (also the `what` label in logs and the Event reason).
PRIORITY = "priority"
HAMI_ANNOTATIONS = "hami-annotations"
GPU_FRACTION = "gpu-fraction"


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
    what: str
    content_type: str
    body: Any
    summary: str  # human text for the log and the success Event
    decision: WorkloadDecision
    mode: PriorityMode | None = None

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


def pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901) from raw path segments."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    ann = _meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def ref_of(obj: Mapping[str, Any], resource: Resource) -> ObjectRef:
    meta = _meta(obj)
    return ObjectRef(
        resource.kind,
        str(meta.get("name", "")),
        str(meta.get("namespace", "") or ""),
        str(meta.get("uid", "")),
        resource.api_version,
    )


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# -- priority ---------------------------------------------------------------------------


def diff_priority(
    decision: WorkloadDecision, workload: JSON, resource: Resource, mode: PriorityMode
) -> Change | None:
    """The write (if any) that brings one Workload's priority to the decision."""
    if decision.leave_unchanged:
        return None
    if mode is PriorityMode.BOOST:
        return _boost_change(decision, workload, resource)
    if mode is PriorityMode.SPEC:
        return _spec_change(decision, workload, resource)
    raise ValueError(f"priority mode {mode} must be resolved before diffing")


def _boost_change(decision: WorkloadDecision, wl: JSON, resource: Resource) -> Change | None:
    ann = annotations_of(wl)
    want = str(decision.target_boost) if decision.target_boost != 0 else None
    have = ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION)
    annotations: dict[str, str | None] = {}
    body: dict[str, Any] = {}
    if have != want:
        annotations[KUEUE_PRIORITY_BOOST_ANNOTATION] = want
    # Left over from spec mode: put the base priority back and forget it.
    if APPLIED_PRIORITY_ANNOTATION in ann:
        annotations[APPLIED_PRIORITY_ANNOTATION] = None
    if BASE_PRIORITY_ANNOTATION in ann:
        annotations[BASE_PRIORITY_ANNOTATION] = None
        spec_priority = _int_or_none((wl.get("spec") or {}).get("priority"))
        if spec_priority != decision.base_priority:
            body["spec"] = {"priority": decision.base_priority}
    if not annotations:
        return None
    body["metadata"] = {"annotations": annotations}
    summary = f"priority boost {have or 0} -> {want or 0}"
    if "spec" in body:
        summary += f", spec.priority restored to base {decision.base_priority}"
    return Change(
        ref_of(wl, resource), resource, PRIORITY, MERGE_PATCH, body, summary, decision,
        PriorityMode.BOOST,
    )


def _spec_change(decision: WorkloadDecision, wl: JSON, resource: Resource) -> Change | None:
    ann = annotations_of(wl)
    have = _int_or_none((wl.get("spec") or {}).get("priority"))
    if BASE_PRIORITY_ANNOTATION in ann and implied_base(have, ann) != decision.base_priority:
        # Someone set a new base since the plan was made (seen when re-reading after a failed
        # `test`): never overwrite it with the old base; the next cycle plans from it.
        return None
    target = decision.target_priority
    keep_base = target != decision.base_priority
    ann_ops: list[JSON] = []
    if keep_base:
        # The base, and the value written here (so a later spec.priority that is neither tells
        # a new base from Kueue's reset and from our own write; see policy.implied_base).
        for key, text in ((BASE_PRIORITY_ANNOTATION, str(decision.base_priority)),
                          (APPLIED_PRIORITY_ANNOTATION, str(target))):
            if ann.get(key) != text:
                ann_ops.append({"op": "add", "path": pointer("metadata", "annotations", key),
                                "value": text})
        if ann_ops and ("annotations" not in _meta(wl) or _meta(wl).get("annotations") is None):
            ann_ops.insert(0, {"op": "add", "path": pointer("metadata", "annotations"),
                               "value": {}})
    else:
        for key in (BASE_PRIORITY_ANNOTATION, APPLIED_PRIORITY_ANNOTATION):
            if key in ann:
                ann_ops.append({"op": "remove", "path": pointer("metadata", "annotations", key)})
    # Left over from boost mode: spec.priority now carries the whole target.
    if KUEUE_PRIORITY_BOOST_ANNOTATION in ann:
        ann_ops.append({"op": "remove", "path": pointer(
            "metadata", "annotations", KUEUE_PRIORITY_BOOST_ANNOTATION)})
    if have == target and not ann_ops:
        return None
    ops: list[JSON] = []
    if have is not None:
        # Only if nobody changed it since we read it (Kueue, a user): else re-read.
        ops.append({"op": "test", "path": pointer("spec", "priority"), "value": have})
    if have != target:
        ops.append({"op": "add", "path": pointer("spec", "priority"), "value": target})
    ops += ann_ops
    summary = f"spec.priority {have} -> {target} (base {decision.base_priority})"
    return Change(
        ref_of(wl, resource), resource, PRIORITY, JSON_PATCH, ops, summary, decision,
        PriorityMode.SPEC,
    )


# -- HAMi on the owner Job ----------------------------------------------------------------


def job_is_pristine(job: Mapping[str, Any]) -> bool:
    """Suspended and never started: its pod template may still change."""
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    return bool(spec.get("suspend")) and not status.get("startTime")


def _template(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((job.get("spec") or {}).get("template")) or {}


def missing_annotations(
    have: Mapping[str, str], want: Mapping[str, str]
) -> dict[str, str]:
    return {k: v for k, v in want.items() if have.get(k) != v}


def diff_job_hami(
    decision: WorkloadDecision,
    job: JSON,
    job_resource: Resource,
    resources_mutable: bool | None,
    fraction_blocked: str = "",
) -> Diff:
    """HAMi annotations and GPU fraction on a Job's pod template.

    `resources_mutable`: None = not known yet (try), False = the cluster refused before.
    `fraction_blocked`: why the fraction must not be written (e.g. the ClusterQueue does not
    cover `nvidia.com/gpucores`, so Kueue would never admit the Workload); "" = no reason.
    """
    hami = decision.hami
    out = _Builder()
    if decision.leave_unchanged or hami is None:
        return out.freeze()
    ref = ref_of(job, job_resource)
    tmpl_ann = annotations_of(_template(job))
    missing = missing_annotations(tmpl_ann, hami.annotations)
    fraction = container_fraction_patch(job, hami)
    if not job_is_pristine(job):
        if missing or fraction:
            out.add(Notice(ref, "HamiSettingsNotApplied",
                           "HAMi settings not applied: the Job is not suspended or has already "
                           "started, so its pod template can no longer change."))
        return out.freeze()
    if missing:
        body = {"spec": {"template": {"metadata": {"annotations": missing}}}}
        text = ", ".join(f"{k}={v}" for k, v in sorted(missing.items()))
        out.add(Change(ref, job_resource, HAMI_ANNOTATIONS, MERGE_PATCH, body,
                       f"pod template annotations {text}", decision))
    if fraction:
        if fraction_blocked:
            out.add(Notice(ref, "GpuFractionNotApplied",
                           f"GPU fraction ({fraction_text(hami)}) not applied: "
                           f"{fraction_blocked}"))
        elif resources_mutable is False:
            out.add(fraction_refused_notice(ref, hami))
        else:
            out.add(Change(ref, job_resource, GPU_FRACTION, STRATEGIC_MERGE_PATCH, fraction,
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


def _fraction_values(hami: HamiDecision) -> dict[str, str]:
    want: dict[str, str] = {}
    if hami.gpucores is not None:
        want[GPUCORES] = str(hami.gpucores)
    if hami.gpumem_percentage is not None:
        want[GPUMEM_PERCENTAGE] = str(hami.gpumem_percentage)
    return want


def container_fraction_patch(job: Mapping[str, Any], hami: HamiDecision) -> JSON | None:
    """Strategic merge patch setting the fraction on every GPU container where it differs."""
    want = _fraction_values(hami)
    if not want:
        return None
    pod_spec = _template(job).get("spec") or {}
    patched: list[JSON] = []
    for container in pod_spec.get("containers") or []:
        entry = _container_fraction(container, want)
        if entry:
            patched.append(entry)
    if not patched:
        return None
    return {"spec": {"template": {"spec": {"containers": patched}}}}


def _container_fraction(container: Mapping[str, Any], want: Mapping[str, str]) -> JSON | None:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if GPU not in limits and GPU not in requests:
        return None
    new: JSON = {}
    # Extended resources need requests == limits when both are set: write both where GPU is.
    for section_name, section in (("limits", limits), ("requests", requests)):
        if GPU not in section:
            continue
        delta = {k: v for k, v in want.items() if str(section.get(k)) != v}
        if delta:
            new[section_name] = delta
    if not new:
        return None
    return {"name": container.get("name"), "resources": new}


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
        missing = missing_annotations(annotations_of(pod), hami.annotations)
        if missing:
            text = ", ".join(f"{k}={v}" for k, v in sorted(missing.items()))
            out.add(Change(ref, pod_resource, HAMI_ANNOTATIONS, MERGE_PATCH,
                           {"metadata": {"annotations": missing}},
                           f"pod annotations {text}", decision))
        if _fraction_values(hami) and container_fraction_patch(
            {"spec": {"template": {"spec": pod.get("spec") or {}}}}, hami
        ):
            out.add(Notice(ref, "GpuFractionNotApplied",
                           f"GPU fraction ({fraction_text(hami)}) not applied: container "
                           "resources of a pod cannot change. Set them when creating the pods."))
    return out.freeze()


# -- after a conflict -----------------------------------------------------------------------


def redo(change: Change, fresh: JSON, resources_mutable: bool | None = None) -> Change | None:
    """The same intent recomputed against a freshly read object (after 409 / failed test)."""
    if change.what == PRIORITY and change.mode is not None:
        return diff_priority(change.decision, fresh, change.resource, change.mode)
    if change.resource.kind == "Pod":
        candidates = diff_pods_hami(change.decision, [fresh], change.resource).changes
    else:
        candidates = diff_job_hami(
            change.decision, fresh, change.resource, resources_mutable
        ).changes
    return next((c for c in candidates if c.what == change.what), None)
