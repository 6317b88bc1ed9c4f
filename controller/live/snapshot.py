"""ClusterSnapshot from the informer caches, parsing each object once per resourceVersion.

Also the pure trigger rule: which watch events deserve a cycle now rather than at the next
tick (a new urgent/approved workload, or a change of class annotations).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from controller.domain import (
    APPROVED_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
    AdmissionCheck,
    ClusterQueue,
    ClusterSnapshot,
    InputProblem,
    JobInfo,
    LocalQueue,
    NodeInventory,
    OwnerInfo,
    Workload,
)
from controller.live.api import JSON
from controller.live.cache import object_key, resource_version
from controller.workload import (
    WorkloadInfo,
    annotations_of,
    is_quota_reserved,
    owner_job_key,
    owner_key,
)

T = TypeVar("T")
Parser = Callable[[JSON], tuple[T | None, list[InputProblem]]]

CLASS_KEYS = (URGENT_ANNOTATION, APPROVED_ANNOTATION, PRIORITY_OVERRIDE_ANNOTATION)


class ParseCache(Generic[T]):
    """key -> (resourceVersion, parsed, problems); a cycle re-parses only what changed."""

    def __init__(self, parse: Parser[T]) -> None:
        self._parse = parse
        self._entries: dict[str, tuple[str, T | None, tuple[InputProblem, ...]]] = {}
        self.parsed = 0  # how many parses happened (tests, debugging)

    def get(self, obj: JSON) -> tuple[T | None, tuple[InputProblem, ...]]:
        key = object_key(obj)
        rv = resource_version(obj)
        hit = self._entries.get(key)
        if hit is not None and rv and hit[0] == rv:
            return hit[1], hit[2]
        try:
            value, problems = self._parse(obj)
        except Exception as exc:  # one broken object must never stop the cycle
            value, problems = None, [InputProblem(None, key, "", f"cannot parse: {exc!r}")]
        self.parsed += 1
        entry = (rv, value, tuple(problems))
        self._entries[key] = entry
        return entry[1], entry[2]

    def replace(self, obj: JSON, value: T) -> None:
        """Keep `value` for `obj`, whose resourceVersion is cached already (re-read unchanged)."""
        rv, _, problems = self._entries[object_key(obj)]
        self._entries[object_key(obj)] = (rv, value, problems)

    def prune(self, live: Iterable[JSON]) -> None:
        keep = {object_key(o) for o in live}
        for key in [k for k in self._entries if k not in keep]:
            del self._entries[key]


@dataclass
class Parsers:
    workload: Parser[Workload]
    cluster_queue: Parser[ClusterQueue]
    local_queue: Parser[LocalQueue]
    job: Parser[JobInfo]
    node: Callable[[JSON], tuple[tuple[NodeInventory, ...], list[InputProblem]]]
    owner: Parser[OwnerInfo] | None = None  # JobSets, RayJobs, ... (controller.live.owners)
    admission_check: Parser[AdmissionCheck] | None = None  # MultiKueue detection


@dataclass
class Built:
    snapshot: ClusterSnapshot
    # key -> the observed Workload (finished ones left out, as from the snapshot)
    infos: dict[str, WorkloadInfo] = field(default_factory=dict)


def _info_parser(parse: Parser[Workload]) -> Parser[WorkloadInfo]:
    """Parses a Workload into its `WorkloadInfo` (so the cache keeps both per resourceVersion)."""
    def parse_info(obj: JSON) -> tuple[WorkloadInfo | None, list[InputProblem]]:
        workload, problems = parse(obj)
        return (WorkloadInfo.of(obj, workload) if workload is not None else None), problems

    return parse_info


class SnapshotBuilder:
    def __init__(self, parsers: Parsers) -> None:
        self._wl = ParseCache(_info_parser(parsers.workload))
        self._cq = ParseCache(parsers.cluster_queue)
        self._lq = ParseCache(parsers.local_queue)
        self._job = ParseCache(parsers.job)
        self._owner = ParseCache(parsers.owner) if parsers.owner is not None else None
        self._node_parse = parsers.node
        self._ac = (ParseCache(parsers.admission_check)
                    if parsers.admission_check is not None else None)
        self._nodes: dict[str, tuple[str, tuple[NodeInventory, ...], tuple[InputProblem, ...]]] = {}

    @property
    def parse_count(self) -> int:
        return self._wl.parsed + self._cq.parsed + self._lq.parsed + self._job.parsed

    def build(
        self,
        workloads: list[JSON],
        cluster_queues: list[JSON],
        local_queues: list[JSON],
        jobs: Mapping[str, JSON],
        nodes: list[JSON],
        owners: Mapping[str, JSON] | None = None,  # owner_key(...) -> object
        admission_checks: list[JSON] | None = None,
    ) -> Built:
        problems: list[InputProblem] = []
        infos: dict[str, WorkloadInfo] = {}
        for obj in workloads:
            info, p = self._wl.get(obj)
            problems.extend(p)
            if info is not None and info.obj is not obj:
                # The same resourceVersion read again (a relist): hold the informer's object,
                # not a stale copy of it.
                info = dataclasses.replace(info, obj=obj)
                self._wl.replace(obj, info)
            if info is not None and not info.workload.finished:
                infos[info.key] = info
        parsed_wls = [i.workload for i in infos.values()]
        cqs = self._parse_all(self._cq, cluster_queues, problems)
        lqs = self._parse_all(self._lq, local_queues, problems)
        job_objs = []
        for info in infos.values():
            key = info.owner_job_key
            if key is not None and key in jobs:
                job_objs.append(jobs[key])
        parsed_jobs = self._parse_all(self._job, job_objs, problems)
        owner_objs = [
            owners[k] for wl in parsed_wls if wl.owner is not None and owners
            and (k := owner_key(wl.namespace, wl.owner.kind, wl.owner.name)) in owners
        ]
        parsed_owners = (self._parse_all(self._owner, owner_objs, problems)
                         if self._owner is not None else [])
        inventories = self._parse_nodes(nodes, problems)
        checks: list[AdmissionCheck] = []
        if self._ac is not None and admission_checks is not None:
            checks = self._parse_all(self._ac, admission_checks, problems)
            self._ac.prune(admission_checks)
        self._wl.prune(workloads)
        self._cq.prune(cluster_queues)
        self._lq.prune(local_queues)
        self._job.prune(job_objs)
        if self._owner is not None:
            self._owner.prune(owner_objs)
        snapshot = ClusterSnapshot(
            workloads=tuple(parsed_wls),
            cluster_queues=tuple(cqs),
            local_queues=tuple(lqs),
            jobs=tuple(parsed_jobs),
            owners=tuple(parsed_owners),
            nodes=tuple(inventories),
            admission_checks=tuple(checks),
            problems=tuple(problems),
        )
        return Built(snapshot, infos)

    @staticmethod
    def _parse_all(cache: ParseCache[T], objs: list[JSON], problems: list[InputProblem]) -> list[T]:
        out: list[T] = []
        for obj in objs:
            value, p = cache.get(obj)
            problems.extend(p)
            if value is not None:
                out.append(value)
        return out

    def _parse_nodes(self, nodes: list[JSON], problems: list[InputProblem]) -> list[NodeInventory]:
        out: list[NodeInventory] = []
        fresh: dict[str, tuple[str, tuple[NodeInventory, ...], tuple[InputProblem, ...]]] = {}
        for obj in nodes:
            key, rv = object_key(obj), resource_version(obj)
            hit = self._nodes.get(key)
            if hit is None or hit[0] != rv or not rv:
                try:
                    inv, p = self._node_parse(obj)
                    hit = (rv, tuple(inv), tuple(p))
                except Exception as exc:
                    hit = (rv, (), (InputProblem(None, key, "", f"cannot parse: {exc!r}"),))
            fresh[key] = hit
            out.extend(hit[1])
            problems.extend(hit[2])
        self._nodes = fresh
        return out


# -- prompt cycles ----------------------------------------------------------------------------


def class_annotations(obj: JSON | None) -> dict[str, str]:
    ann = annotations_of(obj)
    return {k: str(ann[k]) for k in CLASS_KEYS if k in ann}


def raises_class(values: Mapping[str, str]) -> bool:
    return any(v not in ("", "false") for v in values.values())


def needs_prompt_cycle(
    kind: str, old: JSON | None, new: JSON | None, job_lookup: Callable[[str], JSON | None]
) -> bool:
    """A cycle within ~2 s instead of at the next tick: a new Workload of a raised class (on
    itself or its owner Job), any change of class annotations on a Workload or Job, or a
    Workload that has just been admitted (its class guard should replace its pending priority
    at once: until then a same-class Workload with a higher pending priority could preempt it,
    see docs/policy.md)."""
    if new is None:
        return False
    if kind == "Workload" and old is not None and is_quota_reserved(new) and not (
            is_quota_reserved(old)):
        return True
    before, after = class_annotations(old), class_annotations(new)
    if old is not None and before != after:
        return True
    if kind == "Workload" and old is None:
        if raises_class(after):
            return True
        job_key = owner_job_key(new)
        if job_key is not None:
            return raises_class(class_annotations(job_lookup(job_key)))
        return False
    if kind == "Job" and old is None:
        return raises_class(after)
    return False
