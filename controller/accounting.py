"""Who is a team, what each team uses, what the cluster has, and weighted dominant shares.

Quantities are exact `Decimal`s in the domain; here, at the accounting boundary, they become
floats once, because share math is a ratio compared against quantized levels and a plan over
15,000 workloads must take milliseconds.

GPU work is counted in GPU-equivalents (hami.md): one container's GPU use is
`gpu x max(cores%, memory%) / 100`, so four 25 % jobs weigh one GPU, not four.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from types import MappingProxyType

from controller.config import Settings
from controller.domain import (
    CPU,
    GPU,
    GPUCORES,
    GPUMEM,
    GPUMEM_PERCENTAGE,
    MEMORY,
    CapacitySource,
    ClusterSnapshot,
    Container,
    InputProblem,
    LocalQueue,
    NodeInventory,
    PodSet,
    TeamSource,
    Workload,
    frozen_resources,
)
from controller.plan import TeamShare

GPU_DIMENSIONS = (GPU, GPUCORES, GPUMEM_PERCENTAGE)
# Largest sane gpumem in MiB (1 TiB per card): bigger means a suffixed quantity like "8Gi",
# which HAMi cannot read (it drops the GPU request).
MAX_GPUMEM_MIB = 1 << 20
# Resources Kubernetes or HAMi define that need no RESOURCE_WEIGHTS entry to be "known".
_BUILTIN_RESOURCES = frozenset(
    {CPU, MEMORY, "ephemeral-storage", "pods", GPU, GPUCORES, GPUMEM, GPUMEM_PERCENTAGE,
     "nvidia.com/priority"}
)

_PLAIN_RESOURCES = frozenset({CPU, MEMORY, GPU, "ephemeral-storage", "pods"})

Vector = dict[str, float]


def is_known_resource(name: str, settings: Settings) -> bool:
    return (
        name in _BUILTIN_RESOURCES
        or name in settings.resource_weights
        or name.startswith(("hugepages-", "requests.", "limits."))
    )


# --------------------------------------------------------------------------------------------
# Teams


def team_of(
    workload: Workload,
    settings: Settings,
    job_labels: Mapping[str, str] | None = None,
) -> str:
    """A workload's team: its namespace (default), a label (workload, then owner Job), or its
    LocalQueue (`namespace/queue`). Falls back to the namespace when the label is missing."""
    source = settings.team_source
    if source is TeamSource.LABEL:
        value = workload.labels.get(settings.team_label_key)
        if not value and job_labels:
            value = job_labels.get(settings.team_label_key)
        return value or workload.namespace
    if source is TeamSource.LOCAL_QUEUE:
        return f"{workload.namespace}/{workload.queue_name}"
    return workload.namespace


def team_weight(team: str, settings: Settings) -> float:
    return settings.team_weights.get(team, 1.0)


# --------------------------------------------------------------------------------------------
# GPU-equivalents


def container_gpu(
    c: Container, card_memory_mib: float | None
) -> tuple[float, float, float]:
    """(GPU-equivalents, GPU compute, GPU memory), each in GPUs, for one container."""
    res = c.resources
    gpu_q = res.get(GPU)
    if gpu_q is None or gpu_q <= 0:
        return 0.0, 0.0, 0.0
    gpus = float(gpu_q)
    mem_pct: float
    pct = res.get(GPUMEM_PERCENTAGE)
    mib = res.get(GPUMEM)
    if pct is not None:
        mem_pct = float(pct)
    elif mib is not None and card_memory_mib:
        mem_pct = float(mib) / card_memory_mib * 100.0
    else:
        mem_pct = 100.0  # neither set (or card unknown): HAMi gives the whole card's memory
    mem_pct = min(max(mem_pct, 0.0), 100.0)
    cores = res.get(GPUCORES)
    if cores is not None:
        core_pct = min(max(float(cores), 0.0), 100.0)
    else:
        # HAMi's webhook adds gpucores: 100 when memory is exclusive; otherwise unthrottled.
        core_pct = 100.0 if mem_pct >= 100.0 else 0.0
    return gpus * max(core_pct, mem_pct) / 100.0, gpus * core_pct / 100.0, gpus * mem_pct / 100.0


def pod_sets_gpu(
    pod_sets: Iterable[PodSet], card_memory_mib: float | None
) -> tuple[float, float, float]:
    eq = cores = mem = 0.0
    for ps in pod_sets:
        for c in ps.containers:
            if GPU not in c.resources:
                continue
            e, k, m = container_gpu(c, card_memory_mib)
            eq += e * ps.count
            cores += k * ps.count
            mem += m * ps.count
    return eq, cores, mem


def gpu_summary(pod_sets: Iterable[PodSet], card_memory_mib: float | None) -> tuple[bool, bool]:
    """(asks for a GPU, some container takes less than whole GPUs) in one pass."""
    wants = fractional = False
    for ps in pod_sets:
        for c in ps.containers:
            res = c.resources
            if GPU in res:
                wants = True
                if GPUCORES in res or GPUMEM_PERCENTAGE in res or GPUMEM in res:
                    e, _, _ = container_gpu(c, card_memory_mib)
                    if e < float(res[GPU]):
                        fractional = True
    return wants, fractional


def is_fractional(pod_sets: Iterable[PodSet], card_memory_mib: float | None) -> bool:
    return gpu_summary(pod_sets, card_memory_mib)[1]


def requests_gpu(pod_sets: Iterable[PodSet]) -> bool:
    return gpu_summary(pod_sets, None)[0]


def resource_problems(workload: Workload, settings: Settings) -> list[tuple[InputProblem, bool]]:
    """Problems in a workload's container resources, each with `blocking` (leave unchanged)."""
    out: list[tuple[InputProblem, bool]] = []
    for ps in workload.pod_sets:
        for c in ps.containers:
            for name, q in c.resources.items():
                if name in _PLAIN_RESOURCES:  # hot path: nothing to check
                    continue
                where = f"spec.podSets[{ps.name}].containers[{c.name}].resources.{name}"
                if name == GPUMEM and (q != q.to_integral_value() or q > MAX_GPUMEM_MIB or q < 0):
                    out.append((
                        InputProblem(workload.ref, where, str(q),
                                     "nvidia.com/gpumem must be a plain integer of MiB (e.g. 8192,"
                                     " not 8Gi); HAMi drops the GPU request otherwise"),
                        True,
                    ))
                elif name in (GPUCORES, GPUMEM_PERCENTAGE) and not (0 <= q <= 100):
                    out.append((
                        InputProblem(workload.ref, where, str(q), "must be a percentage 0..100"),
                        True,
                    ))
                elif not is_known_resource(name, settings):
                    out.append((
                        InputProblem(workload.ref, where, str(q),
                                     "unknown resource: not counted in fair share (add it to "
                                     "RESOURCE_WEIGHTS to count it)"),
                        False,
                    ))
    return out


# --------------------------------------------------------------------------------------------
# Usage and capacity


def admitted_usage(w: Workload, card_memory_mib: float | None) -> Vector:
    """Usage of an admitted workload: Kueue's reservation (`status.admission`) for ordinary
    resources; GPU dimensions recomputed as GPU-equivalents from the pod sets, because Kueue
    counts a 25 % container as a whole GPU."""
    out: Vector = {}
    if w.admission is not None:
        for name, q in w.admission.usage.items():
            if name in (GPU, GPUCORES, GPUMEM, GPUMEM_PERCENTAGE):
                continue
            out[name] = float(q)
    else:  # admitted without status.admission (reported by the parser): fall back to requests
        for ps in w.pod_sets:
            for name, q in ps.per_pod().items():
                if name not in (GPU, GPUCORES, GPUMEM, GPUMEM_PERCENTAGE):
                    out[name] = out.get(name, 0.0) + float(q) * ps.count
    eq, cores, mem = pod_sets_gpu(w.pod_sets, card_memory_mib)
    if eq:
        out[GPU] = eq
        out[GPUCORES] = cores
        out[GPUMEM_PERCENTAGE] = mem
    return out


def _fresh(inv: NodeInventory, now: datetime, max_age: float) -> bool:
    if inv.observed is None:
        return False
    return (now - inv.observed) <= timedelta(seconds=max_age)


def gpu_inventory(
    nodes: Iterable[NodeInventory], settings: Settings, now: datetime
) -> tuple[list[NodeInventory], CapacitySource | None]:
    """The node inventories to trust, per CAPACITY_SOURCE (auto: fresh agent data per node,
    else HAMi's register annotation)."""
    wanted = settings.capacity_source
    if wanted == "quota":
        return [], None
    by_node: dict[str, dict[CapacitySource, NodeInventory]] = {}
    for inv in nodes:
        by_node.setdefault(inv.node, {})[inv.source] = inv
    chosen: list[NodeInventory] = []
    sources: set[CapacitySource] = set()
    for node in sorted(by_node):
        entries = by_node[node]
        agent = entries.get(CapacitySource.AGENT)
        if agent is not None and not _fresh(agent, now, settings.inventory_max_age):
            agent = None
        hami = entries.get(CapacitySource.HAMI)
        pick = {"agent": agent, "hami": hami, "auto": agent or hami}[wanted]
        if pick is not None:
            chosen.append(pick)
            sources.add(pick.source)
    source = None
    if sources:
        source = CapacitySource.AGENT if CapacitySource.AGENT in sources else CapacitySource.HAMI
    return chosen, source


def card_memory(inventory: Iterable[NodeInventory], settings: Settings) -> float | None:
    """Card memory (MiB) to turn gpumem into a percentage: the smallest healthy card seen
    (over-counting beats under-counting), else GPU_MEMORY_MIB, else unknown."""
    sizes = [g.memory_mib for inv in inventory for g in inv.gpus if g.healthy and g.memory_mib > 0]
    if sizes:
        return float(min(sizes))
    return float(settings.gpu_memory_mib) if settings.gpu_memory_mib else None


def capacity(
    snapshot: ClusterSnapshot, inventory: list[NodeInventory]
) -> tuple[Vector, CapacitySource]:
    """Cluster capacity per resource: nominal quotas of all ClusterQueues (the cohort's pool);
    GPUs from the node inventory (healthy physical GPUs) when there is one."""
    total: dict[str, Decimal] = {}
    for cq in snapshot.cluster_queues:
        for q in cq.quotas:
            total[q.resource] = total.get(q.resource, Decimal(0)) + q.nominal
    out: Vector = {name: float(q) for name, q in total.items()}
    source = CapacitySource.QUOTA
    if inventory:
        out[GPU] = float(sum(inv.healthy_gpus for inv in inventory))
        source = CapacitySource.AGENT if any(
            i.source is CapacitySource.AGENT for i in inventory
        ) else CapacitySource.HAMI
    # Compute and memory of GPUs are measured in GPUs too (GPU-equivalents of each).
    gpus = out.get(GPU, 0.0)
    out[GPUCORES] = gpus
    out[GPUMEM_PERCENTAGE] = gpus
    out.pop(GPUMEM, None)
    return out, source


# --------------------------------------------------------------------------------------------
# Shares


def team_share(
    team: str, usage: Mapping[str, float], cap: Mapping[str, float], settings: Settings
) -> TeamShare:
    """Weighted dominant share: max over resources of usage/capacity x resource weight,
    divided by the team's weight. Resources with no capacity or weight are not compared."""
    tw = team_weight(team, settings)
    shares: dict[str, float] = {}
    dominant: str | None = None
    best = 0.0
    for name in sorted(usage):
        c = cap.get(name, 0.0)
        w = settings.resource_weights.get(name, 0.0)
        if c <= 0 or w <= 0:
            continue
        s = usage[name] / c * w / tw
        shares[name] = s
        if s > best:
            best, dominant = s, name
    return TeamShare(
        team=team,
        usage=frozen_resources({k: Decimal(repr(v)) for k, v in sorted(usage.items())}),
        capacity=frozen_resources({k: Decimal(repr(v)) for k, v in sorted(cap.items())}),
        shares=MappingProxyType(shares),
        dominant_resource=dominant,
        dominant_share=best,
    )


def fairness_factor(dominant_share: float, total_weight: float) -> float:
    """Slurm's classic fair-share factor 2^(-U/S) with U/S = usage over entitlement: a team's
    entitlement is weight / sum of active weights, so U/S = weighted dominant share x sum of
    weights. 1.0 = no usage, 0.5 = exactly its fair share, towards 0 above it."""
    return math.pow(2.0, -max(dominant_share, 0.0) * max(total_weight, 1e-12))


def fairness_term(dominant_share: float, total_weight: float, settings: Settings) -> int:
    """Quantized fairness points: FAIRNESS_LEVELS levels of FAIRNESS_POINTS/levels each, so
    tiny usage changes do not change priorities (no writes)."""
    f = fairness_factor(dominant_share, total_weight)
    levels = settings.fairness_levels
    level = min(levels, math.floor(f * levels + 1e-9))
    return level * settings.fairness_points // levels


# --------------------------------------------------------------------------------------------
# Decayed usage history


@dataclass(frozen=True, slots=True)
class UsageHistory:
    """Exponentially decayed team usage (same units as usage): a value, stored by the live
    controller in a ConfigMap as JSON. `advance` is pure."""

    usage: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    timestamp: datetime | None = None

    def advance(
        self, current: Mapping[str, Mapping[str, float]], now: datetime, half_life: float
    ) -> UsageHistory:
        """Blend `current` usage in: old x d + current x (1 - d), d = 2^(-dt/half_life).
        Half-life 0 (or no earlier sample) means current usage only."""
        fresh = {t: dict(v) for t, v in current.items()}
        if half_life <= 0 or self.timestamp is None:
            return UsageHistory(_freeze(fresh), now)
        dt = max((now - self.timestamp).total_seconds(), 0.0)
        d = math.pow(2.0, -dt / half_life)
        out: dict[str, dict[str, float]] = {}
        for team in sorted(set(self.usage) | set(fresh)):
            old = self.usage.get(team, {})
            cur = fresh.get(team, {})
            vec = {}
            for r in sorted(set(old) | set(cur)):
                v = old.get(r, 0.0) * d + cur.get(r, 0.0) * (1.0 - d)
                if v > 1e-9:
                    vec[r] = v
            if vec:
                out[team] = vec
        return UsageHistory(_freeze(out), max(now, self.timestamp))

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": 1,
                "timestamp": self.timestamp.isoformat() if self.timestamp else None,
                "usage": {t: dict(v) for t, v in sorted(self.usage.items())},
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> UsageHistory:
        """Parse what `to_json` wrote; ValueError on anything else."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"usage history is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("usage history: expected an object with version 1")
        ts_raw = doc.get("timestamp")
        ts = datetime.fromisoformat(ts_raw) if isinstance(ts_raw, str) else None
        usage_raw = doc.get("usage", {})
        if not isinstance(usage_raw, dict):
            raise ValueError("usage history: usage must be an object")
        usage: dict[str, dict[str, float]] = {}
        for team, vec in usage_raw.items():
            if not isinstance(vec, dict):
                raise ValueError(f"usage history: usage[{team!r}] must be an object")
            usage[str(team)] = {}
            for r, v in vec.items():
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                    raise ValueError(f"usage history: usage[{team!r}][{r!r}] is not a number")
                usage[str(team)][str(r)] = float(v)
        return cls(_freeze(usage), ts)


def _freeze(usage: Mapping[str, Mapping[str, float]]) -> Mapping[str, Mapping[str, float]]:
    return MappingProxyType({t: MappingProxyType(dict(v)) for t, v in usage.items()})


def local_queue_index(local_queues: Iterable[LocalQueue]) -> dict[tuple[str, str], LocalQueue]:
    return {(lq.namespace, lq.name): lq for lq in local_queues}
