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
from itertools import compress, repeat
from operator import attrgetter, eq, is_, is_not, itemgetter, not_
from types import MappingProxyType
from typing import Any

from controller.accounting import (
    UNKNOWN_POOL,
    UsageHistory,
    Vector,
    capacity_known,
    card_memory,
    gpu_inventory,
    pool_capacities,
    pool_of,
)
from controller.classify import stand_in, stand_in_report, stand_in_values
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
from controller.policy import (
    PlanMemo,
    compute_plan,
    few_changed,
    kueue_team_weights,
    plan_warnings,
    team_summary,
)

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
_SECOND = itemgetter(1)
_ADMITTED, _CLUSTER_QUEUE = attrgetter("admitted"), attrgetter("cluster_queue")
_KIND = attrgetter("kind")
_OF_PRIORITY_CLASS = attrgetter("workload_priority_class")


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
        self._order = _PendingOrder()  # the parts' pending decisions, merged
        self._split = _Splitter()
        self._memos: dict[str, PlanMemo] = {}  # per pool
        self._queues: tuple[object, ...] | None = None  # what the next two were read from
        self._weights: tuple[dict[str, float], list[str]] = ({}, [])
        self._capacities: dict[str, Vector] = {}
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
            self._order = _PendingOrder()
            self._cluster = None
            self._split = _Splitter()
            self._memos.clear()
            self.fallback = str(why)
            self.replanned, self.pools = ("*",), 0
            return compute_plan(snapshot, settings, now, history)

    # ----------------------------------------------------------------------------------------

    def _plan(self, snapshot: ClusterSnapshot, settings: PolicySettings, now: datetime) -> Plan:
        if settings.usage_half_life > 0:
            raise _Fallback("usage history (USAGE_HALF_LIFE) moves every pool's shares")
        # Read from the queues alone: kept while they are equal (the same objects, in the
        # live snapshot, while their resourceVersions are).
        queues = (snapshot.cluster_queues, snapshot.local_queues, settings)
        if queues != self._queues:
            self._queues = queues
            self._weights = kueue_team_weights(snapshot, settings)
            self._capacities = pool_capacities(snapshot.cluster_queues, [])[0]
        kueue_weights, weight_notes = self._weights
        effective = settings
        if settings.weights_from_kueue():
            effective = replace(settings, team_weights=MappingProxyType(kueue_weights))
        inventory, _ = gpu_inventory(snapshot.nodes, effective, now)
        card = card_memory(inventory, effective)
        capacities = pool_capacities(snapshot.cluster_queues, inventory)[0] if inventory \
            else self._capacities
        if inventory and capacities != self._capacities:
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

        inputs, plan_problems = self._split(snapshot)
        now_ts = now.timestamp()
        replanned: list[str] = []
        parts: dict[str, _Part] = {}
        for pool, given in inputs.items():
            part = self._parts.get(pool)
            if part is None or part.inputs != given or not part.valid_at(now_ts):
                memo = self._memos.get(pool)
                if memo is None:
                    memo = self._memos[pool] = PlanMemo()
                part = _plan_part(pool, given, snapshot, effective, now, memo, part)
                replanned.append(pool)
            parts[pool] = part
        if replanned or parts.keys() != self._parts.keys() or self._merged is None:
            self._order.update(parts)
            self._merged = _merge(parts, self._order)
        self._parts = parts
        for gone in self._memos.keys() - parts.keys():
            del self._memos[gone]
        self.replanned, self.pools = tuple(sorted(replanned)), len(parts)
        decisions, shares, teams = self._merged
        warnings = plan_warnings(
            snapshot.cluster_queues, sum(p.unknown for p in parts.values()),
            {team for (_pool, team) in shares}, capacity_known(capacities, effective),
            _stand_in_warnings(self._split.stand_ins, settings), settings)
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


def _merge(parts: dict[str, _Part], order: _PendingOrder) -> _Merged:
    """The parts' decisions as `compute_plan` orders them (pending by `policy.order`'s key,
    from `order`, then admitted by key), their (pool, team) shares by key, and the teams'
    summary. (Each part is sorted already: the sort merges the runs.)"""
    admitted = [d for part in parts.values() for d in part.admitted]
    admitted.sort(key=attrgetter("key"))
    shares = MappingProxyType(
        {pt: ts for pool in sorted(parts) for pt, ts in parts[pool].shares})
    return (*order.decisions, *admitted), shares, team_summary(shares)


# Past these, the order is sorted again instead: entries replaced in place (a bisection each)
# and entries inserted or deleted (a bisection and a move of the lists' tails each).
_FEW_REPLACED, _FEW_MOVED = 1024, 64


class _PendingOrder:
    """The parts' pending decisions in `policy.order`'s order (by `PendingKey`, unique: it
    ends in the UID), kept from one merge to the next. A replanned part keeps the entries of
    the decisions its memo kept (the same objects), so when few entries changed these are
    moved in place (found by bisection) instead of merging every entry again: a Workload
    changed in one pool moves the ranks of a few dozen others, whose keys stay the same."""

    def __init__(self) -> None:
        self.keys: list[PendingKey] = []  # sorted
        self.decisions: list[WorkloadDecision] = []  # each with its key in `keys`
        self._pending: dict[str, tuple[tuple[PendingKey, WorkloadDecision], ...]] = {}

    def update(self, parts: Mapping[str, _Part]) -> None:
        gone: list[tuple[PendingKey, WorkloadDecision]] = []
        added: list[tuple[PendingKey, WorkloadDecision]] = []
        for pool in self._pending.keys() | parts.keys():
            before = self._pending.get(pool, ())
            after = parts[pool].pending if pool in parts else ()
            if before is after:
                continue
            # (the entries before are alive in `_pending`: their ids are theirs)
            ids_before, ids_after = set(map(id, before)), set(map(id, after))
            gone += (e for e in before if id(e) not in ids_after)
            added += (e for e in after if id(e) not in ids_before)
        self._pending = {pool: part.pending for pool, part in parts.items()}
        if not self._move(gone, added):
            entries = [entry for part in parts.values() for entry in part.pending]
            entries.sort(key=itemgetter(0))
            self.keys = list(map(itemgetter(0), entries))
            self.decisions = list(map(_SECOND, entries))

    def _move(self, gone: list[tuple[PendingKey, WorkloadDecision]],
              added: list[tuple[PendingKey, WorkloadDecision]]) -> bool:
        """Take `gone` out and put `added` in; False (the order is to be rebuilt) when that
        would take longer than sorting again, or an entry that left is not where its key
        says."""
        leaving = dict(gone)
        if len(leaving) != len(gone):
            return False  # two entries with one key: not from one plan
        moved = len(leaving) + len(added) - 2 * sum(1 for key, _d in added if key in leaving)
        if len(added) > _FEW_REPLACED or moved > _FEW_MOVED:
            return False
        keys, decisions = self.keys, self.decisions
        for key, d in added:
            i = bisect.bisect_left(keys, key)
            if key in leaving:  # the same place: a new decision (another rank) in its stead
                if i == len(keys) or keys[i] != key or decisions[i] is not leaving.pop(key):
                    return False
                decisions[i] = d
            else:
                keys.insert(i, key)
                decisions.insert(i, d)
        for key, d in leaving.items():
            i = bisect.bisect_left(keys, key)
            if i == len(keys) or keys[i] != key or decisions[i] is not d:
                return False
            del keys[i], decisions[i]
        return True


def _unique(keys: Iterable[object], what: str) -> None:
    seen: set[object] = set()
    for k in keys:
        if k in seen:
            raise _Fallback(f"two {what} named {k}")
        seen.add(k)


_NO_POOL = ""  # a deactivated pending Workload: in no pool (pool names are never empty)


class _Splitter:
    """Each pool's inputs (as `policy.account` assigns Workloads to pools), and the input
    problems no pending Workload carries (the plan's own).

    It keeps the last call's Workloads and their pools: a Workload object seen last time (the
    live snapshot reuses a parsed object while its resourceVersion is unchanged) keeps its
    pool while the ClusterQueues' and LocalQueues' pools are the same, and when only a few
    positions of the snapshot's Workloads hold another object, only the pools those objects
    leave or join are gathered again (the others keep their members, in the same order)."""

    def __init__(self) -> None:
        self._maps: tuple[dict[str, str], dict[tuple[str, str], str]] | None = None
        self._held: tuple[Workload, ...] = ()  # the last call's Workloads (keeps their ids)
        self._pools: list[str] = []  # the pool of each, `_NO_POOL` for none
        self._members: dict[str, tuple[Workload, ...]] = {}
        self._queues: tuple[Any, ...] | None = None  # (ClusterQueues, LocalQueues, maps...)
        self._owner_keys: dict[str, _OwnerKeys] = {}
        # The unfinished Workloads' UIDs and namespace/names (those of Workloads finished since
        # may stay: a newcomer with one is checked with the others).
        self._uids: set[str] = set()
        self._names: set[tuple[str, str]] = set()
        # The unfinished Workloads whose WorkloadPriorityClass is a class stand-in, by
        # (stand-in, base): their positions and keys (`stand_in_warnings`, kept position by
        # position like the pools).
        self.stand_ins: dict[tuple[str, int], dict[int, str]] = {}

    def _still_unique(self, workloads: tuple[Workload, ...], held: tuple[Workload, ...],
                      start: int, old_end: int, new_end: int) -> bool:
        """Whether the unfinished Workloads are still unique (UIDs set) after the middle
        `held[start:old_end]` became `workloads[start:new_end]`; False where that cannot be
        told from the sets (they are read again)."""
        uids, names = self._uids, self._names
        for w in held[start:old_end]:
            if not w.finished:
                uids.discard(w.uid)
                names.discard((w.namespace, w.name))
        for w in workloads[start:new_end]:
            if w.finished:
                continue
            name = (w.namespace, w.name)
            if not w.uid or w.uid in uids or name in names:
                return False
            uids.add(w.uid)
            names.add(name)
        return True

    def __call__(self, snapshot: ClusterSnapshot) -> tuple[dict[str, _Inputs],
                                                           list[InputProblem]]:
        queues = snapshot.cluster_queues
        if self._queues is None or self._queues[0] != queues \
                or self._queues[1] != snapshot.local_queues:
            self._queues = (queues, snapshot.local_queues, *_queue_maps(snapshot))
        pool_by_cq: dict[str, str] = self._queues[2]
        pool_of_lq: dict[tuple[str, str], str] = self._queues[3]
        queues_of: dict[str, tuple[ClusterQueue, ...]] = self._queues[4]
        local_of: dict[str, tuple[LocalQueue, ...]] = self._queues[5]
        # Jobs and owners by key, one per key (built in C: they can be as many as Workloads).
        jobs: dict[tuple[str, ...], JobInfo] = dict(zip(
            zip(map(_NAMESPACE, snapshot.jobs), map(_NAME, snapshot.jobs), strict=True),
            snapshot.jobs, strict=True))
        if len(jobs) != len(snapshot.jobs):
            _unique(((j.namespace, j.name) for j in snapshot.jobs), "Jobs")
        owners: dict[tuple[str, ...], OwnerInfo] = dict(zip(
            zip(map(_NAMESPACE, snapshot.owners), map(_KIND, snapshot.owners),
                map(_NAME, snapshot.owners), strict=True), snapshot.owners, strict=True))
        if len(owners) != len(snapshot.owners):
            _unique(((o.namespace, o.kind, o.name) for o in snapshot.owners), "owners")
        if (pool_by_cq, pool_of_lq) != self._maps:
            self._maps = (pool_by_cq, pool_of_lq)
            self._held, self._pools, self._members = (), [], {}

        def assign(w: Workload) -> str:
            if w.finished:
                return _NO_POOL
            if w.quota_reserved:
                adm = w.admission
                if adm is not None:
                    cq = adm.cluster_queue
                    return pool_by_cq.get(cq, UNKNOWN_POOL) if cq else UNKNOWN_POOL
                return pool_of_lq.get((w.namespace, w.queue_name), UNKNOWN_POOL)
            if w.active:
                return pool_of_lq.get((w.namespace, w.queue_name), UNKNOWN_POOL)
            return _NO_POOL

        # Positions are the snapshot's, finished Workloads included (in no pool): a pass that
        # reads every Workload object costs milliseconds at 50,000, so only the positions
        # that hold another object than last time are read.
        workloads = snapshot.workloads
        n, held = len(workloads), self._held
        changed: list[int] | None = None
        # Another length (Workloads added at the end, or gone from the middle): the positions
        # before `start` and from `old_end` (`new_end` now) on hold the same objects.
        shift: tuple[int, int, int] | None = None
        if held and n == len(held):  # the same positions: which hold another object (in C)
            changed = list(compress(range(n), map(is_not, workloads, held)))
            if not few_changed(len(changed), n):
                changed = None
        elif held:
            shift = _shifted(workloads, held)
            if shift is not None and not self._still_unique(workloads, held, *shift):
                shift = None
        if (changed is None and shift is None) or (changed is not None and any(
                (w := workloads[i]).uid != (h := held[i]).uid or w.namespace != h.namespace
                or w.name != h.name or (h.finished and not w.finished) for i in changed)):
            # No duplicate UID or name among the unfinished Workloads, none without a UID
            # (checked in C). (A changed object with its predecessor's UID and name, not
            # unfinished again, keeps last call's answer: no.)
            unfinished = tuple(compress(workloads, map(not_, map(_FINISHED, workloads))))
            uids = set(map(_UID, unfinished))
            names = set(zip(map(_NAMESPACE, unfinished), map(_NAME, unfinished), strict=True))
            if len(uids) != len(unfinished) or "" in uids or len(names) != len(unfinished):
                raise _Fallback("two Workloads with one UID or name, or a Workload without a UID")
            self._uids, self._names = uids, names

        members: dict[str, tuple[Workload, ...]]
        if changed is not None or shift is not None:
            touched: set[str] = set()
            stand_ins = self.stand_ins
            if changed is not None:
                pools = self._pools.copy()
                for i in changed:
                    touched.add(pools[i])
                    pools[i] = assign(workloads[i])
                    touched.add(pools[i])
                    _forget_stand_in(stand_ins, i, held[i])
                    _add_stand_in(stand_ins, i, workloads[i])
            else:
                assert shift is not None
                start, old_end, new_end = shift
                added = [assign(w) for w in workloads[start:new_end]]
                touched.update(self._pools[start:old_end], added)
                pools = [*self._pools[:start], *added, *self._pools[old_end:]]
                for i in range(start, old_end):
                    _forget_stand_in(stand_ins, i, held[i])
                if new_end != old_end:  # the positions after the middle move
                    for key, at in stand_ins.items():
                        stand_ins[key] = {i + new_end - old_end if i >= old_end else i: k
                                          for i, k in at.items()}
                for i in range(start, new_end):
                    _add_stand_in(stand_ins, i, workloads[i])
            members = dict(self._members)
            for pool in touched:
                mine = tuple(compress(workloads, map(eq, pools, repeat(pool))))
                if mine:
                    members[pool] = mine
                else:
                    members.pop(pool, None)
        else:
            known = dict(zip(map(id, held), self._pools, strict=True))
            found = list(map(known.get, map(id, workloads)))
            pools = [p if p is not None else assign(w)
                     for w, p in zip(workloads, found, strict=True)]
            grouped: dict[str, list[Workload]] = {}
            for w, pool in zip(workloads, pools, strict=True):
                mine_l = grouped.get(pool)
                if mine_l is None:
                    grouped[pool] = [w]
                else:
                    mine_l.append(w)
            members = {pool: tuple(wls) for pool, wls in grouped.items()}
            self.stand_ins = {}
            for i in compress(range(n), map(_OF_PRIORITY_CLASS, workloads)):
                _add_stand_in(self.stand_ins, i, workloads[i])
        members.pop(_NO_POOL, None)
        self._held, self._pools, self._members = workloads, pools, members

        pending = {(w.namespace, w.name): pool for w, pool in zip(workloads, pools, strict=True)
                   if pool != _NO_POOL and not w.quota_reserved} if snapshot.problems else {}
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

        out: dict[str, _Inputs] = {}
        owner_keys: dict[str, _OwnerKeys] = {}
        for pool, wls in members.items():
            keys = self._owner_keys.get(pool)
            if keys is None or keys[0] is not wls:  # its members changed: read their owners
                keys = (wls, *_owners_of(wls))
            owner_keys[pool] = keys
            out[pool] = _Inputs(
                workloads=wls,
                # `-` is charged against the whole cluster: every ClusterQueue's capacity.
                queues=queues if pool == UNKNOWN_POOL else queues_of.get(pool, ()),
                local_queues=local_of.get(pool, ()),
                # each found once, in the order its first Workload names it
                jobs=tuple(filter(None, map(jobs.get, keys[1]))) if jobs else (),
                owners=tuple(filter(None, map(owners.get, keys[2]))) if owners else (),
                problems=tuple(problems.get(pool, ())),
            )
        self._owner_keys = owner_keys
        return out, plan_problems


def _shifted(workloads: tuple[Workload, ...],
             held: tuple[Workload, ...]) -> tuple[int, int, int] | None:
    """(start, old end, new end) when `workloads` is `held` with few positions in between
    replaced, added or removed: the same objects before `start` and after the middle (found
    in C); None when the middle is not small."""
    least = min(len(workloads), len(held))
    start = next(compress(range(least), map(is_not, workloads, held)), least)
    tail = next(compress(range(least - start), map(is_not, reversed(workloads),
                                                   reversed(held))), least - start)
    old_end, new_end = len(held) - tail, len(workloads) - tail
    if not few_changed((old_end - start) + (new_end - start), len(workloads)):
        return None
    return start, old_end, new_end


def _stand_in_key(w: Workload) -> tuple[str, int] | None:
    """An unfinished Workload's (class stand-in, readable base), the key of `stand_ins`."""
    found = stand_in(w) if not w.finished else None
    if found is None or found[1] is None:
        return None
    return found[0], found[1]


def _add_stand_in(stand_ins: dict[tuple[str, int], dict[int, str]], i: int,
                  w: Workload) -> None:
    if (key := _stand_in_key(w)) is not None:
        stand_ins.setdefault(key, {})[i] = w.key


def _forget_stand_in(stand_ins: dict[tuple[str, int], dict[int, str]], i: int,
                     w: Workload) -> None:
    if (key := _stand_in_key(w)) is not None:
        at = stand_ins[key]
        del at[i]
        if not at:
            del stand_ins[key]


def _stand_in_warnings(stand_ins: Mapping[tuple[str, int], Mapping[int, str]],
                       settings: PolicySettings) -> list[str]:
    """`classify.stand_in_warnings` over the snapshot's Workloads, from `_Splitter.stand_ins`:
    per stand-in, the first position whose value is not the one the settings need."""
    want = stand_in_values(settings)
    first: dict[str, tuple[int, int, str]] = {}
    for (name, base), at in stand_ins.items():
        if base == want[name]:
            continue
        i = min(at)
        if name not in first or i < first[name][0]:
            first[name] = (i, base, at[i])
    return stand_in_report({name: (base, key) for name, (_i, base, key) in first.items()},
                           settings)


# (the members tuple they were read from, its owner Jobs' keys, its other owners' keys)
_OwnerKeys = tuple[tuple[Workload, ...], tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]


def _owners_of(wls: tuple[Workload, ...]) -> tuple[tuple[tuple[str, ...], ...],
                                                   tuple[tuple[str, ...], ...]]:
    """The keys of the Jobs and of the other owners the Workloads name, each once, in order."""
    jobs: dict[tuple[str, ...], None] = {}
    others: dict[tuple[str, ...], None] = {}
    for w in wls:
        o = w.owner
        if o is None:
            continue
        if o.is_batch_job:
            jobs[(w.namespace, o.name)] = None
        else:
            others[(w.namespace, o.kind, o.name)] = None
    return tuple(jobs), tuple(others)


def _queue_maps(snapshot: ClusterSnapshot) -> tuple[
        dict[str, str], dict[tuple[str, str], str], dict[str, tuple[ClusterQueue, ...]],
        dict[str, tuple[LocalQueue, ...]]]:
    """From the queues alone: each ClusterQueue's pool, each LocalQueue's pool (as
    `policy.account` assigns Workloads), and each pool's ClusterQueues and LocalQueues."""
    queues = snapshot.cluster_queues
    _unique((cq.name for cq in queues), "ClusterQueues")
    _unique((lq.key for lq in snapshot.local_queues), "LocalQueues")
    pool_by_cq = {cq.name: pool_of(cq) for cq in queues}
    pool_of_lq = {(lq.namespace, lq.name): pool_by_cq.get(lq.cluster_queue, UNKNOWN_POOL)
                  if lq.cluster_queue else UNKNOWN_POOL for lq in snapshot.local_queues}
    queues_of: dict[str, list[ClusterQueue]] = {}
    for queue in queues:
        queues_of.setdefault(pool_by_cq[queue.name], []).append(queue)
    local_of: dict[str, list[LocalQueue]] = {}
    for lq in snapshot.local_queues:
        local_of.setdefault(pool_by_cq.get(lq.cluster_queue, UNKNOWN_POOL), []).append(lq)
    return (pool_by_cq, pool_of_lq, {p: tuple(q) for p, q in queues_of.items()},
            {p: tuple(q) for p, q in local_of.items()})


def _plan_part(pool: str, given: _Inputs, snapshot: ClusterSnapshot, settings: PolicySettings,
               now: datetime, memo: PlanMemo, last: _Part | None) -> _Part:
    sub = ClusterSnapshot(
        workloads=given.workloads, cluster_queues=given.queues, local_queues=given.local_queues,
        jobs=given.jobs, owners=given.owners, problems=given.problems,
        observed=snapshot.observed, requeue_timestamp=snapshot.requeue_timestamp,
        quota_check=snapshot.quota_check,
    )
    # (`_Splitter` checked the Workloads: unfinished, UIDs and names unique)
    plan = compute_plan(sub, settings, now, memo=memo, unique=True)
    mode = requeue_mode(snapshot.requeue_timestamp, settings)
    # Pending decisions come first (`order`), then admitted ones (`guard_admitted`).
    decisions = plan.decisions
    flags = list(map(_ADMITTED, decisions))
    split = flags.index(True) if True in flags else len(flags)
    if not all(flags[split:]):
        raise AssertionError("compute_plan put a pending decision after an admitted one")
    mine = decisions[:split]
    # An identical decision (the memo's) keeps its entry (looked up in C; `last` holds the
    # decisions, so an id is theirs).
    known = dict(zip(map(id, map(_SECOND, last.pending)), last.pending, strict=True)) \
        if last is not None else {}
    rows: list[Any] = list(map(known.get, map(id, mine)))
    missing = list(compress(range(split), map(is_, rows, repeat(None))))
    ordered = memo.order
    if ordered is not None and len(ordered.keys) == split:
        # The memo's keys of these decisions, in the same order: `policy.order`'s (for one
        # left unchanged, by what Kueue has now: `policy.kueue_priority`).
        for i in missing:
            rows[i] = (ordered.keys[i], mine[i])
        missing = []
    unchanged = [mine[i] for i in missing if mine[i].breakdown is None]
    names = {d.key.partition("/")[2] for d in unchanged}
    by_key = {w.key: w for w in given.workloads if w.name in names} if names else {}
    for i in missing:
        d = mine[i]
        b = d.breakdown
        if b is not None:
            rows[i] = ((-d.target_priority, b.queued_since, d.uid), d)
        else:  # left unchanged: ordered by what Kueue has now (`policy.kueue_priority`)
            current = (d.current_priority or 0) + (d.current_boost or 0)
            rows[i] = ((-current, queued_since(by_key[d.key], mode), d.uid), d)
    pending: list[tuple[PendingKey, WorkloadDecision]] = rows
    admitted = decisions[split:]
    unknown = list(map(_CLUSTER_QUEUE, mine)).count(None)
    instants: list[float] = []
    if settings.reclaim_enabled:
        for w in given.workloads:
            if w.quota_reserved and w.reserved_since is not None:
                instants.append(w.reserved_since.timestamp() + settings.min_runtime)
            if (at := w.last_preemption) is not None:
                instants.append(at.timestamp() + HOUR)
    return _Part(
        inputs=given, planned_at=now.timestamp(), instants=tuple(sorted(instants)),
        pending=tuple(pending), admitted=tuple(admitted),
        shares=tuple(plan.pool_shares.items()), unknown=unknown,
    )
