"""MultiKueue: which ClusterQueues dispatch to worker clusters, and what must not be written there.

Kueue's MultiKueue copies a manager Workload's metadata and spec onto each worker once, when it
dispatches it. Afterwards it compares only the specs: a remote copy whose spec differs from the
manager's is deleted, unless the difference is a priority change of a Workload whose class is a
WorkloadPriorityClass (that one is forwarded). Annotation changes are never forwarded. Hence:

* manager, spec mode: writing spec.priority of a Workload without a WorkloadPriorityClass would
  make MultiKueue delete its remote copies (the running one included). Never written.
* manager, boost mode: the boost orders the manager's queue (dispatch order); a change after
  dispatch does not reach the workers. Written, and said once per ClusterQueue.
* worker (a copy carrying the MultiKueue origin label), spec mode: the manager would see the
  copy's spec differ and delete it or overwrite it. Never written. Boost mode stays effective.

On a worker, the controller orders the copies in boost mode, with their classes read from the
manager: `classes_from_manager` replaces each copy's class annotations (and its owner Job,
JobSet, ...) by those of the manager's Workload of the same namespace and name and of that
Workload's owner. The
copy's own annotations are a snapshot taken at dispatch that MultiKueue never updates, and on a
worker they could be set by someone with rights there only; the manager's are current and
guarded by the manager's admission policy.

Pure: `guard_plan` turns a plan into one that leaves those Workloads unchanged, with a problem on
each and a warning per ClusterQueue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from controller.domain import (
    APPROVED_ANNOTATION,
    MULTIKUEUE_ORIGIN_LABEL,
    OWNER_KINDS,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
    ClusterSnapshot,
    InputProblem,
    JobInfo,
    ObjectRef,
    OwnerInfo,
    PriorityMode,
    Workload,
    api_group,
)
from controller.plan import Plan, WorkloadDecision


def multikueue_queues(snapshot: ClusterSnapshot) -> Mapping[str, str]:
    """ClusterQueue name -> the MultiKueue AdmissionCheck it names (the first, by name)."""
    checks = {a.name for a in snapshot.admission_checks if a.multikueue}
    out: dict[str, str] = {}
    for cq in snapshot.cluster_queues:
        found = sorted(c for c in cq.admission_checks if c in checks)
        if found:
            out[cq.name] = found[0]
    return MappingProxyType(out)


def is_remote_copy(workload: Workload) -> bool:
    """A worker's copy of a manager Workload (MultiKueue labels each copy with its origin)."""
    return MULTIKUEUE_ORIGIN_LABEL in workload.labels


# What decides a Workload's class (classify.read_class, read_override).
CLASS_INPUTS = (URGENT_ANNOTATION, APPROVED_ANNOTATION, PRIORITY_OVERRIDE_ANNOTATION)


# Why a copy's class is unknown (`FromManager.unknown`; the reason label of
# wdrf_multikueue_held_copies).
ORIGIN_UNKNOWN = "origin-unknown"  # its manager Workload, or that Workload's owner, is not known
OWNER_NOT_READ = "owner-not-read"  # its manager Workload's owner is of a kind not read there


@dataclass(frozen=True, slots=True)
class FromManager:
    snapshot: ClusterSnapshot
    # copies whose class is unknown -> why (ORIGIN_UNKNOWN, OWNER_NOT_READ)
    unknown: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def classes_from_manager(
    snapshot: ClusterSnapshot,
    manager_workload: Callable[[str], Workload | None],
    manager_job: Callable[[str, str], JobInfo | None],
    manager_owner: Callable[[str, ObjectRef], OwnerInfo | None] | None = None,
    owner_kinds_read: frozenset[str] = frozenset(),
) -> FromManager:
    """A worker's snapshot in which every MultiKueue copy carries the class inputs of its
    manager Workload (looked up by "namespace/name") and has that Workload's batch/v1 Job
    (looked up by namespace, name) as its owner; the copy's own class annotations and its
    worker-side Job count for nothing. A copy whose manager Workload, or that Workload's Job,
    is not found is named in `unknown` (`hold_unknown` leaves it unchanged: planning it as
    normal could demote an urgent one while the manager cannot be read). A copy whose manager
    Workload is owned by another kind whose objects users annotate (OWNER_KINDS: a JobSet, a
    RayJob, ...) takes that owner on the manager (`manager_owner(namespace, ref)`) where the
    manager's objects of that kind are read (`owner_kinds_read`, "group/Kind"); where they are
    not (the manager does not serve the kind, or forbids reading it), its class is not known
    either. (A pod group's class is on its Workload, which is read.) Other Workloads are
    unchanged."""
    if not any(is_remote_copy(w) for w in snapshot.workloads):
        return FromManager(snapshot)
    workloads: list[Workload] = []
    unknown: dict[str, str] = {}
    replaced_jobs: set[tuple[str, str]] = set()
    manager_jobs: dict[tuple[str, str], JobInfo] = {}
    replaced_owners: set[tuple[str, str, str]] = set()
    manager_owners: dict[tuple[str, str, str], OwnerInfo] = {}
    for w in snapshot.workloads:
        if not is_remote_copy(w):
            workloads.append(w)
            continue
        if w.owner is not None and w.owner.is_batch_job:
            replaced_jobs.add((w.namespace, w.owner.name))
        elif w.owner is not None:
            replaced_owners.add((w.namespace, w.owner.kind, w.owner.name))
        origin = manager_workload(w.key)
        ann = {k: v for k, v in w.annotations.items() if k not in CLASS_INPUTS}
        owner: ObjectRef | None = None
        if origin is None:
            unknown[w.key] = ORIGIN_UNKNOWN
        else:
            ann.update({k: origin.annotations[k] for k in CLASS_INPUTS
                        if k in origin.annotations})
            if origin.owner is not None and origin.owner.is_batch_job:
                job = manager_job(origin.namespace, origin.owner.name)
                if job is None:
                    unknown[w.key] = ORIGIN_UNKNOWN
                else:
                    owner = origin.owner
                    manager_jobs[(job.namespace, job.name)] = job
            elif origin.owner is not None and (kind := _annotated_kind(origin.owner)):
                info = manager_owner(origin.namespace, origin.owner) if (
                    manager_owner is not None and kind in owner_kinds_read) else None
                if info is not None:
                    owner = origin.owner
                    manager_owners[(info.namespace, info.kind, info.name)] = info
                else:
                    unknown[w.key] = (ORIGIN_UNKNOWN if kind in owner_kinds_read
                                      else OWNER_NOT_READ)
        workloads.append(dataclasses.replace(w, annotations=MappingProxyType(ann), owner=owner))
    jobs = [j for j in snapshot.jobs if (j.namespace, j.name) not in replaced_jobs
            and (j.namespace, j.name) not in manager_jobs]
    owners = [o for o in snapshot.owners if (key := (o.namespace, o.kind, o.name))
              not in replaced_owners and key not in manager_owners]
    return FromManager(dataclasses.replace(snapshot, workloads=tuple(workloads),
                                           jobs=(*jobs, *manager_jobs.values()),
                                           owners=(*owners, *manager_owners.values())),
                       MappingProxyType(unknown))


def _annotated_kind(owner: ObjectRef) -> str:
    """"group/Kind" of an owner whose objects carry the class annotations (OWNER_KINDS, besides
    batch/v1 Job), else ""."""
    kind = f"{api_group(owner.api_version)}/{owner.kind}"
    return kind if kind in OWNER_KINDS else ""


@dataclass(frozen=True, slots=True)
class Held:
    plan: Plan
    # reason (ORIGIN_UNKNOWN, OWNER_NOT_READ) -> copies left unchanged for it
    counts: Mapping[str, int]


def hold_unknown(plan: Plan, unknown: Mapping[str, str]) -> Held:
    """The plan with every copy whose class is unknown left unchanged, with a problem that
    says why, and how many were left so per reason."""
    if not unknown:
        return Held(plan, MappingProxyType({}))
    decisions = []
    counts: dict[str, int] = {}
    for d in plan.decisions:
        why = unknown.get(d.key)
        if why is not None and not d.leave_unchanged:
            namespace, _, name = d.key.partition("/")
            problem = InputProblem(ObjectRef("Workload", name, namespace, d.uid),
                                   f"metadata.labels[{MULTIKUEUE_ORIGIN_LABEL}]", d.key,
                                   _HOLD_MESSAGES[why])
            d = dataclasses.replace(d, leave_unchanged=True, problems=(*d.problems, problem))
            counts[why] = counts.get(why, 0) + 1
        decisions.append(d)
    return Held(dataclasses.replace(plan, decisions=tuple(decisions)),
                MappingProxyType(counts))


_HOLD_MESSAGES = {
    ORIGIN_UNKNOWN: "a MultiKueue copy whose manager Workload or its owner is not known (yet): "
                    "its class is unknown; left unchanged",
    OWNER_NOT_READ: "a MultiKueue copy whose manager Workload is owned by a kind other than a "
                    "batch/v1 Job (JobSet, RayJob, ...) that the manager does not serve or "
                    "lets this controller read: the class annotations on that object are not "
                    "read, so its class is unknown; left unchanged (it keeps its own priority, "
                    "e.g. the class stand-in it was created with)",
}


@dataclass(frozen=True, slots=True)
class Guarded:
    plan: Plan
    # ClusterQueue ("-" when none) -> Workloads left unchanged because of MultiKueue
    skipped: Mapping[str, int]


def guard_plan(plan: Plan, snapshot: ClusterSnapshot, mode: PriorityMode) -> Guarded:
    """The plan with every priority write MultiKueue would undo or turn into a deletion
    replaced by leave-unchanged, a problem on the decision and a warning naming the
    ClusterQueue. `mode` is the resolved write mode (BOOST or SPEC)."""
    queues = multikueue_queues(snapshot)
    workloads = {w.key: w for w in snapshot.workloads}
    skipped: dict[str, int] = {}
    warnings: dict[str, str] = {}
    decisions: list[WorkloadDecision] = []
    for d in plan.decisions:
        wl = workloads.get(d.key)
        cq = d.cluster_queue or "-"
        why = _why_not(d, wl, queues.get(cq), mode) if wl is not None else ""
        if why:
            skipped[cq] = skipped.get(cq, 0) + 1
            problem = InputProblem(wl.ref if wl is not None else ObjectRef("Workload", d.key),
                                   "spec.priority", str(d.current_priority), why)
            d = dataclasses.replace(d, leave_unchanged=True, problems=(*d.problems, problem))
        decisions.append(d)
        if cq in queues and cq not in warnings:
            warnings[cq] = _queue_warning(cq, queues[cq], mode)
    if not warnings and not skipped:
        return Guarded(plan, MappingProxyType({}))
    for cq, n in sorted(skipped.items()):
        if cq not in queues:
            warnings[cq] = (f"MultiKueue: {n} worker copies of manager Workloads in ClusterQueue "
                            f"{cq} left unchanged (spec mode would make the manager delete or "
                            "overwrite them; use PRIORITY_MODE=boost on workers)")
    new = dataclasses.replace(
        plan, decisions=tuple(decisions),
        warnings=(*plan.warnings, *(warnings[k] for k in sorted(warnings))))
    return Guarded(new, MappingProxyType(skipped))


def _why_not(d: WorkloadDecision, wl: Workload, check: str | None, mode: PriorityMode) -> str:
    if mode is not PriorityMode.SPEC or d.leave_unchanged:
        return ""
    if is_remote_copy(wl):
        return ("a MultiKueue worker copy: writing spec.priority would make the manager delete "
                "or overwrite it; left unchanged (boost mode orders it)")
    if check is not None and not wl.workload_priority_class:
        return (f"ClusterQueue {d.cluster_queue} dispatches through MultiKueue (AdmissionCheck "
                f"{check}): writing spec.priority of a Workload without a WorkloadPriorityClass "
                "would make MultiKueue delete its copies on the workers; left unchanged")
    return ""


def _queue_warning(cq: str, check: str, mode: PriorityMode) -> str:
    if mode is PriorityMode.SPEC:
        return (f"ClusterQueue {cq} dispatches through MultiKueue (AdmissionCheck {check}): "
                "spec.priority is written only to Workloads with a WorkloadPriorityClass "
                "(MultiKueue forwards those); the others are left unchanged. The order applies "
                "to dispatch on this manager, not to the workers' queues")
    return (f"ClusterQueue {cq} dispatches through MultiKueue (AdmissionCheck {check}): the "
            "priority-boost annotation orders dispatch on this manager only; MultiKueue does not "
            "forward a boost change to Workloads already dispatched to workers")
