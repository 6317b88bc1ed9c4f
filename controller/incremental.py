"""Incremental plans: `compute_plan` pool by pool, reusing a pool's part of the last plan while
nothing that part reads has changed.

A pool (a cohort, a lone ClusterQueue, or `-` for Workloads whose ClusterQueue is unknown) is
planned from its own Workloads, ClusterQueues, LocalQueues, owner objects and input problems,
and from a few cluster-wide values: the settings (with `TEAM_WEIGHTS: auto`, Kueue's weights
resolved over the whole cluster), the card memory, the aging reference, Kueue's requeue
timestamp and resources configuration. Each changed pool is planned by `compute_plan` on a
snapshot of that pool alone, and the parts are merged as `compute_plan` orders the whole:
pending Workloads by priority, queue time and UID, then admitted ones by key. The result equals
`compute_plan` on the whole snapshot (tests/unit/test_incremental.py compares them after every
step of random event sequences).

A pool's part is planned again when:
- one of its Workloads is added, removed or changed (compared by value, identity first: the
  live snapshot reuses a parsed object while its resourceVersion is unchanged), including one
  that moves to or from another pool;
- its ClusterQueues or LocalQueues, the owners (Jobs, JobSets...) of its Workloads, or the
  input problems reported on its pending Workloads change; `-` also when any ClusterQueue does
  (its capacity is the whole cluster's);
- a cluster-wide value changes: settings, resolved team weights, card memory, the aging
  reference (a rebase replans every pool), Kueue's configuration;
- with reclaim on, the clock crosses an instant where an admitted Workload of the pool reaches
  MIN_RUNTIME or one of its preemptions leaves the last hour (the reclaim budget).
The clock otherwise moves nothing in a plan (docs/policy.md, the encoding).

Where a pool cannot be planned alone the whole `compute_plan` runs instead (`fallback` says
why): usage history on (USAGE_HALF_LIFE > 0: the decay moves shares every cycle), node
inventories replacing the GPU quota of a cluster's only pool, and duplicate objects (two
Workloads with one UID or name, a Workload without a UID, two ClusterQueues, LocalQueues or
owners with one name).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from operator import attrgetter, itemgetter
from types import MappingProxyType

from controller.accounting import (
    UNKNOWN_POOL,
    UsageHistory,
    capacity_known,
    card_memory,
    gpu_inventory,
    pool_capacities,
    pool_of,
)
from controller.config import PolicySettings
from controller.domain import (
    ClusterQueue,
    ClusterSnapshot,
    InputProblem,
    JobInfo,
    LocalQueue,
    OwnerInfo,
    Workload,
)
from controller.encoding import queued_since, reference, requeue_mode
from controller.plan import Plan, TeamShare, WorkloadDecision
from controller.policy import compute_plan, kueue_team_weights, plan_warnings, team_summary

__all__ = ["IncrementalPlanner"]

# Seconds either side of a reclaim instant within which a part is planned again (the policy
# compares float POSIX seconds; this is far above their rounding).
CLOCK_MARGIN = 1e-3
HOUR = 3600.0  # the reclaim budget's window (`policy._Exposer.budget_left`)

PendingKey = tuple[int, datetime, str]  # `policy.order`'s sort key
_Merged = tuple[tuple[WorkloadDecision, ...], Mapping[tuple[str, str], TeamShare],
                Mapping[str, TeamShare]]
_FINISHED, _UID = attrgetter("finished"), attrgetter("uid")
_NAMESPACE, _NAME = attrgetter("namespace"), attrgetter("name")


@dataclass(frozen=True, slots=True)
class _Inputs:
    """Everything one pool's part reads from the snapshot, compared by value."""

    workloads: tuple[Workload, ...]  # members, in snapshot order
    queues: tuple[ClusterQueue, ...]
    local_queues: tuple[LocalQueue, ...]
    jobs: tuple[JobInfo, ...]
    owners: tuple[OwnerInfo, ...]
    problems: tuple[InputProblem, ...]


@dataclass(frozen=True, slots=True)
class _Part:
    """One pool's part of a plan, with what it was planned from."""

    inputs: _Inputs
    planned_at: float  # POSIX seconds
    instants: tuple[float, ...]  # sorted: where the reclaim's view of the pool changes
    pending: tuple[tuple[PendingKey, WorkloadDecision], ...]  # in `order`'s order
    admitted: tuple[WorkloadDecision, ...]
    shares: tuple[tuple[tuple[str, str], TeamShare], ...]
    unknown: int  # pending Workloads with no ClusterQueue

    def valid_at(self, now: float) -> bool:
        """No reclaim instant lies between when it was planned and `now`."""
        lo, hi = sorted((self.planned_at, now))
        i = bisect.bisect_left(self.instants, lo - CLOCK_MARGIN)
        return i == len(self.instants) or self.instants[i] > hi + CLOCK_MARGIN


class _Fallback(Exception):
    """The snapshot cannot be planned pool by pool (the message says why)."""


class IncrementalPlanner:
    """`plan` returns what `compute_plan` returns, replanning only the pools whose inputs
    changed since the last call. One instance per control loop (not thread-safe)."""

    def __init__(self) -> None:
        self._parts: dict[str, _Part] = {}
        self._cluster: tuple[object, ...] | None = None
        self._merged: _Merged | None = None  # the parts' decisions and shares, merged
        self.replanned: tuple[str, ...] = ()  # pools planned by the last call
        self.pools = 0  # pools in the last plan
        self.fallback = ""  # why the last call planned the whole snapshot ("" = it did not)

    def plan(self, snapshot: ClusterSnapshot, settings: PolicySettings, now: datetime,
             history: UsageHistory | None = None) -> Plan:
        try:
            plan = self._plan(snapshot, settings, now)
            self.fallback = ""
            return plan
        except _Fallback as why:
            self._parts.clear()
            self._merged = None
            self._cluster = None
            self.fallback = str(why)
            self.replanned, self.pools = ("*",), 0
            return compute_plan(snapshot, settings, now, history)

    # ----------------------------------------------------------------------------------------

    def _plan(self, snapshot: ClusterSnapshot, settings: PolicySettings, now: datetime) -> Plan:
        if settings.usage_half_life > 0:
            raise _Fallback("usage history (USAGE_HALF_LIFE) moves every pool's shares")
        kueue_weights, weight_notes = kueue_team_weights(snapshot, settings)
        effective = settings
        if settings.weights_from_kueue():
            effective = replace(settings, team_weights=MappingProxyType(kueue_weights))
        inventory, _ = gpu_inventory(snapshot.nodes, effective, now)
        card = card_memory(inventory, effective)
        capacities, _ = pool_capacities(snapshot.cluster_queues, inventory)
        if inventory and capacities != pool_capacities(snapshot.cluster_queues, [])[0]:
            raise _Fallback("node inventories replace the only pool's GPU quota")
        # Parts are planned without nodes: the card memory they would give comes as a setting.
        own = float(effective.gpu_memory_mib) if effective.gpu_memory_mib else None
        if card != own:
            if card is None or card != int(card):
                raise _Fallback(f"card memory {card} is not a whole number of MiB")
            effective = replace(effective, gpu_memory_mib=int(card))
        ref = reference(now, effective.rebase_period)
        cluster = (effective, ref, snapshot.requeue_timestamp, snapshot.quota_check)
        if cluster != self._cluster:
            self._parts.clear()
            self._cluster = cluster

        inputs, plan_problems = _split(snapshot)
        now_ts = now.timestamp()
        replanned: list[str] = []
        parts: dict[str, _Part] = {}
        for pool, given in inputs.items():
            part = self._parts.get(pool)
            if part is None or part.inputs != given or not part.valid_at(now_ts):
                part = _plan_part(pool, given, snapshot, effective, now)
                replanned.append(pool)
            parts[pool] = part
        if replanned or parts.keys() != self._parts.keys() or self._merged is None:
            self._merged = _merge(parts)
        self._parts = parts
        self.replanned, self.pools = tuple(sorted(replanned)), len(parts)
        decisions, shares, teams = self._merged
        warnings = plan_warnings(
            snapshot.cluster_queues, sum(p.unknown for p in parts.values()),
            {team for (_pool, team) in shares}, capacity_known(capacities, effective),
            (w for w in snapshot.workloads if not w.finished), settings)
        return Plan(
            now=now,
            decisions=decisions,
            teams=teams,
            problems=tuple(plan_problems),
            warnings=(*warnings, *weight_notes),
            history=None,
            pool_shares=shares,
            reference=ref,
        )


def _merge(parts: dict[str, _Part]) -> _Merged:
    """The parts' decisions as `compute_plan` orders them (pending by `policy.order`'s key,
    then admitted by key), their (pool, team) shares by key, and the teams' summary."""
    pending = [entry for part in parts.values() for entry in part.pending]
    pending.sort(key=itemgetter(0))
    admitted = [d for part in parts.values() for d in part.admitted]
    admitted.sort(key=attrgetter("key"))
    shares = MappingProxyType(
        {pt: ts for pool in sorted(parts) for pt, ts in parts[pool].shares})
    return (*map(itemgetter(1), pending), *admitted), shares, team_summary(shares)


def _unique(keys: Iterable[object], what: str) -> None:
    seen: set[object] = set()
    for k in keys:
        if k in seen:
            raise _Fallback(f"two {what} named {k}")
        seen.add(k)


def _split(snapshot: ClusterSnapshot) -> tuple[dict[str, _Inputs], list[InputProblem]]:
    """Each pool's inputs (as `policy.account` assigns Workloads to pools), and the input
    problems no pending Workload carries (the plan's own)."""
    queues = snapshot.cluster_queues
    _unique((cq.name for cq in queues), "ClusterQueues")
    _unique((lq.key for lq in snapshot.local_queues), "LocalQueues")
    _unique(((j.namespace, j.name) for j in snapshot.jobs), "Jobs")
    _unique(((o.namespace, o.kind, o.name) for o in snapshot.owners), "owners")
    pool_by_cq = {cq.name: pool_of(cq) for cq in queues}
    lq_to_cq = {(lq.namespace, lq.name): lq.cluster_queue for lq in snapshot.local_queues}

    workloads = snapshot.workloads
    if any(map(_FINISHED, workloads)):
        workloads = tuple(w for w in workloads if not w.finished)
    # No duplicate UID or name, no Workload without a UID (checked in C: this runs every cycle).
    uids = set(map(_UID, workloads))
    names = set(zip(map(_NAMESPACE, workloads), map(_NAME, workloads), strict=True))
    if len(uids) != len(workloads) or "" in uids or len(names) != len(workloads):
        raise _Fallback("two Workloads with one UID or name, or a Workload without a UID")
    # The pool of each LocalQueue and ClusterQueue, as `policy.account` assigns Workloads.
    pool_of_lq = {key: pool_by_cq.get(cq, UNKNOWN_POOL) if cq else UNKNOWN_POOL
                  for key, cq in lq_to_cq.items()}
    members: dict[str, list[Workload]] = {}
    for w in workloads:
        if w.quota_reserved:
            adm = w.admission
            if adm is not None:
                cq = adm.cluster_queue
                pool = pool_by_cq.get(cq, UNKNOWN_POOL) if cq else UNKNOWN_POOL
            else:
                pool = pool_of_lq.get((w.namespace, w.queue_name), UNKNOWN_POOL)
        elif w.active:
            pool = pool_of_lq.get((w.namespace, w.queue_name), UNKNOWN_POOL)
        else:
            continue  # deactivated and pending: in no pool
        found = members.get(pool)
        if found is None:
            members[pool] = [w]
        else:
            found.append(w)
    pending = {(w.namespace, w.name): pool for pool, wls in members.items() for w in wls
               if not w.quota_reserved} if snapshot.problems else {}

    problems: dict[str, list[InputProblem]] = {}
    plan_problems: list[InputProblem] = []
    for prob in snapshot.problems:  # routed as `policy.gather` routes them
        o = prob.object
        pool_of_problem = pending.get((o.namespace, o.name)) if (
            o is not None and o.kind == "Workload"
            and prob.field not in ("metadata.uid", "metadata.name")) else None
        if pool_of_problem is None:
            plan_problems.append(prob)
        else:
            problems.setdefault(pool_of_problem, []).append(prob)

    queues_of: dict[str, list[ClusterQueue]] = {}
    for queue in queues:
        queues_of.setdefault(pool_by_cq[queue.name], []).append(queue)
    local_of: dict[str, list[LocalQueue]] = {}
    for lq in snapshot.local_queues:
        local_of.setdefault(pool_by_cq.get(lq.cluster_queue, UNKNOWN_POOL), []).append(lq)
    jobs = {(j.namespace, j.name): j for j in snapshot.jobs} if snapshot.jobs else {}
    owners = ({(o.namespace, o.kind, o.name): o for o in snapshot.owners}
              if snapshot.owners else {})

    out: dict[str, _Inputs] = {}
    for pool, wls in members.items():
        my_jobs: dict[int, JobInfo] = {}
        my_owners: dict[int, OwnerInfo] = {}
        for w in wls:
            o = w.owner
            if o is None:
                continue
            if o.is_batch_job:
                j = jobs.get((w.namespace, o.name))
                if j is not None:
                    my_jobs[id(j)] = j
            else:
                other = owners.get((w.namespace, o.kind, o.name))
                if other is not None:
                    my_owners[id(other)] = other
        out[pool] = _Inputs(
            workloads=tuple(wls),
            # `-` is charged against the whole cluster: every ClusterQueue's capacity.
            queues=queues if pool == UNKNOWN_POOL else tuple(queues_of.get(pool, ())),
            local_queues=tuple(local_of.get(pool, ())),
            jobs=tuple(my_jobs.values()),
            owners=tuple(my_owners.values()),
            problems=tuple(problems.get(pool, ())),
        )
    return out, plan_problems


def _plan_part(pool: str, given: _Inputs, snapshot: ClusterSnapshot, settings: PolicySettings,
               now: datetime) -> _Part:
    sub = ClusterSnapshot(
        workloads=given.workloads, cluster_queues=given.queues, local_queues=given.local_queues,
        jobs=given.jobs, owners=given.owners, problems=given.problems,
        observed=snapshot.observed, requeue_timestamp=snapshot.requeue_timestamp,
        quota_check=snapshot.quota_check,
    )
    plan = compute_plan(sub, settings, now)
    mode = requeue_mode(snapshot.requeue_timestamp, settings)
    by_key = {w.key: w for w in given.workloads}
    pending: list[tuple[PendingKey, WorkloadDecision]] = []
    admitted: list[WorkloadDecision] = []
    unknown = 0
    for d in plan.decisions:
        if d.admitted:
            admitted.append(d)
            continue
        unknown += d.cluster_queue is None
        b = d.breakdown
        if b is not None:
            pending.append(((-d.target_priority, b.queued_since, d.uid), d))
        else:  # left unchanged: ordered by what Kueue has now (`policy.kueue_priority`)
            current = (d.current_priority or 0) + (d.current_boost or 0)
            pending.append(((-current, queued_since(by_key[d.key], mode), d.uid), d))
    instants: list[float] = []
    if settings.reclaim_enabled:
        for w in given.workloads:
            if w.quota_reserved and w.reserved_since is not None:
                instants.append(w.reserved_since.timestamp() + settings.min_runtime)
            if w.preempted_at is not None:
                instants.append(w.preempted_at.timestamp() + HOUR)
    return _Part(
        inputs=given, planned_at=now.timestamp(), instants=tuple(sorted(instants)),
        pending=tuple(pending), admitted=tuple(admitted),
        shares=tuple(plan.pool_shares.items()), unknown=unknown,
    )
