"""Typed domain objects: what the policy reads about a Kueue + HAMi cluster.

Everything here is pure data. Kubernetes objects are turned into these by
`controller.parse`; the policy (`controller.policy`) only ever sees these.
Quantities are exact `Decimal`s in canonical units (cores, bytes, GPUs, percent).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import TypeVar

# HAMi / NVIDIA resource names (HAMi chart defaults).
GPU = "nvidia.com/gpu"
GPUCORES = "nvidia.com/gpucores"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
CPU = "cpu"
MEMORY = "memory"

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # Kueue priorities are int32
KUEUE_GROUP = "kueue.x-k8s.io"  # the API group of Workloads, ClusterQueues, LocalQueues

# Annotation keys this project reads or owns.
ANNOTATION_PREFIX = "wdrf.x-k8s.io/"
URGENT_ANNOTATION = ANNOTATION_PREFIX + "urgent"
APPROVED_ANNOTATION = ANNOTATION_PREFIX + "approved"
PRIORITY_OVERRIDE_ANNOTATION = ANNOTATION_PREFIX + "priority-override"
SCHEDULING_POLICY_ANNOTATION = ANNOTATION_PREFIX + "scheduling-policy"
GPU_FRACTION_ANNOTATION = ANNOTATION_PREFIX + "gpu-fraction"
BASE_PRIORITY_ANNOTATION = ANNOTATION_PREFIX + "base-priority"
APPLIED_PRIORITY_ANNOTATION = ANNOTATION_PREFIX + "applied-priority"
# Why a Workload has its priority (`key=value` words), written in the same patch as the
# priority and only when it changes; `why` reads it with namespace-scoped rights.
PRIORITY_TERMS_ANNOTATION = ANNOTATION_PREFIX + "priority-terms"
GPU_INVENTORY_ANNOTATION = ANNOTATION_PREFIX + "gpu-inventory"
KUEUE_PRIORITY_BOOST_ANNOTATION = "kueue.x-k8s.io/priority-boost"
HAMI_NODE_POLICY_ANNOTATION = "hami.io/node-scheduler-policy"
HAMI_GPU_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
HAMI_NODE_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
# Kueue's MultiKueue: the AdmissionCheck controller name, and the label Kueue puts on the copies
# a manager creates on its workers.
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
# The WorkloadPriorityClasses manifests/admission/class-priority.yaml stamps on new Jobs by
# their class, so Kueue keeps the classes apart while the controller is down. Their value is
# a stand-in for the class, never a base the user chose (admins alone may set these names).
CLASS_PRIORITY_CLASSES = frozenset({"wdrf-urgent", "wdrf-approved", "wdrf-normal"})

EMPTY_MAPPING: Mapping[str, str] = MappingProxyType({})


def _no_strings() -> Mapping[str, str]:
    return EMPTY_MAPPING


_T = TypeVar("_T")


def fast_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an `__init__` that sets each slot through its
    descriptor: the same signature, defaults and object, in half the time of the generated
    one (which goes through `object.__setattr__` per field to get past `frozen`). For the
    classes a plan builds per Workload. Fields with a default factory are not supported."""
    namespace: dict[str, object] = {}
    params, body = [], []
    for i, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"fast_init: {cls.__name__}.{f.name} needs the generated __init__")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            namespace[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
        namespace[f"_s{i}"] = cls.__dict__[f.name].__set__
        body.append(f"    _s{i}(self, {f.name})\n")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"fast_init: {cls.__name__} has __post_init__")
    exec(f"def __init__(self, {', '.join(params)}):\n{''.join(body)}", namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    setattr(cls, "__init__", init)  # noqa: B010
    return cls

Resources = Mapping[str, Decimal]
"""A resource vector: resource name -> exact quantity (cores, bytes, GPUs, percent)."""


def frozen_resources(values: Mapping[str, Decimal] | None = None) -> Resources:
    """A read-only copy, so snapshots stay immutable."""
    return MappingProxyType(dict(values or {}))


class PriorityClass(enum.Enum):
    """Priority classes, highest first; set by annotations admins and team leads own."""

    URGENT = "urgent"
    APPROVED = "approved"
    NORMAL = "normal"

    # Members are singletons, equal only to themselves: hashed by identity, in C (Enum's own
    # __hash__ is Python code, and a plan hashes a class several times per Workload).
    __hash__ = object.__hash__


class PriorityMode(enum.Enum):
    """Where the controller writes a Workload's priority."""

    BOOST = "boost"  # kueue.x-k8s.io/priority-boost annotation (Kueue PriorityBoost gate)
    SPEC = "spec"  # spec.priority, base remembered in wdrf.x-k8s.io/base-priority
    AUTO = "auto"  # boost when the gate is on, else spec (resolved by the live controller)


class ApprovedScope(enum.Enum):
    """How far a team lead's approval reaches."""

    TEAM = "team"  # orders the team's own work and may preempt its own normal work
    GLOBAL = "global"  # the approved band, above every team's normal work


class RequeueTimestamp(enum.Enum):
    """Kueue's `waitForPodsReady.requeuingStrategy.timestamp`: where a requeued Workload's
    wait starts."""

    EVICTION = "eviction"
    CREATION = "creation"


class KueueApiVersion(enum.Enum):
    V1BETA1 = "kueue.x-k8s.io/v1beta1"
    V1BETA2 = "kueue.x-k8s.io/v1beta2"


class TeamSource(enum.Enum):
    """What identifies a workload's team."""

    NAMESPACE = "namespace"
    LABEL = "label"
    LOCAL_QUEUE = "localqueue"


class CapacitySource(enum.Enum):
    AGENT = "agent"  # wdrf.x-k8s.io/gpu-inventory written by the node agent
    HAMI = "hami"  # hami.io/node-nvidia-register
    QUOTA = "quota"  # ClusterQueue nominal quotas


def pool_key(cluster_queue: str, cohort: str | None = None) -> str:
    """How a pool (the cohort, or a lone ClusterQueue, whose capacity shares are against) is
    named in the plan and the priority terms: `cohort/NAME` or `cq/NAME`."""
    return f"cohort/{cohort}" if cohort else f"cq/{cluster_queue}"


def pool_label(key: str) -> str:
    """`cq/gpu` -> "ClusterQueue gpu", `cohort/all` -> "cohort all" (for people)."""
    kind, sep, name = key.partition("/")
    if not sep:
        return key or "the pool"
    return {"cq": "ClusterQueue", "cohort": "cohort"}.get(kind, kind) + " " + name


@fast_init
@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Names one Kubernetes object in messages, Events and patches."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"

    @property
    def is_batch_job(self) -> bool:
        """A batch/v1 Job, exactly as Kueue matches a Workload's owner (a `batch/v2` or
        `example.com/v1` "Job" is someone else's kind)."""
        return is_batch_job(self.api_version, self.kind)


def is_batch_job(api_version: object, kind: object) -> bool:
    return api_version == "batch/v1" and kind == "Job"


def api_group(api_version: str) -> str:
    """The group of an apiVersion ("jobset.x-k8s.io/v1alpha2" -> "jobset.x-k8s.io")."""
    return api_version.rpartition("/")[0]


@fast_init
@dataclass(frozen=True, slots=True)
class InputProblem:
    """Bad input found while parsing or deciding: reported, never fatal to the loop."""

    object: ObjectRef | None
    field: str
    value: str
    message: str

    def __str__(self) -> str:
        where = str(self.object) if self.object else "input"
        return f"{where}: {self.field}={self.value!r}: {self.message}"


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    # Effective per-container request (limits first, then requests, as HAMi reads them).
    resources: Resources


@dataclass(frozen=True, slots=True)
class PodSet:
    name: str
    count: int
    containers: tuple[Container, ...]
    annotations: Mapping[str, str] = field(default_factory=_no_strings)  # pod template annotations

    def per_pod(self) -> Resources:
        total: dict[str, Decimal] = {}
        for c in self.containers:
            for r, q in c.resources.items():
                total[r] = total.get(r, Decimal(0)) + q
        return frozen_resources(total)


@dataclass(frozen=True, slots=True)
class PodSetAssignment:
    """One `status.admission.podSetAssignments[]` entry: what Kueue admitted of a pod set."""

    name: str
    count: int | None  # pods admitted (partial admission); None when Kueue did not say
    usage: Resources  # resourceUsage, already x count
    flavors: Mapping[str, str] = field(default_factory=_no_strings)  # resource -> flavor


@dataclass(frozen=True, slots=True)
class Admission:
    """`status.admission`: what Kueue actually reserved."""

    cluster_queue: str
    usage: Resources  # summed over pod sets (resourceUsage, already x count)
    flavors: Mapping[str, str] = field(default_factory=_no_strings)  # resource -> flavor
    pod_sets: tuple[PodSetAssignment, ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str
    uid: str
    api_version: KueueApiVersion
    queue_name: str
    created: datetime
    pod_sets: tuple[PodSet, ...]
    priority: int | None = None  # spec.priority as Kueue has it now
    priority_class_name: str | None = None
    # Its priority class is a Kueue WorkloadPriorityClass (not a Kubernetes PriorityClass):
    # MultiKueue forwards a priority change of such a Workload to its remote copy.
    workload_priority_class: bool = False
    active: bool = True
    quota_reserved: bool = False
    admitted: bool = False
    finished: bool = False
    admission: Admission | None = None
    labels: Mapping[str, str] = field(default_factory=_no_strings)
    annotations: Mapping[str, str] = field(default_factory=_no_strings)
    owner: ObjectRef | None = None  # controller owner (a Job, a JobSet...; None: pod groups)
    resource_version: str = ""
    # When Kueue last evicted it (Evicted=True, else Requeued): its wait restarts there when
    # Kueue's requeuingStrategy.timestamp is Eviction.
    last_eviction: datetime | None = None
    # When its current quota reservation began (QuotaReserved=True transition): how long it
    # has run, for the reclaim's minimum run time and its choice of victims.
    reserved_since: datetime | None = None
    # When Kueue last preempted it (Preempted=True, else Evicted=True with reason Preempted):
    # counted against a pool's reclaim budget.
    preempted_at: datetime | None = None
    # When Kueue admitted it again after a preemption (it then sets Preempted=False with
    # reason QuotaReserved and this time): the preemption came before.
    preemption_cleared_at: datetime | None = None
    evicted: bool = False  # Evicted=True now
    # With `evicted` by a preemption: the UID of the Workload Kueue evicted it for (named in
    # the Evicted condition's message), "" when none or not named. Until that one is admitted
    # it is its ClusterQueue's sticky head: Kueue admits it next, with the value it carries.
    preempted_for: str = ""

    @property
    def last_preemption(self) -> datetime | None:
        """When a reclaim budget counts its last preemption: the preemption's time, or (once
        re-admitted) the re-admission's - the safe side, as the preemption came before it."""
        return self.preempted_at or self.preemption_cleared_at

    @property
    def evicting(self) -> bool:
        """Kueue evicted it and it still holds its quota (its pods are stopping): the quota
        is already on its way to whoever Kueue evicted it for."""
        return self.evicted and self.quota_reserved

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(
            "Workload", self.name, self.namespace, self.uid, self.api_version.value
        )

    @property
    def pending(self) -> bool:
        """Kueue's meaning: no QuotaReserved=True and no Finished=True (no Pending type)."""
        return not self.quota_reserved and not self.finished


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The owner batch/v1 Job of a Workload: users put class annotations here."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=_no_strings)
    labels: Mapping[str, str] = field(default_factory=_no_strings)
    suspended: bool = True
    ever_started: bool = False  # status.startTime set at any time
    template_annotations: Mapping[str, str] = field(default_factory=_no_strings)
    containers: tuple[Container, ...] = ()
    resource_version: str = ""

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("Job", self.name, self.namespace, self.uid, "batch/v1")


# Kinds Kueue integrates, besides batch/v1 Job, whose objects own Workloads ("group/Kind" ->
# plural resource). Users annotate those objects, so class annotations and team labels are read
# from them too (Kueue's plain-pod integration owns Workloads by Pods: annotate the Workload).
OWNER_KINDS: Mapping[str, str] = MappingProxyType({
    "jobset.x-k8s.io/JobSet": "jobsets",
    "ray.io/RayJob": "rayjobs",
    "ray.io/RayCluster": "rayclusters",
    "kubeflow.org/PyTorchJob": "pytorchjobs",
    "kubeflow.org/TFJob": "tfjobs",
    "kubeflow.org/MPIJob": "mpijobs",
    "kubeflow.org/XGBoostJob": "xgboostjobs",
    "kubeflow.org/PaddleJob": "paddlejobs",
    "kubeflow.org/JAXJob": "jaxjobs",
    "trainer.kubeflow.org/TrainJob": "trainjobs",
    "leaderworkerset.x-k8s.io/LeaderWorkerSet": "leaderworkersets",
    "workload.codeflare.dev/AppWrapper": "appwrappers",
})


@dataclass(frozen=True, slots=True)
class OwnerInfo:
    """A Workload's controller owner of a kind in OWNER_KINDS (a JobSet, a RayJob, ...): only
    what users annotate there. (batch/v1 Jobs are `JobInfo`: HAMi also reads their template.)"""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=_no_strings)
    labels: Mapping[str, str] = field(default_factory=_no_strings)
    resource_version: str = ""

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(self.kind, self.name, self.namespace, self.uid, self.api_version)


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    flavor: str
    resource: str
    nominal: Decimal
    borrowing_limit: Decimal | None = None
    lending_limit: Decimal | None = None


@dataclass(frozen=True, slots=True)
class Preemption:
    within_cluster_queue: str = "Never"
    reclaim_within_cohort: str = "Never"
    borrow_within_cohort: str = "Never"

    @property
    def can_evict(self) -> bool:
        """Can a pending Workload of this ClusterQueue evict admitted ones (its own, or in its
        cohort) by priority or reclaim?"""
        return (
            self.within_cluster_queue != "Never"
            or self.reclaim_within_cohort != "Never"
            or self.borrow_within_cohort != "Never"
        )


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    name: str
    api_version: KueueApiVersion
    quotas: tuple[ResourceQuota, ...] = ()
    cohort: str | None = None
    queueing_strategy: str = "BestEffortFIFO"
    preemption: Preemption = field(default_factory=Preemption)
    fair_sharing_weight: Decimal | None = None
    # admissionScope.admissionMode == UsageBasedAdmissionFairSharing
    admission_fair_sharing: bool = False
    # AdmissionCheck names from spec.admissionChecks and spec.admissionChecksStrategy
    admission_checks: tuple[str, ...] = ()

    def nominal(self) -> Resources:
        total: dict[str, Decimal] = {}
        for q in self.quotas:
            total[q.resource] = total.get(q.resource, Decimal(0)) + q.nominal
        return frozen_resources(total)


@dataclass(frozen=True, slots=True)
class AdmissionCheck:
    """A Kueue AdmissionCheck: which controller decides it (MULTIKUEUE_CONTROLLER: MultiKueue)."""

    name: str
    controller_name: str

    @property
    def multikueue(self) -> bool:
        return self.controller_name == MULTIKUEUE_CONTROLLER


@dataclass(frozen=True, slots=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    fair_sharing_weight: Decimal | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU as HAMi or the node agent reports it."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    split_count: int = 10
    cores: int = 100
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class NodeInventory:
    node: str
    source: CapacitySource
    gpus: tuple[GpuDevice, ...]
    observed: datetime | None = None  # agent timestamp; None for HAMi's annotation

    @property
    def healthy_gpus(self) -> int:
        return sum(1 for g in self.gpus if g.healthy)


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    """Kueue's `resources` manager configuration, as far as it decides whether a request for a
    resource a ClusterQueue does not cover blocks admission. Kueue's default: BlockUndeclared."""

    ignore_undeclared: bool = False
    transformed: frozenset[str] = frozenset()  # inputs of resource transformations
    excluded_prefixes: tuple[str, ...] = ()
    # waitForPodsReady.requeuingStrategy.timestamp, when the config says (same ConfigMap):
    # where a requeued Workload's wait starts (REQUEUE_TIMESTAMP auto follows it).
    requeue_timestamp: RequeueTimestamp | None = None

    def accepts(self, resource: str, covered: Iterable[str]) -> bool:
        if self.ignore_undeclared or resource in set(covered) or resource in self.transformed:
            return True
        return any(resource.startswith(p) for p in self.excluded_prefixes)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Everything one policy cycle reads. Immutable: same snapshot + clock -> same plan."""

    workloads: tuple[Workload, ...] = ()
    cluster_queues: tuple[ClusterQueue, ...] = ()
    local_queues: tuple[LocalQueue, ...] = ()
    jobs: tuple[JobInfo, ...] = ()
    owners: tuple[OwnerInfo, ...] = ()  # Workload owners of other Kueue-integrated kinds
    nodes: tuple[NodeInventory, ...] = ()
    admission_checks: tuple[AdmissionCheck, ...] = ()
    problems: tuple[InputProblem, ...] = ()  # objects that could not be parsed at all
    # When the state was observed: the live controller's clock, or for a file the newest
    # timestamp in it (kubectl output carries no capture time). None when unknown.
    observed: datetime | None = None
    # Kueue's requeuingStrategy.timestamp when known (the live controller reads Kueue's
    # config); None: the REQUEUE_TIMESTAMP setting decides (Kueue's default: eviction).
    requeue_timestamp: RequeueTimestamp | None = None
    # Kueue's `resources` configuration when known (the live controller reads it): decides
    # whether a GPU fraction a ClusterQueue does not cover may be written. None: unknown.
    quota_check: QuotaCheck | None = None
