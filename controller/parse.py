"""Kubernetes objects (dicts, as `kubectl get -o yaml` or the API return them) -> domain objects.

Speaks Kueue v1beta2 and v1beta1 (Kueue's API reference: `priorityClassRef` vs `priorityClassName`,
`cohortName` vs `cohort`), batch/v1 Jobs and v1 Nodes (via `controller.inventory` when present).
One bad object never stops the rest: it becomes an InputProblem naming the object and field.
Only a file that cannot be read or parsed at all raises `SnapshotFileError`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from controller import yamlload
from controller.domain import (
    EMPTY_MAPPING,
    KUEUE_GROUP,
    OWNER_KINDS,
    Admission,
    AdmissionCheck,
    ClusterQueue,
    ClusterSnapshot,
    Container,
    InputProblem,
    JobInfo,
    KueueApiVersion,
    LocalQueue,
    NodeInventory,
    ObjectRef,
    OwnerInfo,
    PodSet,
    PodSetAssignment,
    Preemption,
    ResourceQuota,
    Workload,
    frozen_resources,
)
from controller.quantity import parse_quantity

AFS_MODE = "UsageBasedAdmissionFairSharing"
# v1beta1 spec.priorityClassSource of a Workload whose class is a WorkloadPriorityClass
WORKLOAD_PRIORITY_CLASS_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
SNAPSHOT_SUFFIXES = (".yaml", ".yml", ".json")


class SnapshotFileError(Exception):
    """A snapshot file that cannot be read or parsed at all (the CLI exits 2)."""


class _Bad(Exception):
    """Internal: the object cannot be used at all."""

    def __init__(self, field: str, value: object, message: str) -> None:
        super().__init__(message)
        self.field, self.value, self.message = field, value, message


def _show(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


class _Ctx:
    """Collects problems for one object."""

    def __init__(self, ref: ObjectRef) -> None:
        self.ref = ref
        self.problems: list[InputProblem] = []

    def problem(self, field: str, value: object, message: str) -> None:
        self.problems.append(InputProblem(self.ref, field, _show(value), message))


def _map(value: object, field: str, *, required: bool = False) -> Mapping[str, Any]:
    if value is None:
        if required:
            raise _Bad(field, "", "missing")
        return EMPTY_MAPPING
    if not isinstance(value, Mapping):
        raise _Bad(field, value, "expected a mapping")
    return value


def _list(value: object, field: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Bad(field, value, "expected a list")
    return value


def _strings(ctx: _Ctx, value: object, field: str) -> Mapping[str, str]:
    """Labels/annotations: string -> string; non-string entries are reported and dropped."""
    if value is None:
        return EMPTY_MAPPING
    if not isinstance(value, Mapping):
        ctx.problem(field, value, "expected a mapping of strings")
        return EMPTY_MAPPING
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(k, str) and isinstance(v, str):
            out[k] = v
        else:
            ctx.problem(f"{field}[{k}]", v, "expected a string value (quote it in YAML)")
    return MappingProxyType(out)


def _time(value: object, field: str) -> datetime:
    if isinstance(value, datetime):  # YAML may already have parsed an unquoted timestamp
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        raise _Bad(field, value if value is not None else "", "missing or not a timestamp")
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise _Bad(field, value, "not an RFC 3339 timestamp") from None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _int(value: object, field: str, *, lo: int = -(2**31), hi: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _Bad(field, value, f"expected an integer {lo}..{hi}")
    return value


def _meta(obj: Mapping[str, Any], kind: str) -> tuple[ObjectRef, Mapping[str, Any]]:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else EMPTY_MAPPING
    name = meta.get("name")
    ns = meta.get("namespace")
    ref = ObjectRef(
        kind,
        name if isinstance(name, str) and name else "<unnamed>",
        ns if isinstance(ns, str) else "",
        str(meta.get("uid") or ""),
        str(obj.get("apiVersion") or ""),
    )
    return ref, meta


def _resources(
    ctx: _Ctx, raw: object, field: str
) -> dict[str, Decimal]:
    """Effective requests of a container: limits first, then requests (HAMi's reading)."""
    res = _map(raw, field)
    merged: dict[str, Decimal] = {}
    for part in ("requests", "limits"):  # limits applied last, so they win
        values = _map(res.get(part), f"{field}.{part}")
        for name, q in values.items():
            try:
                merged[str(name)] = parse_quantity(q)
            except ValueError as exc:
                ctx.problem(f"{field}.{part}.{name}", q, str(exc))
    return merged


def _containers(ctx: _Ctx, pod_spec: Mapping[str, Any], field: str) -> tuple[Container, ...]:
    out = []
    for i, c in enumerate(_list(pod_spec.get("containers"), f"{field}.containers")):
        cf = f"{field}.containers[{i}]"
        c = _map(c, cf)
        raw_name = c.get("name")
        name = raw_name if isinstance(raw_name, str) else str(i)
        resources = _resources(ctx, c.get("resources"), f"{cf}.resources")
        out.append(Container(name, frozen_resources(resources)))
    return tuple(out)


# --------------------------------------------------------------------------------------------


def _api_version(obj: Mapping[str, Any]) -> KueueApiVersion:
    return (
        KueueApiVersion.V1BETA1
        if obj.get("apiVersion") == KueueApiVersion.V1BETA1.value
        else KueueApiVersion.V1BETA2
    )


@dataclass(frozen=True, slots=True)
class _Conditions:
    """What the policy reads from `status.conditions`."""

    true: Mapping[str, bool]  # condition type -> status is True
    # Kueue's last eviction (the Evicted=True transition, else the last Requeued transition).
    last_eviction: datetime | None
    reserved_since: datetime | None  # the QuotaReserved=True transition
    preempted_at: datetime | None  # Preempted=True, else Evicted=True with reason Preempted
    preemption_cleared_at: datetime | None  # Preempted=False, reason QuotaReserved (re-admitted)
    preempted_for: str  # Evicted=True by a preemption: the preemptor's UID, "" if not named


# Kueue's message on the Evicted (and Preempted) condition of a Workload it preempted names the
# preemptor: "Preempted to accommodate a workload (UID: <uid>, JobUID: <uid>) due to ...".
_PREEMPTOR = re.compile(r"Preempted to accommodate a workload \(UID: ([^,)\s]+)")


def _preemptor(message: object) -> str:
    found = _PREEMPTOR.match(message) if isinstance(message, str) else None
    return found.group(1) if found is not None and found.group(1) != "UNKNOWN" else ""


def _conditions(ctx: _Ctx, status: Mapping[str, Any]) -> _Conditions:
    out: dict[str, bool] = {}
    when: dict[str, datetime] = {}
    evicted_by_preemption = False
    cleared: datetime | None = None
    preemptor = ""
    for i, c in enumerate(_list(status.get("conditions"), "status.conditions")):
        if not isinstance(c, Mapping) or not isinstance(c.get("type"), str):
            ctx.problem(f"status.conditions[{i}]", c, "expected a condition with a type")
            continue
        kind, true = c["type"], c.get("status") == "True"
        out[kind] = true
        if kind in ("Evicted", "Requeued", "QuotaReserved", "Preempted") \
                and (kind == "Requeued" or true):
            try:
                when[kind] = _time(c.get("lastTransitionTime"), f"status.conditions[{i}]")
            except _Bad:
                continue
            if kind == "Evicted":
                evicted_by_preemption = c.get("reason") == "Preempted"
                preemptor = _preemptor(c.get("message")) if evicted_by_preemption else ""
        elif kind == "Preempted" and c.get("reason") == "QuotaReserved":
            try:
                cleared = _time(c.get("lastTransitionTime"), f"status.conditions[{i}]")
            except _Bad:
                continue
    return _Conditions(
        true=out,
        last_eviction=when.get("Evicted") or when.get("Requeued"),
        reserved_since=when.get("QuotaReserved"),
        preempted_at=when.get("Preempted")
        or (when.get("Evicted") if evicted_by_preemption else None),
        preemption_cleared_at=cleared,
        preempted_for=preemptor,
    )


def parse_workload(obj: Mapping[str, Any]) -> tuple[Workload | None, list[InputProblem]]:
    """A Kueue Workload (v1beta1 or v1beta2). None when it cannot be used at all."""
    ref, meta = _meta(obj, "Workload")
    ctx = _Ctx(ref)
    try:
        if ref.name == "<unnamed>":
            raise _Bad("metadata.name", "", "missing")
        if not ref.namespace:
            raise _Bad("metadata.namespace", "", "missing")
        created = _time(meta.get("creationTimestamp"), "metadata.creationTimestamp")
        spec = _map(obj.get("spec"), "spec", required=True)
        queue = spec.get("queueName")
        if not isinstance(queue, str) or not queue:
            raise _Bad("spec.queueName", queue or "", "missing")
        pod_sets = []
        raw_sets = _list(spec.get("podSets"), "spec.podSets")
        if not raw_sets:
            raise _Bad("spec.podSets", "", "missing or empty")
        for i, ps in enumerate(raw_sets):
            pf = f"spec.podSets[{i}]"
            ps = _map(ps, pf)
            count = _int(ps.get("count", 1), f"{pf}.count", lo=0)
            tmpl = _map(ps.get("template"), f"{pf}.template")
            tmeta = _map(tmpl.get("metadata"), f"{pf}.template.metadata")
            pod_sets.append(PodSet(
                name=str(ps.get("name") or f"podset-{i}"),
                count=count,
                containers=_containers(
                    ctx, _map(tmpl.get("spec"), f"{pf}.template.spec"), f"{pf}.template.spec"
                ),
                annotations=_strings(ctx, tmeta.get("annotations"),
                                     f"{pf}.template.metadata.annotations"),
            ))
        priority = spec.get("priority")
        if priority is not None:
            try:
                priority = _int(priority, "spec.priority")
            except _Bad as bad:
                ctx.problem(bad.field, bad.value, bad.message)
                priority = None
        pc_ref = spec.get("priorityClassRef")
        pc_name = spec.get("priorityClassName")
        wpc = spec.get("priorityClassSource") == WORKLOAD_PRIORITY_CLASS_SOURCE
        if isinstance(pc_ref, Mapping) and isinstance(pc_ref.get("name"), str):
            pc_name = pc_ref["name"]
            wpc = pc_ref.get("kind") == "WorkloadPriorityClass"
        active = spec.get("active", True)
        if not isinstance(active, bool):
            ctx.problem("spec.active", active, "expected true or false; treated as true")
            active = True

        status = obj.get("status")
        if status is not None and not isinstance(status, Mapping):
            ctx.problem("status", status, "expected a mapping; treated as no status")
            status = None
        status = status or EMPTY_MAPPING
        found = _conditions(ctx, status)
        conds = found.true
        quota_reserved = conds.get("QuotaReserved", False)
        admission = None
        raw_adm = status.get("admission")
        if raw_adm is not None:
            admission = _admission(ctx, raw_adm)
        elif quota_reserved:
            ctx.problem("status.admission", "", "QuotaReserved=True but no status.admission: "
                        "usage taken from the pod set requests")
        owner = None
        for i, o in enumerate(_list(meta.get("ownerReferences"), "metadata.ownerReferences")):
            if isinstance(o, Mapping) and o.get("controller") is True:
                owner = ObjectRef(str(o.get("kind", "")), str(o.get("name", "")), ref.namespace,
                                  str(o.get("uid", "")), str(o.get("apiVersion", "")))
                break
            if not isinstance(o, Mapping):
                ctx.problem(f"metadata.ownerReferences[{i}]", o, "expected a mapping")
        workload = Workload(
            namespace=ref.namespace,
            name=ref.name,
            uid=ref.uid,
            api_version=_api_version(obj),
            queue_name=queue,
            created=created,
            pod_sets=tuple(pod_sets),
            priority=priority,
            priority_class_name=pc_name if isinstance(pc_name, str) else None,
            workload_priority_class=wpc and isinstance(pc_name, str),
            active=active,
            quota_reserved=quota_reserved,
            admitted=conds.get("Admitted", False),
            finished=conds.get("Finished", False),
            admission=admission,
            labels=_strings(ctx, meta.get("labels"), "metadata.labels"),
            annotations=_strings(ctx, meta.get("annotations"), "metadata.annotations"),
            owner=owner,
            resource_version=str(meta.get("resourceVersion") or ""),
            last_eviction=found.last_eviction,
            reserved_since=found.reserved_since if quota_reserved else None,
            preempted_at=found.preempted_at,
            preemption_cleared_at=found.preemption_cleared_at,
            evicted=conds.get("Evicted", False),
            preempted_for=found.preempted_for if conds.get("Evicted", False) else "",
        )
    except _Bad as bad:
        ctx.problem(bad.field, bad.value, f"{bad.message}; object skipped")
        return None, ctx.problems
    return workload, ctx.problems


def _admission(ctx: _Ctx, raw: object) -> Admission | None:
    try:
        adm = _map(raw, "status.admission")
        cq = adm.get("clusterQueue")
        if not isinstance(cq, str) or not cq:
            raise _Bad("status.admission.clusterQueue", cq or "", "missing")
        usage: dict[str, Decimal] = {}
        flavors: dict[str, str] = {}
        assignments: list[PodSetAssignment] = []
        for i, psa in enumerate(_list(adm.get("podSetAssignments"),
                                      "status.admission.podSetAssignments")):
            pf = f"status.admission.podSetAssignments[{i}]"
            psa = _map(psa, pf)
            own: dict[str, Decimal] = {}
            for name, q in _map(psa.get("resourceUsage"), f"{pf}.resourceUsage").items():
                try:
                    own[str(name)] = own.get(str(name), Decimal(0)) + parse_quantity(q)
                except ValueError as exc:
                    ctx.problem(f"{pf}.resourceUsage.{name}", q, str(exc))
            for name, q in own.items():
                usage[name] = usage.get(name, Decimal(0)) + q
            own_flavors = {str(k): str(v) for k, v in
                           _map(psa.get("flavors"), f"{pf}.flavors").items()}
            flavors.update(own_flavors)
            count = psa.get("count")
            if count is not None:
                try:
                    count = _int(count, f"{pf}.count", lo=0)
                except _Bad as bad:
                    ctx.problem(bad.field, bad.value, bad.message + "; the pod set's count used")
                    count = None
            assignments.append(PodSetAssignment(
                name=str(psa.get("name") or f"podset-{i}"), count=count,
                usage=frozen_resources(own), flavors=MappingProxyType(own_flavors),
            ))
        return Admission(cq, frozen_resources(usage), MappingProxyType(flavors),
                         tuple(assignments))
    except _Bad as bad:
        ctx.problem(bad.field, bad.value, bad.message)
        return None


def parse_cluster_queue(obj: Mapping[str, Any]) -> tuple[ClusterQueue | None, list[InputProblem]]:
    ref, _ = _meta(obj, "ClusterQueue")
    ctx = _Ctx(ref)
    try:
        if ref.name == "<unnamed>":
            raise _Bad("metadata.name", "", "missing")
        spec = _map(obj.get("spec"), "spec", required=True)
        quotas: list[ResourceQuota] = []
        for gi, group in enumerate(_list(spec.get("resourceGroups"), "spec.resourceGroups")):
            gf = f"spec.resourceGroups[{gi}]"
            group = _map(group, gf)
            for fi, fl in enumerate(_list(group.get("flavors"), f"{gf}.flavors")):
                ff = f"{gf}.flavors[{fi}]"
                fl = _map(fl, ff)
                for ri, r in enumerate(_list(fl.get("resources"), f"{ff}.resources")):
                    rf = f"{ff}.resources[{ri}]"
                    r = _map(r, rf)
                    try:
                        quotas.append(ResourceQuota(
                            flavor=str(fl.get("name", "")),
                            resource=str(r.get("name", "")),
                            nominal=parse_quantity(r.get("nominalQuota", 0)),
                            borrowing_limit=_opt_q(r.get("borrowingLimit")),
                            lending_limit=_opt_q(r.get("lendingLimit")),
                        ))
                    except ValueError as exc:
                        ctx.problem(f"{rf}.nominalQuota", r.get("nominalQuota"), str(exc))
        cohort = spec.get("cohortName", spec.get("cohort"))
        pre = _map(spec.get("preemption"), "spec.preemption")
        fs = _map(spec.get("fairSharing"), "spec.fairSharing")
        weight = None
        if fs.get("weight") is not None:
            try:
                weight = parse_quantity(fs["weight"])
            except ValueError as exc:
                ctx.problem("spec.fairSharing.weight", fs["weight"], str(exc))
        scope = _map(spec.get("admissionScope"), "spec.admissionScope")
        checks = _admission_checks(ctx, spec)
        cq = ClusterQueue(
            name=ref.name,
            api_version=_api_version(obj),
            quotas=tuple(quotas),
            cohort=cohort if isinstance(cohort, str) and cohort else None,
            queueing_strategy=str(spec.get("queueingStrategy") or "BestEffortFIFO"),
            preemption=Preemption(
                within_cluster_queue=str(pre.get("withinClusterQueue") or "Never"),
                reclaim_within_cohort=str(pre.get("reclaimWithinCohort") or "Never"),
                borrow_within_cohort=_borrow(pre.get("borrowWithinCohort")),
            ),
            fair_sharing_weight=weight,
            admission_fair_sharing=scope.get("admissionMode") == AFS_MODE,
            admission_checks=checks,
        )
    except _Bad as bad:
        ctx.problem(bad.field, bad.value, f"{bad.message}; object skipped")
        return None, ctx.problems
    return cq, ctx.problems


def _admission_checks(ctx: _Ctx, spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The AdmissionCheck names a ClusterQueue uses: spec.admissionChecks (names) and
    spec.admissionChecksStrategy.admissionChecks[].name (Kueue accepts one or the other)."""
    names: list[str] = []
    for i, name in enumerate(_list(spec.get("admissionChecks"), "spec.admissionChecks")):
        if isinstance(name, str) and name:
            names.append(name)
        else:
            ctx.problem(f"spec.admissionChecks[{i}]", name, "expected a name; ignored")
    strategy = _map(spec.get("admissionChecksStrategy"), "spec.admissionChecksStrategy")
    field = "spec.admissionChecksStrategy.admissionChecks"
    for i, rule in enumerate(_list(strategy.get("admissionChecks"), field)):
        name = rule.get("name") if isinstance(rule, Mapping) else None
        if isinstance(name, str) and name:
            names.append(name)
        else:
            ctx.problem(f"{field}[{i}].name", name, "expected a name; ignored")
    return tuple(dict.fromkeys(names))


def parse_admission_check(
    obj: Mapping[str, Any],
) -> tuple[AdmissionCheck | None, list[InputProblem]]:
    ref, _ = _meta(obj, "AdmissionCheck")
    ctx = _Ctx(ref)
    try:
        if ref.name == "<unnamed>":
            raise _Bad("metadata.name", "", "missing")
        spec = _map(obj.get("spec"), "spec", required=True)
        controller = spec.get("controllerName")
        if not isinstance(controller, str) or not controller:
            raise _Bad("spec.controllerName", controller, "expected a controller name")
    except _Bad as bad:
        ctx.problem(bad.field, bad.value, f"{bad.message}; object skipped")
        return None, ctx.problems
    return AdmissionCheck(ref.name, controller), ctx.problems


def _borrow(raw: object) -> str:
    if isinstance(raw, Mapping):
        return str(raw.get("policy") or "Never")
    return str(raw or "Never")


def _opt_q(raw: object) -> Decimal | None:
    return None if raw is None else parse_quantity(raw)


def parse_local_queue(obj: Mapping[str, Any]) -> tuple[LocalQueue | None, list[InputProblem]]:
    ref, _ = _meta(obj, "LocalQueue")
    ctx = _Ctx(ref)
    try:
        if ref.name == "<unnamed>" or not ref.namespace:
            raise _Bad("metadata", "", "name and namespace are required")
        spec = _map(obj.get("spec"), "spec", required=True)
        cq = spec.get("clusterQueue")
        if not isinstance(cq, str) or not cq:
            raise _Bad("spec.clusterQueue", cq or "", "missing")
        fs = _map(spec.get("fairSharing"), "spec.fairSharing")
        weight = None
        if fs.get("weight") is not None:
            try:
                weight = parse_quantity(fs["weight"])
            except ValueError as exc:
                ctx.problem("spec.fairSharing.weight", fs["weight"], str(exc))
        lq = LocalQueue(ref.namespace, ref.name, cq, weight)
    except _Bad as bad:
        ctx.problem(bad.field, bad.value, f"{bad.message}; object skipped")
        return None, ctx.problems
    return lq, ctx.problems


def parse_job(obj: Mapping[str, Any]) -> tuple[JobInfo | None, list[InputProblem]]:
    """A batch/v1 Job: what users annotate, and the pod template HAMi reads."""
    ref, meta = _meta(obj, "Job")
    ctx = _Ctx(ref)
    try:
        if ref.name == "<unnamed>" or not ref.namespace:
            raise _Bad("metadata", "", "name and namespace are required")
        spec = _map(obj.get("spec"), "spec", required=True)
        tmpl = _map(spec.get("template"), "spec.template")
        tmeta = _map(tmpl.get("metadata"), "spec.template.metadata")
        status = _map(obj.get("status"), "status")
        job = JobInfo(
            namespace=ref.namespace,
            name=ref.name,
            uid=ref.uid,
            annotations=_strings(ctx, meta.get("annotations"), "metadata.annotations"),
            labels=_strings(ctx, meta.get("labels"), "metadata.labels"),
            suspended=spec.get("suspend") is True,
            ever_started=bool(status.get("startTime")),
            template_annotations=_strings(ctx, tmeta.get("annotations"),
                                          "spec.template.metadata.annotations"),
            containers=_containers(ctx, _map(tmpl.get("spec"), "spec.template.spec"),
                                   "spec.template.spec"),
            resource_version=str(meta.get("resourceVersion") or ""),
        )
    except _Bad as bad:
        ctx.problem(bad.field, bad.value, f"{bad.message}; object skipped")
        return None, ctx.problems
    return job, ctx.problems


def parse_owner(obj: Mapping[str, Any]) -> tuple[OwnerInfo | None, list[InputProblem]]:
    """A Workload owner of another Kueue-integrated kind: its annotations and labels."""
    kind = str(obj.get("kind", ""))
    ref, meta = _meta(obj, kind)
    ctx = _Ctx(ref)
    if ref.name == "<unnamed>" or not ref.namespace:
        ctx.problem("metadata", "", "name and namespace are required; object skipped")
        return None, ctx.problems
    return OwnerInfo(
        kind=kind, api_version=str(obj.get("apiVersion", "")), namespace=ref.namespace,
        name=ref.name, uid=ref.uid,
        annotations=_strings(ctx, meta.get("annotations"), "metadata.annotations"),
        labels=_strings(ctx, meta.get("labels"), "metadata.labels"),
        resource_version=str(meta.get("resourceVersion") or ""),
    ), ctx.problems


def parse_node(obj: Mapping[str, Any]) -> tuple[tuple[NodeInventory, ...], list[InputProblem]]:
    """A Node's GPU inventories (agent and/or HAMi), when controller.inventory is available."""
    try:
        from controller.inventory import parse_node_sources
    except ImportError:  # the agent engineer's module is optional for the offline dry run
        return (), []
    return parse_node_sources(obj)


# --------------------------------------------------------------------------------------------


def iter_items(doc: object) -> Iterator[object]:
    """Flatten v1 Lists (`kubectl get ... -o yaml`), nested Lists and plain objects."""
    if isinstance(doc, Mapping) and isinstance(doc.get("items"), list) and (
        str(doc.get("kind", "")).endswith("List") or "kind" not in doc
    ):
        for item in doc["items"]:
            yield from iter_items(item)
    elif isinstance(doc, list):
        for item in doc:
            yield from iter_items(item)
    elif doc is not None:
        yield doc


def _latest_timestamp(obj: Mapping[str, Any]) -> datetime | None:
    """Newest creation / condition transition time of a Workload (approximate capture time)."""
    found: list[datetime] = []
    meta = obj.get("metadata")
    status = obj.get("status")
    raws = [meta.get("creationTimestamp")] if isinstance(meta, Mapping) else []
    if isinstance(status, Mapping) and isinstance(status.get("conditions"), list):
        raws += [c.get("lastTransitionTime") for c in status["conditions"]
                 if isinstance(c, Mapping)]
    for raw in raws:
        try:
            found.append(_time(raw, ""))
        except _Bad:
            continue
    return max(found) if found else None


def build_snapshot(docs: Iterable[object]) -> ClusterSnapshot:
    """Domain snapshot from Kubernetes objects; unknown kinds are ignored, bad objects reported.
    `observed` is the newest Workload timestamp (creation or condition transition)."""
    workloads: list[Workload] = []
    cqs: list[ClusterQueue] = []
    lqs: list[LocalQueue] = []
    jobs: list[JobInfo] = []
    owners: list[OwnerInfo] = []
    nodes: list[NodeInventory] = []
    checks: list[AdmissionCheck] = []
    problems: list[InputProblem] = []
    observed: datetime | None = None
    for i, obj in enumerate(iter_items(docs)):
        if not isinstance(obj, Mapping) or not isinstance(obj.get("kind"), str):
            problems.append(InputProblem(None, f"items[{i}]", _show(obj),
                                         "not a Kubernetes object (no kind)"))
            continue
        kind, api = obj["kind"], str(obj.get("apiVersion", ""))
        group = api.split("/")[0] if "/" in api else ""
        try:
            if group == KUEUE_GROUP and kind == "Workload":
                if api not in (v.value for v in KueueApiVersion):
                    problems.append(InputProblem(_meta(obj, kind)[0], "apiVersion", api,
                                                 "unsupported Kueue API version; object skipped"))
                    continue
                w, p = parse_workload(obj)
                if w:
                    workloads.append(w)
                    ts = _latest_timestamp(obj)
                    if ts is not None and (observed is None or ts > observed):
                        observed = ts
            elif group == KUEUE_GROUP and kind == "ClusterQueue":
                c, p = parse_cluster_queue(obj)
                if c:
                    cqs.append(c)
            elif group == KUEUE_GROUP and kind == "AdmissionCheck":
                a, p = parse_admission_check(obj)
                if a:
                    checks.append(a)
            elif group == KUEUE_GROUP and kind == "LocalQueue":
                q, p = parse_local_queue(obj)
                if q:
                    lqs.append(q)
            elif api == "batch/v1" and kind == "Job":
                j, p = parse_job(obj)
                if j:
                    jobs.append(j)
            elif f"{group}/{kind}" in OWNER_KINDS:
                o, p = parse_owner(obj)
                if o:
                    owners.append(o)
            elif api == "v1" and kind == "Node":
                inv, p = parse_node(obj)
                nodes.extend(inv)
            else:
                continue
        except Exception as exc:  # one broken object must not stop the run
            p = [InputProblem(_meta(obj, kind)[0], "(object)", "", f"cannot parse: {exc!r}")]
        problems.extend(p)
    return ClusterSnapshot(
        workloads=tuple(workloads),
        cluster_queues=tuple(cqs),
        local_queues=tuple(lqs),
        jobs=tuple(jobs),
        owners=tuple(owners),
        nodes=tuple(nodes),
        admission_checks=tuple(checks),
        problems=tuple(problems),
        observed=observed,
    )


def _files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if str(p) == "-":  # standard input: kubectl get ... -o yaml | python -m controller
            out.append(p)
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.suffix in SNAPSHOT_SUFFIXES and f.is_file())
            if not found:
                raise SnapshotFileError(f"{p}: directory has no .yaml/.yml/.json files")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise SnapshotFileError(f"{p}: no such file or directory")
    return out


def load_documents(paths: Iterable[str | os.PathLike[str]]) -> list[object]:
    """Every YAML/JSON document in the files (directories: their .yaml/.yml/.json files)."""
    paths = list(paths)
    docs: list[object] = []
    for f in _files(paths):
        try:
            text = sys.stdin.read() if str(f) == "-" else f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SnapshotFileError(f"{f}: cannot read: {exc}") from None
        if f.suffix == ".json" or text.lstrip()[:1] in ("{", "["):
            # `kubectl get -o json`: JSON is YAML, but the JSON parser is ~10x faster.
            try:
                docs.append(json.loads(text))
                continue
            except json.JSONDecodeError as exc:
                if f.suffix == ".json":
                    raise SnapshotFileError(
                        f"{f}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"
                    ) from None
            except RecursionError:
                raise SnapshotFileError(f"{f}: not valid JSON: nested too deeply") from None
        try:
            docs.extend(d for d in yamlload.load_all(text) if d is not None)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{f}:{mark.line + 1}:{mark.column + 1}" if mark else str(f)
            problem = getattr(exc, "problem", None) or str(exc)
            raise SnapshotFileError(f"{where}: not valid YAML: {problem}") from None
        except ValueError as exc:  # a value the YAML 1.1 constructors refuse (2026-13-45)
            raise SnapshotFileError(f"{f}: not valid YAML: {exc}") from None
    if not docs:
        raise SnapshotFileError("no documents in " + ", ".join(map(str, paths)))
    for d in docs:
        if not isinstance(d, Mapping | list):
            raise SnapshotFileError(f"top-level document is not an object or list: {_show(d)}")
    return docs


def load_snapshot(paths: Iterable[str | os.PathLike[str]]) -> ClusterSnapshot:
    """Parse files into a snapshot; SnapshotFileError (with file:line:col) when one cannot be
    parsed at all, or when it holds no Kueue object (a plan of nothing is a wrong file, not
    an empty cluster)."""
    docs = load_documents(paths)
    snapshot = build_snapshot(docs)
    if not (snapshot.workloads or snapshot.cluster_queues or snapshot.local_queues):
        raise SnapshotFileError(
            f"no Kueue objects (Workloads, ClusterQueues, LocalQueues) in "
            f"{', '.join(map(str, paths)) or 'the input'}: found {kinds_found(docs)}")
    return snapshot


def kinds_found(docs: Iterable[object]) -> str:
    """What a snapshot holds, e.g. "2 Deployment (apps/v1), 1 List whose items is not a list"."""
    counts: Counter[str] = Counter()
    for obj in iter_items(docs):
        if not isinstance(obj, Mapping):
            counts[f"{type(obj).__name__} (not an object)"] += 1
        elif str(obj.get("kind", "")).endswith("List") and "items" in obj:
            counts[f"{obj.get('kind')} whose items is not a list"] += 1
        elif isinstance(obj.get("kind"), str):
            counts[f"{obj['kind']} ({obj.get('apiVersion', 'no apiVersion')})"] += 1
        else:
            counts["object without a kind"] += 1
    return ", ".join(f"{n} {what}" for what, n in counts.most_common()) or "nothing"
