"""Who is a team, what each team uses, what each pool has, and weighted dominant shares.

Quantities are exact `Decimal`s in the domain; here, at the accounting boundary, they become
floats once, because share math is a ratio compared against quantized levels and a plan over
15,000 workloads must take milliseconds.

GPU work is counted in GPU-equivalents (docs/policy.md, "What a written value is"): one
container's GPU use is `gpu x max(cores%, memory%) / 100`, so four 25 % jobs weigh one GPU,
not four.

A **pool** is what a Workload competes in: its ClusterQueue's cohort (every ClusterQueue of the
cohort lends to the others), or the ClusterQueue alone when it has no cohort. A team's share is
computed per pool, against that pool's capacity, with resource flavors kept apart ("h100:
nvidia.com/gpu" and "a100:nvidia.com/gpu" are different dimensions).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING

from controller.domain import (
    CPU,
    GPU,
    GPUCORES,
    GPUMEM,
    GPUMEM_PERCENTAGE,
    MEMORY,
    CapacitySource,
    ClusterQueue,
    Container,
    InputProblem,
    NodeInventory,
    PodSet,
    TeamSource,
    Workload,
    frozen_resources,
    pool_key,
)
from controller.plan import TeamShare
from controller.usage import UsageHistory

if TYPE_CHECKING:
    from controller.config import PolicySettings

__all__ = ["UsageHistory"]

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
_GPU_RESOURCES = frozenset({GPU, GPUCORES, GPUMEM, GPUMEM_PERCENTAGE})
UNKNOWN_POOL = "-"

Vector = dict[str, float]


def is_known_resource(name: str, settings: PolicySettings) -> bool:
    return (
        name in _BUILTIN_RESOURCES
        or name in settings.resource_weights
        or name.startswith(("hugepages-", "requests.", "limits."))
    )


# --------------------------------------------------------------------------------------------
# Teams


def team_of(
    workload: Workload,
    settings: PolicySettings,
    job_labels: Mapping[str, str] | None = None,
) -> str:
    """A workload's team: its namespace (default), a label (workload, then owner Job), or its
    LocalQueue (`namespace/queue`). Falls back to the namespace when the label is missing.
    TEAM_NAMESPACES maps namespaces to teams (namespace mode): a source users cannot forge."""
    source = settings.team_source
    if source is TeamSource.LABEL:
        value = workload.labels.get(settings.team_label_key)
        if not value and job_labels:
            value = job_labels.get(settings.team_label_key)
        return value or workload.namespace
    if source is TeamSource.LOCAL_QUEUE:
        return f"{workload.namespace}/{workload.queue_name}"
    return settings.team_namespaces.get(workload.namespace, workload.namespace)


def team_weight(team: str, settings: PolicySettings) -> float:
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
    pod_sets: Iterable[PodSet], card_memory_mib: float | None, count: int | None = None
) -> tuple[float, float, float]:
    """(GPU-equivalents, compute, memory) of the pod sets; `count` replaces each pod set's
    count (what Kueue admitted of a single pod set)."""
    eq = cores = mem = 0.0
    for ps in pod_sets:
        n = ps.count if count is None else count
        for c in ps.containers:
            if GPU not in c.resources:
                continue
            e, k, m = container_gpu(c, card_memory_mib)
            eq += e * n
            cores += k * n
            mem += m * n
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




def resource_problems(
    workload: Workload, settings: PolicySettings
) -> list[tuple[InputProblem, bool]]:
    """Problems in a workload's container resources, each with `blocking` (leave unchanged)."""
    out: list[tuple[InputProblem, bool]] = []
    for ps in workload.pod_sets:
        for c in ps.containers:
            if _PLAIN_RESOURCES.issuperset(c.resources):  # hot path: nothing to check (in C)
                continue
            for name, q in c.resources.items():
                if name in _PLAIN_RESOURCES:
                    continue
                if name == GPUMEM:
                    if q == q.to_integral_value() and 0 <= q <= MAX_GPUMEM_MIB:
                        continue
                    why, blocking = ("nvidia.com/gpumem must be a plain integer of MiB (e.g. "
                                     "8192, not 8Gi); HAMi drops the GPU request otherwise"), True
                elif name in (GPUCORES, GPUMEM_PERCENTAGE):
                    if 0 <= q <= 100:
                        continue
                    why, blocking = "must be a percentage 0..100", True
                elif is_known_resource(name, settings):
                    continue
                else:
                    why, blocking = ("unknown resource: not counted in fair share (add it to "
                                     "RESOURCE_WEIGHTS to count it)"), False
                where = f"spec.podSets[{ps.name}].containers[{c.name}].resources.{name}"
                out.append((InputProblem(workload.ref, where, str(q), why), blocking))
    return out


# --------------------------------------------------------------------------------------------
# Usage and capacity


def dimension(flavor: str | None, resource: str) -> str:
    """A share dimension: the resource, qualified by its flavor when Kueue assigned one."""
    return f"{flavor}:{resource}" if flavor else resource


def resource_of(dim: str) -> str:
    return dim.rpartition(":")[2]


def pool_of(cq: ClusterQueue | None) -> str:
    """The pool a ClusterQueue's Workloads compete in: its cohort, else itself."""
    if cq is None:
        return UNKNOWN_POOL
    return pool_key(cq.name, cq.cohort)


def _add(vec: Vector, dim: str, value: float) -> None:
    vec[dim] = vec.get(dim, 0.0) + value


def admitted_usage(w: Workload, card_memory_mib: float | None) -> Vector:
    """Usage of an admitted workload: Kueue's reservation (`status.admission`), per pod set
    assignment and flavor, for ordinary resources; GPU dimensions recomputed as GPU-equivalents
    from the pod sets times the admitted count (a partially admitted gang is charged for what
    was admitted), because Kueue counts a 25 % container as a whole GPU."""
    out: Vector = {}
    adm = w.admission
    if adm is not None and adm.pod_sets:
        specs = {ps.name: ps for ps in w.pod_sets}
        for psa in adm.pod_sets:
            for name, q in psa.usage.items():
                if name not in _GPU_RESOURCES:
                    _add(out, dimension(psa.flavors.get(name), name), float(q))
            spec = specs.get(psa.name)
            if spec is None:
                continue
            count = spec.count if psa.count is None else psa.count
            eq, cores, mem = pod_sets_gpu((spec,), card_memory_mib, count)
            if eq:
                flavor = psa.flavors.get(GPU)
                _add(out, dimension(flavor, GPU), eq)
                _add(out, dimension(flavor, GPUCORES), cores)
                _add(out, dimension(flavor, GPUMEM_PERCENTAGE), mem)
        return out
    if adm is not None:
        for name, q in adm.usage.items():
            if name not in _GPU_RESOURCES:
                _add(out, dimension(adm.flavors.get(name), name), float(q))
        flavor = adm.flavors.get(GPU)
    else:  # admitted without status.admission (reported by the parser): fall back to requests
        for ps in w.pod_sets:
            for name, q in ps.per_pod().items():
                if name not in _GPU_RESOURCES:
                    _add(out, name, float(q) * ps.count)
        flavor = None
    eq, cores, mem = pod_sets_gpu(w.pod_sets, card_memory_mib)
    if eq:
        _add(out, dimension(flavor, GPU), eq)
        _add(out, dimension(flavor, GPUCORES), cores)
        _add(out, dimension(flavor, GPUMEM_PERCENTAGE), mem)
    return out


def pending_demand(w: Workload, card_memory_mib: float | None) -> Vector:
    """What a pending Workload will reserve once admitted, in `admitted_usage`'s dimensions
    before Kueue picks flavors: requests x count, GPUs as GPU-equivalents."""
    out: Vector = {}
    gpu = False
    for ps in w.pod_sets:
        n = ps.count
        for c in ps.containers:
            for name, q in c.resources.items():
                if name not in _GPU_RESOURCES:
                    out[name] = out.get(name, 0.0) + float(q) * n
                elif name == GPU:
                    gpu = True
    if not gpu:  # `pod_sets_gpu` would find nothing
        return out
    eq, cores, mem = pod_sets_gpu(w.pod_sets, card_memory_mib)
    if eq:
        _add(out, GPU, eq)
        _add(out, GPUCORES, cores)
        _add(out, GPUMEM_PERCENTAGE, mem)
    return out


def demand_dimensions(cap: Mapping[str, float]) -> dict[str, str]:
    """resource -> the pool dimension a pending demand is counted in: the resource's only
    flavor there; a resource with several flavors (or none) is counted against all of them
    together (its unflavored dimension), since Kueue has not picked one yet."""
    flavored: dict[str, list[str]] = {}
    for dim in cap:
        resource = resource_of(dim)
        if dim != resource:
            flavored.setdefault(resource, []).append(dim)
    return {r: dims[0] for r, dims in flavored.items() if len(dims) == 1}


def prospective_base(usage: Mapping[str, float], cap: Mapping[str, float],
                     single: Mapping[str, str]) -> Vector:
    """A team's usage seen in the dimensions pending demands are counted in, so usage + demand
    add up: a resource with several flavors also gets its total over flavors; usage recorded
    without a flavor also counts in the flavor of a resource that has only one."""
    out: Vector = dict(usage)
    for dim, amount in usage.items():
        resource = resource_of(dim)
        if dim != resource:
            if resource not in single and resource in cap:
                _add(out, resource, amount)
        elif resource in single:
            _add(out, single[resource], amount)
    return out


def weighted_share(vec: Mapping[str, float], cap: Mapping[str, float],
                   settings: PolicySettings, team_weight_value: float) -> float:
    """Weighted dominant share of a vector (the lean form of `team_share`)."""
    weights = settings.resource_weights
    best = 0.0
    for dim, amount in vec.items():
        c = cap.get(dim, 0.0)
        w = weights.get(resource_of(dim), 0.0)
        if c > 0 and w > 0:
            s = amount / c * w / team_weight_value
            if s > best:
                best = s
    return best


def _fresh(inv: NodeInventory, now: datetime, max_age: float) -> bool:
    if inv.observed is None:
        return False
    return (now - inv.observed) <= timedelta(seconds=max_age)


def gpu_inventory(
    nodes: Iterable[NodeInventory], settings: PolicySettings, now: datetime
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


def card_memory(inventory: Iterable[NodeInventory], settings: PolicySettings) -> float | None:
    """Card memory (MiB) to turn gpumem into a percentage: the smallest healthy card seen
    (over-counting beats under-counting), else GPU_MEMORY_MIB, else unknown."""
    sizes = [g.memory_mib for inv in inventory for g in inv.gpus if g.healthy and g.memory_mib > 0]
    if sizes:
        return float(min(sizes))
    return float(settings.gpu_memory_mib) if settings.gpu_memory_mib else None


def pool_capacities(
    cluster_queues: Iterable[ClusterQueue], inventory: list[NodeInventory]
) -> tuple[dict[str, Vector], CapacitySource]:
    """Capacity per pool and dimension: the nominal quotas of the pool's ClusterQueues, per
    flavor. GPU compute and memory are measured in GPUs (GPU-equivalents), so their capacity
    is the GPU count. With one pool and one GPU flavor (or none), the healthy physical GPUs of
    the node inventory replace the GPU quota; with several, quotas (which GPUs a flavor maps
    to is not known here)."""
    pools: dict[str, dict[str, Decimal]] = {}
    for cq in cluster_queues:
        vec = pools.setdefault(pool_of(cq), {})
        for q in cq.quotas:
            if q.resource in (GPUCORES, GPUMEM, GPUMEM_PERCENTAGE):
                continue
            d = dimension(q.flavor, q.resource)
            vec[d] = vec.get(d, Decimal(0)) + q.nominal
    out: dict[str, Vector] = {
        pool: {d: float(q) for d, q in vec.items()} for pool, vec in pools.items()
    }
    source = CapacitySource.QUOTA
    if inventory:
        gpus = float(sum(inv.healthy_gpus for inv in inventory))
        if len(out) <= 1:
            only = out.setdefault(next(iter(out)) if out else UNKNOWN_POOL, {})
            gpu_dims = [d for d in only if resource_of(d) == GPU]
            if len(gpu_dims) <= 1:
                only[gpu_dims[0] if gpu_dims else GPU] = gpus
                source = CapacitySource.AGENT if any(
                    i.source is CapacitySource.AGENT for i in inventory
                ) else CapacitySource.HAMI
    for caps in out.values():
        for d in [d for d in caps if resource_of(d) == GPU]:
            flavor = d[: -len(GPU) - 1] if d != GPU else None
            caps[dimension(flavor, GPUCORES)] = caps[d]
            caps[dimension(flavor, GPUMEM_PERCENTAGE)] = caps[d]
        # Usage recorded without a flavor (no podSetAssignments flavors) is measured against
        # all flavors of its resource together.
        totals: Vector = {}
        for dim, amount in caps.items():
            if dim != resource_of(dim):
                _add(totals, resource_of(dim), amount)
        for resource, amount in totals.items():
            caps.setdefault(resource, amount)
    return out, source


def capacity_known(pools: Mapping[str, Vector], settings: PolicySettings) -> bool:
    """Some pool has capacity of a resource with a weight (else every share is 0)."""
    weighted = {resource_of(d) for vec in pools.values() for d, q in vec.items() if q > 0}
    return any(settings.resource_weights.get(r, 0) > 0 for r in weighted)


def cluster_capacity(pools: Mapping[str, Vector]) -> Vector:
    """All pools together (Workloads whose ClusterQueue is unknown are charged against it)."""
    total: Vector = {}
    for vec in pools.values():
        for d, q in vec.items():
            _add(total, d, q)
    return total


# --------------------------------------------------------------------------------------------
# Shares


def team_share(
    team: str, usage: Mapping[str, float], cap: Mapping[str, float], settings: PolicySettings,
    pool: str = "", exact_cap: Mapping[str, Decimal] | None = None,
) -> TeamShare:
    """Weighted dominant share: max over dimensions of usage/capacity x resource weight,
    divided by the team's weight. Dimensions with no capacity or weight are not compared.
    `exact_cap`: `exact_capacity(cap)`, when the caller has it (one per pool)."""
    tw = team_weight(team, settings)
    shares: dict[str, float] = {}
    dominant: str | None = None
    best = 0.0
    weights = settings.resource_weights
    for name in sorted(usage):
        c = cap.get(name, 0.0)
        w = weights.get(resource_of(name), 0.0)
        if c <= 0 or w <= 0:
            continue
        s = usage[name] / c * w / tw
        shares[name] = s
        if s > best:
            best, dominant = s, name
    return TeamShare(
        team=team,
        usage=frozen_resources({k: _exact(v) for k, v in sorted(usage.items())}),
        capacity=exact_capacity(cap) if exact_cap is None else exact_cap,
        shares=MappingProxyType(shares),
        dominant_resource=dominant,
        dominant_share=best,
        pool=pool,
    )


def exact_capacity(cap: Mapping[str, float]) -> Mapping[str, Decimal]:
    """A pool's capacity as `TeamShare.capacity` holds it."""
    return frozen_resources({k: _exact(v) for k, v in sorted(cap.items())})


def active_weights(
    shares: Mapping[tuple[str, str], TeamShare], present: Collection[tuple[str, str]],
    settings: PolicySettings,
) -> dict[str, float]:
    """W per pool: the sum of the weights of the teams active in it, i.e. with a Workload
    there (holding quota, or pending and active) or, with usage history, a decayed weighted
    share above ACTIVE_USAGE_CUTOFF. A team's entitlement in a pool is weight / W
    (`controller.policy.account` sets fairness levels and `TeamShare.usage_over_entitlement`
    with it)."""
    out: dict[str, float] = {}
    for (pool, team), ts in shares.items():
        if (pool, team) in present or ts.dominant_share > settings.active_usage_cutoff:
            out[pool] = out.get(pool, 0.0) + team_weight(team, settings)
    return out


def _exact(value: float) -> Decimal:
    return Decimal(repr(value)) if math.isfinite(value) else Decimal(0)


def fairness_factor(dominant_share: float, total_weight: float) -> float:
    """Slurm's classic fair-share factor 2^(-U/S) with U/S = usage over entitlement: a team's
    entitlement is weight / sum of active weights, so U/S = weighted dominant share x sum of
    weights. 1.0 = no usage, 0.5 = exactly its fair share, towards 0 above it."""
    exponent = max(dominant_share, 0.0) * max(total_weight, 1e-12)
    return 0.0 if exponent > 1e4 else math.pow(2.0, -exponent)


def fairness_level(
    dominant_share: float, total_weight: float, settings: PolicySettings,
    previous: int | None = None,
) -> int:
    """Quantized fairness level 0..FAIRNESS_LEVELS with hysteresis: a team keeps its previous
    level until its exact position passes that level by FAIRNESS_HYSTERESIS of a level either
    way, so a share that hovers at a boundary does not rewrite the team's Workloads. A team
    with no usage always has the top level."""
    levels = settings.fairness_levels
    exact = fairness_factor(dominant_share, total_weight) * levels
    fresh = min(levels, math.floor(exact + 1e-9))
    if previous is None or dominant_share <= 0 or not 0 <= previous <= levels:
        return fresh
    h = settings.fairness_hysteresis
    if previous - h <= exact < previous + 1 + h:
        return previous
    return fresh


def fairness_term(dominant_share: float, total_weight: float, settings: PolicySettings) -> int:
    """Fairness points of the level (no hysteresis): level x FAIRNESS_POINTS / levels."""
    level = fairness_level(dominant_share, total_weight, settings)
    return level_points(level, settings)


def level_points(level: int, settings: PolicySettings) -> int:
    return level * settings.fairness_points // settings.fairness_levels

