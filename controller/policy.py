"""The WDRF priority policy: one pure, deterministic function from a snapshot to a plan.

`compute_plan` is a short pipeline of named stages, each returning dataclasses:

    gather    deduplicate, index queues and owners, route parser problems
    account   usage per (pool, team), capacity per pool, weighted dominant shares, fairness
              levels with hysteresis (controller.accounting)
    classify  class / override / base from annotations (controller.classify)
    score     per pending Workload: class band + base term + fairness + encoded aging
              (controller.encoding), HAMi decision; admitted Workloads that preemption can
              reach get their class guard
    order     Kueue's queue order, ranks per ClusterQueue, warnings

Pending:  priority = class_weight x PRIORITY_CLASS_UNIT + base term + fairness + aging, where
          aging = a x clamp(R + P - queued_since, 0, MAX_AGING_TIME + P) does not move with
          the clock (docs/policy.md); an admin override sets the priority outright.
Admitted: the class guard (`PolicySettings.guard`), above every pending Workload that must not
          preempt it, written once such a Workload reaches it (`guard_admitted`), so Kueue's
          preemption only ever sees class differences.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from itertools import compress, repeat
from operator import attrgetter, is_not, itemgetter, ne, not_
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from controller.accounting import (
    UNKNOWN_POOL,
    UsageHistory,
    Vector,
    active_weights,
    admitted_usage,
    capacity_known,
    card_memory,
    cluster_capacity,
    demand_dimensions,
    exact_capacity,
    fairness_level,
    gpu_inventory,
    gpu_summary,
    level_points,
    pending_demand,
    pool_capacities,
    pool_of,
    prospective_base,
    resource_of,
    resource_problems,
    team_of,
    team_share,
    team_weight,
    weighted_share,
)
from controller.classify import (
    Classified,
    StandIns,
    clamp_int32,
    classify,
    implied_base,
    reads_no_annotation,
    stand_in_warnings,
)
from controller.config import MAX_TEAM_WEIGHT, MIN_TEAM_WEIGHT, PolicySettings
from controller.domain import (
    INT32_MAX,
    INT32_MIN,
    PRIORITY_TERMS_ANNOTATION,
    ApprovedScope,
    ClusterQueue,
    ClusterSnapshot,
    InputProblem,
    JobInfo,
    LocalQueue,
    OwnerInfo,
    PriorityClass,
    TeamSource,
    Workload,
    api_group,
    fast_init,
)
from controller.encoding import (
    aging_term,
    base_term,
    exposed_terms,
    guard_terms,
    iso,
    pending_terms,
    queued_since,
    reference,
    requeue_mode,
)
from controller.hami import check_fraction, decide_by_rules, decide_hami, mentions_hami
from controller.plan import (
    EXPOSED_STATE,
    Exposure,
    ExposureReason,
    HamiDecision,
    Plan,
    PriorityBreakdown,
    TeamShare,
    WorkloadDecision,
    parse_terms,
    written_while_admitted,
)

__all__ = ["PlanMemo", "clamp_int32", "compute_plan", "implied_base"]

PoolTeam = tuple[str, str]
# The priority-terms `state` of an exposed admitted Workload, per reason.
_STATE = EXPOSED_STATE
_UID, _NAMESPACE, _NAME = attrgetter("uid"), attrgetter("namespace"), attrgetter("name")
_FINISHED = attrgetter("finished")


# --------------------------------------------------------------------------------------------
# gather


@dataclass(frozen=True, slots=True)
class Gathered:
    """The snapshot, cleaned and indexed: each Workload once, its team, pool and owner Job."""

    workloads: tuple[Workload, ...]  # unfinished, deduplicated
    jobs: Mapping[tuple[str, str], JobInfo]
    owners: Mapping[tuple[str, str, str], OwnerInfo]  # (namespace, kind, name)
    lq_to_cq: Mapping[tuple[str, str], str]
    queues: Mapping[str, ClusterQueue]
    plan_problems: tuple[InputProblem, ...]
    workload_problems: Mapping[tuple[str, str], tuple[InputProblem, ...]]


def _version(w: Workload) -> tuple[float, int, str]:
    rv = int(w.resource_version) if w.resource_version.isdigit() else -1
    return (w.created.timestamp(), rv, w.uid)


def deduplicate(workloads: Iterable[Workload]) -> tuple[list[Workload], list[InputProblem]]:
    """Each Workload counted once: the same UID twice (keep the newest resourceVersion), or the
    same namespace/name with two UIDs (keep the newest: Kueue recreated it). Deterministic
    whatever the input order."""
    problems: list[InputProblem] = []
    workloads = list(workloads)
    # Hot path, checked in C: every UID present and unique, every namespace/name unique. The
    # passes below would then return the Workloads in their input order.
    uids = set(map(_UID, workloads))
    if len(uids) == len(workloads) and "" not in uids and len(workloads) == len(
            set(zip(map(_NAMESPACE, workloads), map(_NAME, workloads), strict=True))):
        return workloads, problems

    def newest(index: dict[Any, Workload], key: object, w: Workload, field: str, value: str,
               message: str) -> None:
        other = index.get(key)
        if other is None:
            index[key] = w
            return
        keep, drop = (w, other) if _version(w) > _version(other) else (other, w)
        index[key] = keep
        problems.append(InputProblem(drop.ref, field, value, message))

    by_uid: dict[Any, Workload] = {}
    no_uid: list[Workload] = []
    for w in workloads:
        if w.uid:
            newest(by_uid, w.uid, w, "metadata.uid", w.uid,
                   "duplicate object in the snapshot: counted once")
        else:
            no_uid.append(w)
    by_key: dict[Any, Workload] = {}
    for w in [*by_uid.values(), *no_uid]:
        newest(by_key, (w.namespace, w.name), w, "metadata.name", w.key,
               "two objects with the same namespace/name: the newest is counted")
    return list(by_key.values()), problems


def gather(snapshot: ClusterSnapshot, unique: bool = False) -> Gathered:
    """`unique`: the caller has checked that no Workload is finished, and that UIDs (none
    empty) and namespace/names are unique: nothing to filter or deduplicate."""
    dup_problems: list[InputProblem] = []
    if unique:
        workloads = list(snapshot.workloads)
    else:
        everything = snapshot.workloads  # unfinished ones, filtered in C
        workloads, dup_problems = deduplicate(
            compress(everything, map(not_, map(_FINISHED, everything))))
    pending = {(w.namespace, w.name) for w in workloads
               if not w.quota_reserved and w.active} if snapshot.problems else set()
    plan_problems: list[InputProblem] = []
    per_workload: dict[tuple[str, str], list[InputProblem]] = {}
    for prob in (*snapshot.problems, *dup_problems):
        o = prob.object
        if o is not None and o.kind == "Workload" and (o.namespace, o.name) in pending \
                and prob.field not in ("metadata.uid", "metadata.name"):
            per_workload.setdefault((o.namespace, o.name), []).append(prob)
        else:
            plan_problems.append(prob)
    return Gathered(
        workloads=tuple(workloads),
        jobs=MappingProxyType({(j.namespace, j.name): j for j in snapshot.jobs}),
        owners=MappingProxyType({(o.namespace, o.kind, o.name): o for o in snapshot.owners}),
        lq_to_cq=MappingProxyType(
            {(lq.namespace, lq.name): lq.cluster_queue for lq in snapshot.local_queues}
        ),
        queues=MappingProxyType({cq.name: cq for cq in snapshot.cluster_queues}),
        plan_problems=tuple(plan_problems),
        workload_problems=MappingProxyType({k: tuple(v) for k, v in per_workload.items()}),
    )


def owner_job(w: Workload, jobs: Mapping[tuple[str, str], JobInfo]) -> JobInfo | None:
    o = w.owner
    if o is None or not o.is_batch_job:
        return None
    j = jobs.get((w.namespace, o.name))
    if j is None or (o.uid and j.uid and o.uid != j.uid):
        return None
    return j


def owner_of(w: Workload, g: Gathered) -> JobInfo | OwnerInfo | None:
    """The object users annotate: the owner Job, or an owner of another integrated kind
    (the same UID as the ownerReference, so a recreated owner is not mistaken)."""
    job = owner_job(w, g.jobs)
    if job is not None or w.owner is None or w.owner.is_batch_job:
        return job
    o = g.owners.get((w.namespace, w.owner.kind, w.owner.name))
    if o is None or (w.owner.uid and o.uid and w.owner.uid != o.uid) or (
            api_group(w.owner.api_version) != api_group(o.api_version)):
        return None  # another kind of the same name (only group and kind are trusted)
    return o


# --------------------------------------------------------------------------------------------
# account


@fast_init
@dataclass(frozen=True, slots=True)
class Member:
    """One unfinished Workload with what accounting decided about it."""

    workload: Workload
    job: JobInfo | OwnerInfo | None  # the owner users annotate (HAMi reads Jobs only)
    team: str
    cluster_queue: str | None
    pool: str


@dataclass(frozen=True, slots=True)
class Accounts:
    pending: tuple[Member, ...]  # active, not quota-reserved
    admitted: tuple[Member, ...]  # quota-reserved
    shares: Mapping[PoolTeam, TeamShare]  # with level and fairness_term set
    history: UsageHistory | None
    card_mib: float | None
    capacity_known: bool
    usage: Mapping[PoolTeam, Mapping[str, float]]  # what the shares are computed from
    current: Mapping[PoolTeam, Mapping[str, float]]  # admitted usage now (no history)
    capacity: Mapping[str, Vector]  # per pool; the whole cluster for an unknown pool
    total_weight: Mapping[str, float]  # W per pool


def _history_key(pool: str, team: str) -> str:
    return f"{pool}|{team}"


def _previous(w: Workload, pool: str, team: str, levels: int) -> tuple[int | None, str]:
    """What the last plan wrote on this Workload, read back from its priority-terms annotation
    (pure: a restarted controller keeps its hysteresis): its fairness level (same pool and team
    only), and - when Kueue preempted it while it was exposed - for whom ("" otherwise)."""
    text = w.annotations.get(PRIORITY_TERMS_ANNOTATION)
    if not text:
        return None, ""
    terms = parse_terms(text)
    taken = ""
    if w.preempted_at is not None:
        if terms.get("state") in _STATE.values():
            taken = terms.get("for", "")
        else:
            taken = terms.get("reclaimed-for", "")
    if terms.get("pool") != pool or terms.get("team") != team:
        return None, taken
    level, sep, of = terms.get("level", "").partition("/")
    if not sep or of != str(levels) or not level.isdigit():
        return None, taken
    return int(level), taken


_WORKLOAD, _QUOTA_RESERVED = attrgetter("workload"), attrgetter("quota_reserved")
_POOL, _TEAM = attrgetter("pool"), attrgetter("team")
_CLUSTER_QUEUE = attrgetter("cluster_queue")


class _NoMember:
    """What a Workload with no Member in the memo is looked up as."""

    __slots__ = ()
    workload = None


_NO_MEMBER = _NoMember()


def _members(
    g: Gathered, settings: PolicySettings, pool_by_cq: Mapping[str, str], memo: PlanMemo | None,
) -> tuple[list[Member], list[Member], set[PoolTeam], dict[int, Member]]:
    """The competing Workloads' Members - (pending, admitted, their (pool, team)s, by the
    Workload's id) - in the Workloads' order. A Member is the memo's while it is for the
    same Workload and the ClusterQueues, LocalQueues, owners and team source are equal."""
    by_label = settings.team_source is TeamSource.LABEL
    # A team depends on the settings' team source besides the Workload and its owner.
    members = memo.members.read((settings.team_source, settings.team_label_key,
                                 settings.team_namespaces)) if memo is not None else None

    # (plain dicts' bound lookups: the hot loop reads each Workload once)
    lq_get, pool_get = dict(g.lq_to_cq).get, pool_by_cq.get

    def member_of(w: Workload) -> Member | None:
        if w.quota_reserved:
            adm = w.admission
            cq = adm.cluster_queue if adm else lq_get((w.namespace, w.queue_name))
        elif w.active:
            cq = lq_get((w.namespace, w.queue_name))
        else:
            return None  # deactivated and pending: not competing, not "present"
        pool = pool_get(cq, UNKNOWN_POOL) if cq else UNKNOWN_POOL
        job = owner_of(w, g) if w.owner is not None else None
        if members:
            member = members.get(id(w))
            if member is not None and member.workload is w and member.job is job \
                    and member.cluster_queue == cq and member.pool == pool:
                return member
        team = team_of(w, settings, job.labels if (by_label and job) else None)
        return Member(w, job, team, cq, pool)

    workloads = g.workloads
    context = (g.lq_to_cq, pool_by_cq, g.jobs, g.owners)
    same = memo is not None and bool(members) and context == memo.account_context
    last = memo.accounted if same and memo is not None else None
    if last is not None and len(last.workloads) == len(workloads):
        # The same positions: only those that hold another Workload are read (compared in C:
        # the others' objects are not read at all), while each keeps its kind and team.
        changed = list(compress(range(len(workloads)), map(is_not, workloads,
                                                             last.workloads)))
        if few_changed(len(changed), len(workloads)):
            now = [member_of(workloads[i]) for i in changed]
            if all(_same_place(last.rows[i], m) for i, m in zip(changed, now, strict=True)):
                for i, m in zip(changed, now, strict=True):
                    old, slot = last.rows[i], last.slots[i]
                    last.rows[i] = m
                    if old is not None:
                        del last.seen[id(old.workload)]
                    if m is not None:
                        if slot >= 0:
                            last.pending[slot] = m
                        else:
                            last.admitted[-slot - 2] = m
                for m in now:
                    if m is not None:
                        last.seen[id(m.workload)] = m
                last.workloads = workloads
                return last.pending, last.admitted, last.present, last.seen
    if same:
        # Whatever decides a Member but its Workload is as before: a Workload with a Member
        # in the memo keeps it (looked up in C); the others are read one by one.
        rows: list[Any] = list(map(members.get, map(id, workloads),  # type: ignore[union-attr]
                                   repeat(_NO_MEMBER)))
        for i in compress(range(len(rows)), map(is_not, map(_WORKLOAD, rows), workloads)):
            rows[i] = member_of(workloads[i])
    else:
        rows = list(map(member_of, workloads))
    listed: list[Member] = list(filter(None, rows))
    reserved = list(map(_QUOTA_RESERVED, map(_WORKLOAD, listed)))
    pending, admitted = list(compress(listed, map(not_, reserved))), list(compress(listed,
                                                                                 reserved))
    present = set(zip(map(_POOL, listed), map(_TEAM, listed), strict=True))
    if memo is None:
        return pending, admitted, present, {}
    memo.account_context = context
    seen = dict(zip(map(id, map(_WORKLOAD, listed)), listed, strict=True))
    # Each position's place: its index in `pending`, -2 - its index in `admitted`, or -1.
    slots: list[int] = []
    counts = [0, 0]
    for m in rows:
        if m is None:
            slots.append(-1)
        elif m.workload.quota_reserved:
            slots.append(-2 - counts[1])
            counts[1] += 1
        else:
            slots.append(counts[0])
            counts[0] += 1
    memo.accounted = _Accounted(workloads, rows, pending, admitted, present, seen, slots)
    return pending, admitted, present, seen


def _same_place(old: Member | None, new: Member | None) -> bool:
    """Whether `new` takes `old`'s place among the Members: both none, or both pending or
    both admitted, in the same pool and team."""
    if old is None or new is None:
        return old is new
    return old.workload.quota_reserved == new.workload.quota_reserved \
        and old.pool == new.pool and old.team == new.team


@dataclass(slots=True)
class _Accounted:
    """One `_members` call, position by position: its Workloads, each one's Member (None: not
    competing) and place (`slots`), and what it returned."""

    workloads: tuple[Workload, ...]
    rows: list[Member | None]
    pending: list[Member]
    admitted: list[Member]
    present: set[PoolTeam]
    seen: dict[int, Member]
    slots: list[int]


def _admitted_shape(w: Workload) -> tuple[object, ...] | None:
    """What `admitted_usage` of a Workload of one pod set of one container, admitted without
    pod set assignments, depends on: its shape (`_shape`) and its admission's usage and
    flavors (None for any other: read each time)."""
    adm = w.admission
    if adm is None or adm.pod_sets:
        return None
    shape = _shape(w)
    if shape is None:
        return None
    return (shape, *adm.usage.items(), None, *adm.flavors.items())


def account(
    g: Gathered, snapshot: ClusterSnapshot, settings: PolicySettings, now: datetime,
    history: UsageHistory | None, memo: PlanMemo | None = None,
) -> Accounts:
    inventory, _ = gpu_inventory(snapshot.nodes, settings, now)
    card_mib = card_memory(inventory, settings)
    capacities, _source = pool_capacities(snapshot.cluster_queues, inventory)
    whole = cluster_capacity(capacities)
    pool_by_cq = {name: pool_of(cq) for name, cq in g.queues.items()}

    known = memo.usage if memo is not None else None
    used: dict[int, tuple[Workload, float | None, Vector]] = {}
    pending, admitted, present, seen = _members(g, settings, pool_by_cq, memo)
    current: dict[PoolTeam, Vector] = {}
    # Admitted usage of Workloads alike (`_admitted_shape`), computed once: read-only.
    alike: dict[tuple[object, ...], Vector] = {}
    for member in admitted:
        w = member.workload
        acc_vec = current.setdefault((member.pool, member.team), {})
        held = known.get(id(w)) if known else None
        if held is None or held[0] is not w or held[1] != card_mib:
            shape = _admitted_shape(w)
            if shape is None:
                held = (w, card_mib, admitted_usage(w, card_mib))
            else:
                vec = alike.get(shape)
                if vec is None:
                    vec = alike[shape] = admitted_usage(w, card_mib)
                held = (w, card_mib, vec)
        if memo is not None:
            used[id(w)] = held
        for dim, q in held[2].items():
            acc_vec[dim] = acc_vec.get(dim, 0.0) + q

    if memo is not None:
        memo.usage = used
        memo.members.keep(seen)
    usage: Mapping[PoolTeam, Mapping[str, float]] = current
    new_history: UsageHistory | None = None
    if settings.usage_half_life > 0:
        keyed = {_history_key(p, t): v for (p, t), v in current.items()}
        new_history = (history or UsageHistory()).advance(keyed, now, settings.usage_half_life)
        combined: dict[PoolTeam, dict[str, float]] = {k: dict(v) for k, v in current.items()}
        for hkey, hvec in new_history.usage.items():
            hpool, _, hteam = hkey.partition("|")
            if not hteam:
                continue  # written before pools existed: dropped (docs/policy.md)
            mine = combined.setdefault((hpool, hteam), {})
            for dim, q in hvec.items():
                mine[dim] = max(mine.get(dim, 0.0), q)
        usage = combined

    shares_raw: dict[PoolTeam, TeamShare] = {}
    pool_caps: dict[str, Vector] = {}
    # A share is kept while the team's usage and the pool's capacity are equal (same settings).
    known_shares = memo.shares.read(settings) if memo is not None else None
    kept_shares: dict[PoolTeam, tuple[Mapping[str, float], Vector, TeamShare]] = {}
    exact_caps: dict[str, Mapping[str, Decimal]] = {}  # per pool, made once
    for pt in sorted(set(usage) | present):
        cap = pool_caps.setdefault(pt[0], capacities.get(pt[0]) or whole)
        mine_now = usage.get(pt, {})
        old = known_shares.get(pt) if known_shares else None
        if old is not None and old[0] == mine_now and old[1] == cap:
            kept_shares[pt] = old
            shares_raw[pt] = old[2]
            continue
        exact = exact_caps.get(pt[0])
        if exact is None:
            exact = exact_caps[pt[0]] = exact_capacity(cap)
        shares_raw[pt] = team_share(pt[1], mine_now, cap, settings, pt[0], exact)
        if memo is not None:
            kept_shares[pt] = (dict(mine_now), dict(cap), shares_raw[pt])
    if memo is not None:
        memo.shares.keep(kept_shares)
    active = active_weights(shares_raw, present, settings)

    # The team's own level (no hysteresis) is what metrics and the team table show; each
    # pending Workload gets its own level from its prospective share (`score_pending`).
    shares: dict[PoolTeam, TeamShare] = {}
    for pt, ts in shares_raw.items():
        total = active.get(pt[0], 0.0)
        level = fairness_level(ts.dominant_share, total, settings)
        shares[pt] = replace(ts, level=level, fairness_term=level_points(level, settings),
                             usage_over_entitlement=ts.dominant_share * total)
    return Accounts(
        pending=tuple(pending),
        admitted=tuple(admitted),
        shares=MappingProxyType(shares),
        history=new_history,
        card_mib=card_mib,
        capacity_known=capacity_known(capacities, settings),
        usage=MappingProxyType(dict(usage)),
        current=MappingProxyType(dict(current)),
        capacity=MappingProxyType(pool_caps),
        total_weight=MappingProxyType(active),
    )


# --------------------------------------------------------------------------------------------
# score


@dataclass(slots=True)
class Scored:
    """One pending Workload, scored; its decision is built once its rank is known. (Not
    frozen: internal to one plan, and a frozen init costs a microsecond per Workload.)"""

    member: Member
    classified: Classified
    problems: tuple[InputProblem, ...]
    hami: HamiDecision | None
    since: datetime
    target: int  # the effective priority to write (or, unchanged, Kueue's now)
    boost: int
    breakdown: PriorityBreakdown | None  # None: left unchanged (bad input)
    terms: str
    suffix: str = ""  # terms words after `priority=` (e.g. reclaimed-for=)
    demand: Vector | None = None  # what it will reserve, in its pool's dimensions
    share: float = 0.0  # prospective weighted dominant share (its team's, once it is admitted)
    previous: int | None = None  # the fairness level the last plan wrote on it
    # `_Demands.scaled` for it, when read while its Workload was read anyway (not an output)
    scaled: tuple[Vector, _Scaled] | None = None
    # its team's prospective share before it: usage plus the team's Workloads queued ahead
    before: float = 0.0


def kueue_priority(w: Workload, c: Classified) -> int:
    """The effective priority Kueue orders and preempts by now: spec.priority + the boost
    annotation."""
    return (w.priority or 0) + (c.current_boost or 0)


def _boost(target: int, base: int) -> tuple[int, str]:
    boost = target - base
    if INT32_MIN <= boost <= INT32_MAX:
        return boost, ""
    return clamp_int32(boost), f"boost {boost} outside int32 (base {base}): clamped"


class _ClassTerms:
    """Per-class values read once per plan (enum attribute access is slow in the hot loop)."""

    def __init__(self, settings: PolicySettings) -> None:
        self.weight = {c: settings.class_weight(c) for c in PriorityClass}
        self.term = {c: settings.pending_class_term(c) for c in PriorityClass}
        self.guard = {c: settings.guard(c) for c in PriorityClass}
        self.points = [level_points(level, settings)
                       for level in range(settings.fairness_levels + 1)]
        self.base_terms: dict[int, int] = {}  # `base_term` by base, filled as met


# A team's own queue order: class first, then wait, then UID (Kueue's order inside a class).
_CLASS_RANK = {PriorityClass.URGENT: 0, PriorityClass.APPROVED: 1, PriorityClass.NORMAL: 2}


def _team_order_key(s: Scored) -> tuple[int, datetime, int, str]:
    """A team's queue: class, then queue time, then - for the same second (Kubernetes'
    timestamps have no finer grain) - the priority Kueue sees now, highest first, so a newcomer
    never passes a Workload of the same second that already carries its value. Kueue may
    already be taking quota for that one as its queue's head; admitted after being passed, it
    would be preempted by the one that passed it. (Before `_score_team`, `target` holds the
    priority Kueue sees now: `kueue_priority`.)"""
    return (_CLASS_RANK[s.classified.priority_class], s.since, -s.target, s.member.workload.uid)


def _shape(w: Workload) -> tuple[object, ...] | None:
    """What reading a one-pod-set, one-container Workload's resources depends on: the count
    and the container's resources (None for any other shape: read each time). Equal Decimals
    are the same number: the same floats and the same checks, whatever their spelling."""
    pod_sets = w.pod_sets
    if len(pod_sets) == 1:
        ps = pod_sets[0]
        if len(ps.containers) == 1:
            return (ps.count, *ps.containers[0].resources.items())
    return None


# What a shape's resources say, the same for every Workload of the shape (`_Demands.facts`):
# (no resource problem, asks for a GPU, some container takes less than whole GPUs).
_Facts = tuple[bool, bool, bool]


class _Demands:
    """Pending demands in each pool's dimensions (one flavor map per pool). Workloads of one
    shape (`_shape`: one pod set of one container, the same count and resources: the Jobs of
    one template) share one vector per pool, and their resource checks, computed once:
    read-only."""

    def __init__(self, acc: Accounts, settings: PolicySettings | None = None) -> None:
        self._acc = acc
        self._settings = settings
        self._weights = settings.resource_weights if settings is not None else {}
        self._single: dict[str, dict[str, str]] = {}
        # per pool, per shape
        self._shapes: dict[str, dict[tuple[object, ...], Vector]] = {}
        self._scaled: dict[str, dict[tuple[object, ...], tuple[Vector, _Scaled]]] = {}
        self._scales: dict[str, dict[str, tuple[float, float]]] = {}
        self._facts: dict[tuple[object, ...], _Facts] = {}

    def single(self, pool: str) -> dict[str, str]:
        found = self._single.get(pool)
        if found is None:
            found = self._single[pool] = demand_dimensions(self._acc.capacity.get(pool, {}))
        return found

    def facts(self, w: Workload, shape: tuple[object, ...]) -> _Facts:
        """For `w` of `shape`: whether `resource_problems` finds nothing, and `gpu_summary`.
        Needs the settings."""
        found = self._facts.get(shape)
        if found is None:
            assert self._settings is not None
            found = self._facts[shape] = (not resource_problems(w, self._settings),
                                          *gpu_summary(w.pod_sets, self._acc.card_mib))
        return found

    def of(self, w: Workload, pool: str) -> Vector:
        shape = _shape(w)
        if shape is not None:
            found = self._shapes.setdefault(pool, {}).get(shape)
            if found is not None:
                return found
        single = self.single(pool)
        demand = pending_demand(w, self._acc.card_mib)
        if single:
            demand = {single.get(d, d): q for d, q in demand.items()}
        if shape is not None:
            self._shapes[pool][shape] = demand
        return demand

    def scaled(self, w: Workload, pool: str,
               shape: tuple[object, ...] | None = None) -> tuple[Vector, _Scaled]:
        """`of`, with per dimension (dimension, quantity, the pool's capacity, the resource's
        weight) - capacity 0.0 where the dimension has no capacity or no weight (the share
        ignores it). Needs the settings. `shape`: `_shape(w)`, when known."""
        if shape is None:
            shape = _shape(w)
        if shape is not None:
            mine = self._scaled.get(pool)
            if mine is None:
                mine = self._scaled[pool] = {}
            found = mine.get(shape)
            if found is not None:
                return found
        demand = self.of(w, pool)
        scales = self._scales.get(pool)
        if scales is None:
            scales = self._scales[pool] = {}
        cap = self._acc.capacity.get(pool, {})
        items: list[tuple[str, float, float, float]] = []
        for dim, q in demand.items():
            scale = scales.get(dim)
            if scale is None:
                cd, rw = cap.get(dim, 0.0), self._weights.get(resource_of(dim), 0.0)
                scale = scales[dim] = (cd, rw) if cd > 0 and rw > 0 else (0.0, 0.0)
            items.append((dim, q, *scale))
        out = (demand, tuple(items))
        if shape is not None:
            self._scaled[pool][shape] = out
        return out


# Per dimension of a demand: (dimension, quantity, capacity, resource weight), capacity 0.0
# where the share does not count the dimension.
_Scaled = tuple[tuple[str, float, float, float], ...]


def score_pending(
    acc: Accounts, g: Gathered, snapshot: ClusterSnapshot, settings: PolicySettings, now: datetime,
    memo: PlanMemo | None = None,
) -> list[Scored]:
    """Score every pending Workload. Fairness is DRF's progressive filling: a Workload's level
    comes from the weighted dominant share its team will have when this Workload's turn comes -
    the team's usage in the pool plus its Workloads queued ahead of this one there
    (`_team_order_key`) - so freed quota goes to the team with the lowest share first, as DRF
    gives the next task, and admitting one of a team's Workloads leaves the others' values as
    they were (usage grows by what the queue ahead shrinks by). `Scored.share` is the share
    once this Workload runs too, `Scored.before` the share before it (what reclaim compares)."""
    mode = requeue_mode(snapshot.requeue_timestamp, settings)
    hami_cache: dict[tuple[object, ...], HamiDecision | None] = {}
    pending = acc.pending
    # Each pending Workload's Scored: the blocked ones at once, the others with their team's
    # scores.
    out: list[Scored | None] = [None] * len(pending)
    seen = memo.workloads.read((settings, acc.card_mib, mode, snapshot.quota_check)) \
        if memo is not None else None
    demands = _Demands(acc, settings)
    # A demand read with the rest of its Workload (its objects are at hand), for its team's
    # scoring.
    early: dict[int, tuple[Vector, _Scaled]] = {}
    # `classify` of a Workload with no annotation it reads, by (base, stand-in fields).
    defaults: dict[tuple[object, ...], Classified] = {}
    quota_check = snapshot.quota_check

    def read(i: int, m: Member) -> _WorkloadMemo:
        """The Workload's fields before its team is scored, the memo's while they hold."""
        w, job = m.workload, m.job
        parse_problems = g.workload_problems.get((w.namespace, w.name), ()) \
            if g.workload_problems else ()
        held_by = g.queues.get(m.cluster_queue or "")
        found = seen.get(id(w)) if seen else None
        if found is not None and found[0].workload is w and found[0].job is job \
                and found[1] == (parse_problems, m.cluster_queue, held_by):
            return found if found[0] is m else (m, *found[1:])
        shape = _shape(w)
        job_info = job if isinstance(job, JobInfo) else None  # HAMi reads batch/v1 Jobs only
        if shape is not None and not parse_problems and not mentions_hami(w, job_info):
            # HAMi reads nothing of it but its class, queues and shape: its shape's resource
            # checks and GPU summary, and HAMi's rules alone (`decide_hami`'s cache), are
            # shared with every Workload alike; so are `classify`'s defaults.
            clean, wants_gpu, fractional = demands.facts(w, shape)
            if clean:
                if reads_no_annotation(w, job):
                    ckey = (w.priority or 0, w.workload_priority_class, w.priority_class_name)
                    c = defaults.get(ckey)
                    if c is None:
                        c = defaults[ckey] = classify(w, job)
                else:
                    c = classify(w, job)
                hami: HamiDecision | None = None
                if wants_gpu:
                    hami = check_fraction(
                        decide_by_rules(w, job_info, c.priority_class, m.cluster_queue,
                                        settings, fractional, hami_cache),
                        held_by, quota_check)
                if not c.blocking:
                    early[i] = demands.scaled(w, m.pool, shape)
                return (m, (parse_problems, m.cluster_queue, held_by),
                        (c, c.problems, hami, queued_since(w, mode), kueue_priority(w, c),
                         c.current_boost or 0, None, ""), not c.blocking)
        c = classify(w, job)
        problems: list[InputProblem] = [*parse_problems, *c.problems]
        blocking = c.blocking or bool(parse_problems)
        for prob, is_blocking in resource_problems(w, settings):
            problems.append(prob)
            blocking = blocking or is_blocking
        hami, p = decide_hami(w, job_info, c.priority_class, m.cluster_queue, settings,
                              acc.card_mib, hami_cache)
        hami = check_fraction(hami, held_by, quota_check)
        # A bad scheduling hint is reported and ignored (no HAMi write); it never freezes
        # the priority: the class still follows the annotations (a withdrawn approval
        # lowers it).
        problems += p
        if not blocking:
            early[i] = demands.scaled(w, m.pool, shape)
        return (m, (parse_problems, m.cluster_queue, held_by),
                (c, tuple(problems), hami, queued_since(w, mode), kueue_priority(w, c),
                 c.current_boost or 0, None, ""), not blocking)

    fast = bool(seen) and not g.workload_problems and memo is not None \
        and memo.queues == g.queues
    last = memo.pending if fast and memo is not None else None
    changed: list[int] | None = None
    if last is not None and len(last.pending) == len(pending):
        # The same positions: only those that hold another Member are read (compared in C:
        # the others' objects are not read at all).
        changed = list(compress(range(len(pending)), map(is_not, pending, last.pending)))
        if not few_changed(len(changed), len(pending)):
            changed = None
    if changed is not None and last is not None and seen is not None:
        found_all = last.found.copy()
        fields_of = last.fields.copy()
        regroup = False
        for i in changed:
            old = found_all[i]
            found_all[i] = found = read(i, pending[i])
            fields_of[i] = found[2]
            seen.pop(id(old[0].workload), None)
            regroup = regroup or old[3] != found[3] or (
                found[3] and (old[0].pool, old[0].team) != (found[0].pool, found[0].team))
        for i in changed:
            seen[id(pending[i].workload)] = found_all[i]
        kept_entries = seen
    else:
        if fast and seen is not None:
            # Whatever decides a Workload's entry but its Member is as before (no parse
            # problems, the same ClusterQueues): an entry made for the same Member holds
            # (looked up and checked in C); the others are read one by one.
            rows: list[Any] = list(map(seen.get, map(id, map(_WORKLOAD, pending)),
                                       repeat(_NO_ENTRY)))
            for i in compress(range(len(rows)), map(is_not, map(_FIRST, rows), pending)):
                rows[i] = read(i, pending[i])
            found_all = rows
        else:
            found_all = list(map(read, range(len(pending)), pending))
        fields_of = list(map(_THIRD, found_all))  # Scored's fields after `member`
        kept_entries = dict(zip(map(id, map(_WORKLOAD, pending)), found_all, strict=True)) \
            if memo is not None else {}
        regroup = True
    teams: dict[PoolTeam, list[int]]  # positions in `pending`, in order
    if regroup or last is None:
        teams = {}
        for i, found in enumerate(found_all):
            m = found[0]
            if found[3]:
                mine = teams.get((m.pool, m.team))
                if mine is None:
                    teams[(m.pool, m.team)] = [i]
                else:
                    mine.append(i)
            else:
                out[i] = Scored(m, *found[2])
    else:  # the same teams at the same positions; the last call's Scored kept
        teams = last.teams
        out = last.scored.copy()
        assert changed is not None
        for i in changed:
            if not found_all[i][3]:
                out[i] = Scored(found_all[i][0], *found_all[i][2])
    last_teams = last.teams if last is not None else None
    if memo is not None:
        memo.workloads.keep(kept_entries)
        # (entries made with parse problems hold only while those are the same: read again)
        memo.queues = None if g.workload_problems else g.queues
    classes = _ClassTerms(settings)
    ref = reference(now, settings.rebase_period)
    scored_teams = memo.teams.read((settings, acc.card_mib, ref)) if memo is not None else None
    kept_teams: dict[PoolTeam, _TeamMemo] = {}
    for pt, at in teams.items():
        pool, team = pt
        members = tuple(map(pending.__getitem__, at))
        given = tuple(map(fields_of.__getitem__, at))
        inputs = (acc.usage.get(pt), acc.capacity.get(pool), acc.total_weight.get(pool),
                  acc.shares[pt].dominant_resource, acc.shares[pt].dominant_share)
        hit = scored_teams.get(pt) if scored_teams else None
        # (tuples compare element by element, identity first: in C, and equal objects give
        # the same scores; the memo's Scored are never changed once scored)
        if hit is not None and hit[2] == inputs and hit[0] == members and hit[1] == given:
            if teams is not last_teams:  # (else `out` holds them at these positions)
                for i, s in zip(at, hit[3], strict=True):
                    out[i] = s
            kept_teams[pt] = hit
            continue
        queue = [Scored(m, *f) for m, f in zip(members, given, strict=True)]
        for i, s in zip(at, queue, strict=True):
            out[i] = s
            if early:
                s.scaled = early.get(i)
        _score_team(pool, team, sorted(queue, key=_team_order_key), acc, demands, classes,
                    settings, now)
        if memo is not None:
            kept_teams[pt] = (members, given, inputs, tuple(queue))
    if memo is not None:
        memo.teams.keep(kept_teams)
        memo.pending = _Pending(pending, found_all, fields_of, teams, out.copy())
    return out  # type: ignore[return-value]  # (every position is set)


# Up to this many changed positions, or one in this many, a memo is updated position by
# position; past it, everything is read again.
_FEW_CHANGED = 8


def few_changed(changed: int, total: int) -> bool:
    """Whether `changed` of `total` positions are few enough to update a memo in place."""
    return changed <= max(_FEW_CHANGED, total // _FEW_CHANGED)


@dataclass(frozen=True, slots=True)
class _Pending:
    """One `score_pending` call, position by position: its Members, their entries and Scored
    fields before scoring, the scored ones' positions by team, and the Scored it returned
    (before any later stage replaced one)."""

    pending: tuple[Member, ...]
    found: list[_WorkloadMemo]
    fields: list[tuple[Any, ...]]
    teams: dict[PoolTeam, list[int]]
    scored: list[Scored | None]


# One Workload's scoring before its team is scored: (its Member, (parse problems, ClusterQueue
# name, ClusterQueue), Scored's fields after `member`, whether it is scored).
_WorkloadMemo = tuple[Member, tuple[object, ...], tuple[Any, ...], bool]
_NO_ENTRY = (None,)  # what a Workload with no entry in the memo is looked up as
_FIRST, _THIRD = itemgetter(0), itemgetter(2)
# One team's scoring in one pool: its queue's Members and their Scored fields before scoring
# (in `acc.pending` order); the team's usage, the pool's capacity and W, the team's dominant
# resource and share; its queue's Scored, scored (in the same order; never changed after).
_TeamMemo = tuple[tuple[Member, ...], tuple[tuple[Any, ...], ...], tuple[object, ...],
                  tuple["Scored", ...]]


_K = TypeVar("_K")
_V = TypeVar("_V")


class _ContextMemo(Generic[_K, _V]):
    """Entries valid under one context (settings and the like): reading under another
    context starts empty; a call keeps only the entries it used."""

    __slots__ = ("_context", "entries")

    def __init__(self) -> None:
        self._context: object = None
        self.entries: dict[_K, _V] = {}

    def read(self, context: object) -> dict[_K, _V]:
        if context != self._context:
            self._context, self.entries = context, {}
        return self.entries

    def keep(self, kept: dict[_K, _V]) -> None:
        self.entries = kept


class PlanMemo:
    """What `compute_plan` worked out in its last call, for the next call of one control loop:
    a pending Workload's class, problems, HAMi decision and queue time while it is the same
    object with the same owner object, parse problems and ClusterQueue; a team's scores while
    its queue holds the same Workloads (as above) and its usage, the pool's capacity and
    weights are equal. Each part is kept only under the same settings, card memory, requeue
    mode and Kueue quota check (and, for scores, aging reference). The plan is exactly the
    one `compute_plan` gives without it (tests/unit/test_incremental.py compares them). Each
    call keeps only what it read, so the memo holds one snapshot's worth. Not thread-safe."""

    def __init__(self) -> None:
        self.workloads: _ContextMemo[int, _WorkloadMemo] = _ContextMemo()
        self.teams: _ContextMemo[PoolTeam, _TeamMemo] = _ContextMemo()
        # The ClusterQueues the entries of `workloads` were read with (None: some were read
        # with parse problems).
        self.queues: Mapping[str, ClusterQueue] | None = None
        # The last `score_pending`, position by position (valid while `workloads` holds
        # its entries: the same context).
        self.pending: _Pending | None = None
        # The last plan's pending Scored in Kueue's order, and their decisions (`order`): valid
        # whatever the context (a Scored never changes once made, nor does its key).
        self.order: _Ordered | None = None
        self.usage: dict[int, tuple[Workload, float | None, Vector]] = {}  # admitted usage
        self.members: _ContextMemo[int, Member] = _ContextMemo()
        # An admitted Workload's Classified, by id: (Workload, owner, key, Classified).
        self.admitted: dict[int, tuple[Workload, JobInfo | OwnerInfo | None, str,
                                       Classified]] = {}
        self.shares: _ContextMemo[PoolTeam, tuple[Mapping[str, float], Vector, TeamShare]] = (
            _ContextMemo())
        # What the Members were read with besides their Workloads and the team source.
        self.account_context: object = None
        # The last `_members` call, position by position (valid under the same context).
        self.accounted: _Accounted | None = None
        self.stand_ins: StandIns = {}  # `classify.stand_in` by Workload id
        # Guards by (class, team, pool, base, override), and each admitted Workload's guard
        # decision by its id: (Workload, Classified, guard, ClusterQueue, decision).
        self.guards: _ContextMemo[tuple[object, ...], _GuardMemo] = _ContextMemo()
        self.guard_decisions: dict[int, tuple[Workload, Classified, _GuardMemo, str | None,
                                              WorkloadDecision]] = {}


def _score_team(
    pool: str, team: str, queue: list[Scored], acc: Accounts, demands: _Demands,
    classes: _ClassTerms, settings: PolicySettings, now: datetime,
) -> None:
    """Progressive filling over one team's queue in one pool (already in team order)."""
    ref = reference(now, settings.rebase_period)
    ref_ts, ref_iso = ref.timestamp(), iso(ref)
    levels = settings.fairness_levels
    cap = acc.capacity.get(pool, {})
    total = acc.total_weight.get(pool, 0.0)
    tw = team_weight(team, settings)
    ts = acc.shares[(pool, team)]
    vec = prospective_base(acc.usage.get((pool, team), {}), cap, demands.single(pool))
    share = weighted_share(vec, cap, settings, tw)
    dominant = ts.dominant_resource
    team_scope = settings.approved_scope is ApprovedScope.TEAM
    # (read with team-scoped approval only)
    head_since = min((s.since for s in queue
                      if s.classified.priority_class is PriorityClass.NORMAL),
                     default=None) if team_scope else None
    ceiling = levels  # levels never rise along the team's order
    points, base_terms = classes.points, classes.base_terms
    for s in queue:
        c = s.classified
        w = s.member.workload
        before, ranked_by = share, dominant
        found = s.scaled
        demand, scaled = found if found is not None else demands.scaled(w, pool)
        for dim, q, cd, rw in scaled:
            v = vec[dim] = vec.get(dim, 0.0) + q
            if cd and v / cd * rw / tw > share:  # (cd is 0.0 where the share ignores dim)
                share, dominant = v / cd * rw / tw, dim
        s.demand, s.share, s.before = demand, share, before
        if w.annotations.get(PRIORITY_TERMS_ANNOTATION):
            previous, taken = _previous(w, pool, team, levels)
        else:
            previous, taken = None, ""
        # Levels are never below 0: once the ceiling is 0, so is every level after it.
        level = min(ceiling, fairness_level(before, total, settings, previous)) if ceiling \
            else 0
        ceiling = level
        fairness = points[level]
        cls = c.priority_class
        since = credited = s.since
        shared: datetime | None = None
        if team_scope and cls is PriorityClass.APPROVED and head_since is not None \
                and head_since < since:
            credited = shared = head_since
        aging = aging_term(credited.timestamp(), ref_ts, settings)
        ranked = c.ranked
        bterm = base_terms.get(ranked)
        if bterm is None:
            bterm = base_terms[ranked] = base_term(ranked, settings)
        base = c.base
        if c.override is not None:
            target = c.override
        else:
            target = classes.term[cls] + bterm + fairness + aging
        boost = target - base
        if INT32_MIN <= boost <= INT32_MAX:
            clamped = ""
        else:
            boost, clamped = _boost(target, base)
            s.problems = (*s.problems,
                          InputProblem(w.ref, "spec.priority", str(base), clamped))
        s.breakdown = PriorityBreakdown(
            cls, classes.weight[cls], classes.term[cls], team, pool,
            ranked_by, before, level, fairness,
            since, ref, aging, base, bterm,
            c.override, target, False, clamped, ts.dominant_share, shared,
        )
        s.target, s.boost, s.previous = target, boost, previous
        s.terms = pending_terms(cls, team, pool, level, levels, fairness, iso(credited),
                                ref_iso, base, c.override, target)
        if taken:
            s.suffix = f" reclaimed-for={taken}"
            s.terms += s.suffix


OrderKey = tuple[int, float, str]  # Kueue's order, ascending: -priority, queued since, UID


def keep_order(scored: list[Scored], settings: PolicySettings) -> None:
    """Pending Workloads whose only change is their fairness level keep the level they carry
    where that leaves Kueue's order (priority, then queue time, then UID) of their pool's
    pending Workloads exactly the one the new values give. Kueue acts on the order, not the
    value, so a level that moves without changing the order costs no write - the head of a
    queue rising further, a Workload alone in its band, a team's Workloads that move together
    past no one. Of the Workloads that could keep their value, the most that can together
    (`_most_kept`) do.

    With KUEUE_FAIR_SHARING the order kept exact is each ClusterQueue's own (Workloads with
    no ClusterQueue: their pool's): across the ClusterQueues of a cohort Kueue then orders
    the heads by dominant resource share, and priority decides only between heads of exactly
    equal share - a rare tie whose order a kept value may change, accepted for the writes it
    saves (a team's level change in its own ClusterQueue costs none)."""
    levels = settings.fairness_levels
    candidates: dict[int, tuple[int, str]] = {}
    for s in scored:
        b, p = s.breakdown, s.previous
        if b is None or p is None or p == b.fairness_level or b.override is not None:
            continue
        w = s.member.workload
        current = kueue_priority(w, s.classified)
        points = level_points(p, settings)
        if b.priority - b.fairness_term + points != current:
            continue
        terms = pending_terms(b.priority_class, b.team, b.pool, p, levels, points,
                              iso(b.credited_since or b.queued_since), iso(b.reference),
                              b.base, None, current) + s.suffix
        if terms != w.annotations.get(PRIORITY_TERMS_ANNOTATION):
            continue  # something else changed too: it is written anyway
        candidates[id(s)] = (current, terms)
    if not candidates:
        return
    by_queue = settings.kueue_fair_sharing
    groups: dict[tuple[str, str], list[Scored]] = {}
    for s in scored:
        cq = s.member.cluster_queue
        key = ("cq", cq) if by_queue and cq is not None else ("pool", s.member.pool)
        groups.setdefault(key, []).append(s)
    where: dict[int, int] = {}  # a kept Scored's position in `scored`
    for members in groups.values():
        if not any(id(s) in candidates for s in members):
            continue
        keyed = sorted((((-s.target, s.since.timestamp(), s.member.workload.uid), s)
                        for s in members), key=itemgetter(0))
        fresh = [k for k, _s in keyed]
        now: dict[int, OrderKey] = {}
        for i, (k, s) in enumerate(keyed):
            found = candidates.get(id(s))
            if found is not None:
                now[i] = (-found[0], k[1], k[2])
        for i in _most_kept(fresh, now):
            s = keyed[i][1]
            current, terms = candidates[id(s)]
            b = s.breakdown
            assert b is not None and s.previous is not None
            boost, clamped = _boost(current, b.base)
            if not where:
                where = {id(x): j for j, x in enumerate(scored)}
            # (a copy: the memo's Scored stay as scored)
            scored[where[id(s)]] = replace(
                s, target=current, boost=boost, terms=terms,
                breakdown=replace(b, priority=current, fairness_level=s.previous,
                                  fairness_term=level_points(s.previous, settings),
                                  clamped=clamped))


_PREEMPTED_FOR = attrgetter("preempted_for")


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else max(a, b)


def _revalued(s: Scored, b: PriorityBreakdown, target: int, levels: int, word: str) -> Scored:
    """`s` written at `target` instead, its terms ending with `word` (a copy: the memo's
    Scored stay as scored)."""
    boost, clamped = _boost(target, b.base)
    return replace(
        s, target=target, boost=boost,
        breakdown=replace(b, priority=target, clamped=b.clamped or clamped),
        terms=pending_terms(
            b.priority_class, b.team, b.pool, b.fairness_level, levels, b.fairness_term,
            iso(b.credited_since or b.queued_since), iso(b.reference), b.base,
            b.override, target) + s.suffix + word)


_SCORED_PREEMPTED_FOR = attrgetter("member.workload.preempted_for")


def name_reclaimers(scored: list[Scored], acc: Accounts) -> None:
    """A victim Kueue preempted while it was exposed says `reclaimed-for=<team>` of the
    Workload Kueue names as its preemptor (`Workload.preempted_for`) where that Workload is in
    the snapshot, else the teams its exposure was written for (`_previous`): an exposure is
    not rewritten only because the teams that may take it changed, so its list can be older
    than the preemption. Only the first plan after the preemption reads it; the pending terms
    written then carry the name on."""
    found = [i for i in compress(range(len(scored)), map(_SCORED_PREEMPTED_FOR, scored))
             if scored[i].suffix.startswith(" reclaimed-for=")]
    if not found:
        return
    wanted = {scored[i].member.workload.preempted_for for i in found}
    team_of = {m.workload.uid: m.team for m in (*acc.admitted, *acc.pending)
               if m.workload.uid in wanted}
    for i in found:
        s = scored[i]
        w = s.member.workload
        team = team_of.get(w.preempted_for)
        if team is None or parse_terms(w.annotations.get(PRIORITY_TERMS_ANNOTATION)).get(
                "state") not in _STATE.values():
            continue  # (its pending terms already say whom it was reclaimed for)
        suffix = f" reclaimed-for={team}"
        if suffix != s.suffix:  # (a copy: the memo's Scored stay as scored)
            scored[i] = replace(s, suffix=suffix,
                                terms=s.terms[:len(s.terms) - len(s.suffix)] + suffix)


def hold_behind_preemptors(scored: list[Scored], acc: Accounts, g: Gathered,
                           settings: PolicySettings) -> None:
    """A pending Workload that Kueue evicted another for (`Workload.preempted_for`) is its
    ClusterQueue's sticky head until admitted (with BestEffortFIFO): Kueue admits it as soon
    as its victims' quota frees, with the value it carries then, whatever the order of the
    others. In a ClusterQueue that preempts within itself by priority, no other pending
    Workload of its team whose class may not preempt it once admitted (its own class, and
    approved work behind a normal head unless APPROVED_PREEMPTS_NORMAL: `_protected_from`) is
    written above that value (the one it carries, or its target if lower: it may be admitted
    with either): raised past it, that Workload would preempt it the moment it is admitted,
    before its guard can land, and take its place - a swap inside one team that serves no
    one. Kueue picks its preemptor by the values it sees and among the Workloads it has not
    parked, so a normal Workload can become the head while an approved one of its team, parked
    or still at Kueue's default value, waits. The held Workload's terms say
    `behind=<the preemptor's name>`; it rises
    once the preemptor carries its own value or is admitted (and guarded). A victim's name
    goes stale once the named Workload is admitted: evicted again since (its own eviction at
    or after the victim's), it is an ordinary pending Workload. Across teams the values
    stand: there the order between them is the fairness the plan writes."""
    if not any(map(_PREEMPTED_FOR, g.workloads)):
        return
    # When each named one's victim was evicted for it, in the victim's pool only (Kueue
    # preempts within a cohort, and a pool is planned alone).
    named: dict[tuple[str, str], datetime | None] = {}
    for m in (*acc.admitted, *acc.pending):
        w = m.workload
        if w.evicted and w.preempted_for:
            key, when = (m.pool, w.preempted_for), w.last_eviction
            named[key] = when if key not in named else _latest(named[key], when)
    heads: dict[tuple[str, str], list[Scored]] = {}
    for s in scored:
        m = s.member
        w = m.workload
        if (m.pool, w.uid) not in named:
            continue
        when = named[(m.pool, w.uid)]
        if w.last_eviction is not None and (when is None or w.last_eviction >= when):
            continue  # admitted and evicted again since: no longer the one Kueue preempted for
        cq = g.queues.get(m.cluster_queue) if m.cluster_queue is not None else None
        if cq is not None \
                and cq.queueing_strategy == "BestEffortFIFO" \
                and cq.preemption.within_cluster_queue != "Never":
            heads.setdefault((cq.name, m.team), []).append(s)
    if not heads:
        return
    protected = _protected_from(settings)
    levels = settings.fairness_levels
    for i, s in enumerate(scored):
        b, m = s.breakdown, s.member
        if b is None or s.classified.override is not None or m.cluster_queue is None:
            continue
        cls = s.classified.priority_class
        ahead = [(min(kueue_priority(h.member.workload, h.classified), h.target),
                  h.member.workload.name) for h in heads.get((m.cluster_queue, m.team), ())
                 if h is not s and cls in protected[h.classified.priority_class]]
        if not ahead:
            continue
        cap, name = min(ahead)
        if s.target <= cap:
            continue
        scored[i] = _revalued(s, b, cap, levels, f" behind={name}")


def _most_kept(fresh: list[OrderKey], now: Mapping[int, OrderKey]) -> set[int]:
    """The largest set K of positions in `fresh` (the new order, ascending) such that giving
    each position in K its key in `now` and every other position its `fresh` key leaves the
    keys ascending in the same order. Linear dynamic programming over `fresh`: between two
    consecutive kept positions p < i, the positions in between keep their fresh keys, which
    ascend, so the pair needs only now[p] < now[i] when adjacent, else now[p] < fresh[p + 1]
    and fresh[i - 1] < now[i]."""
    n = len(fresh)
    best = [0] * n  # most kept up to and including i, i kept (0: i cannot be kept)
    back = [-1] * n  # the kept position before i (-1: none)

    def closes(p: int) -> bool:  # p may be the last kept position before a fresh one
        return p == n - 1 or now[p] < fresh[p + 1]

    far, far_at = 0, -1  # the best over kept positions p <= i - 2 that close
    for i in range(n):
        p = i - 2
        if p >= 0 and best[p] > far and closes(p):
            far, far_at = best[p], p
        key = now.get(i)
        if key is None:
            continue
        if i == 0 or fresh[i - 1] < key:
            best[i], back[i] = far + 1, far_at
        q = i - 1
        if q >= 0 and best[q] and now[q] < key and best[q] + 1 > best[i]:
            best[i], back[i] = best[q] + 1, q
    end, most = -1, 0
    for p in range(n):
        if best[p] > most and closes(p):
            end, most = p, best[p]
    kept: set[int] = set()
    while end >= 0:
        kept.add(end)
        end = back[end]
    return kept


def _admitted_classes(acc: Accounts, pools: frozenset[str],
                      memo: PlanMemo | None) -> dict[str, Classified]:
    """By key, what the annotations say of each admitted Workload of a pool where preemption
    can reach it (from the memo while the Workload and its owner are the same objects)."""
    known = memo.admitted if memo is not None else {}
    kept: dict[int, tuple[Workload, JobInfo | OwnerInfo | None, str, Classified]] = {}
    out: dict[str, Classified] = {}
    for m in acc.admitted:
        if m.pool not in pools:
            continue
        w, job = m.workload, m.job
        hit = known.get(id(w))
        if hit is None or hit[0] is not w or hit[1] is not job:
            hit = (w, job, w.key, classify(w, job))
        kept[id(w)] = hit
        out[hit[2]] = hit[3]
    if memo is not None:
        memo.admitted = kept
    return out


def preempting_pools(queues: Iterable[ClusterQueue]) -> frozenset[str]:
    """Pools where a pending Workload can evict an admitted one: some ClusterQueue of the
    pool preempts within itself or across the cohort (reclaim or borrow)."""
    return frozenset(pool_of(cq) for cq in queues if cq.preemption.can_evict)


def _unchanged(m: Member, c: Classified, problems: tuple[InputProblem, ...],
               admitted: bool, rank: int) -> WorkloadDecision:
    """Bad input: leave exactly what is there."""
    w = m.workload
    return WorkloadDecision(
        key=w.key, uid=w.uid, cluster_queue=m.cluster_queue, team=m.team, rank=rank,
        base_priority=c.base, current_priority=w.priority, current_boost=c.current_boost,
        target_boost=c.current_boost or 0,
        target_priority=w.priority if w.priority is not None else c.base,
        breakdown=None, problems=problems, leave_unchanged=True, admitted=admitted,
    )


Threats = Mapping[tuple[str, str, PriorityClass], int]


def _reach(queue: ClusterQueue | None) -> tuple[bool, bool]:
    """(within, across): whether a pending Workload of this ClusterQueue can preempt by
    priority an admitted one of its own ClusterQueue, and one of another ClusterQueue of its
    cohort. Reclaim with `Any` takes from a borrowing ClusterQueue whatever the priority, so
    no guard protects from it: only `LowerPriority` reclaim and borrowing reach by priority.
    An unknown ClusterQueue reaches everything (the safe side)."""
    if queue is None:
        return True, True
    pre = queue.preemption
    return (pre.within_cluster_queue != "Never",
            pre.reclaim_within_cohort == "LowerPriority" or pre.borrow_within_cohort != "Never")


def threat_value(s: Scored) -> int:
    """The highest priority a pending Workload can preempt with while this plan is written:
    the value Kueue sees now or this plan's target, whichever is higher (both exist until the
    write lands) - except a value now that was written while the Workload was admitted (its
    guard or exposure; evicted since): that one counts at its target only. The live
    controller lowers it before it writes any guard or exposure of its pool, and writes none
    of the pool's exposures when the lowering fails (`controller.live.writer`)."""
    current = kueue_priority(s.member.workload, s.classified)
    if current <= s.target or written_while_admitted(
            s.member.workload.annotations.get(PRIORITY_TERMS_ANNOTATION)):
        return s.target
    return current


def pending_threats(scored: Iterable[Scored], queues: Mapping[str, ClusterQueue]) -> Threats:
    """The highest priority a pending Workload of each class can preempt with
    (`threat_value`), per ClusterQueue ("cq", name) for what can preempt within it, and per
    pool ("pool", pool) for what can preempt across the cohort by priority (`_reach`)."""
    out: dict[tuple[str, str, PriorityClass], int] = {}
    reach: dict[str | None, tuple[bool, bool]] = {}
    floor = INT32_MIN - 1
    for s in scored:
        c, m = s.classified, s.member
        cq = m.cluster_queue
        found = reach.get(cq)
        if found is None:
            found = reach[cq] = _reach(queues.get(cq) if cq else None)
        within, across = found
        value = threat_value(s)
        if within and cq is not None:
            key = ("cq", cq, c.priority_class)
            if value > out.get(key, floor):
                out[key] = value
        if across or cq is None:
            key = ("pool", m.pool, c.priority_class)
            if value > out.get(key, floor):
                out[key] = value
    return MappingProxyType(out)


def _protected_from(settings: PolicySettings) -> Mapping[PriorityClass, tuple[PriorityClass, ...]]:
    """For each class of admitted work, the pending classes that must not preempt it:
    `PolicySettings.protected_class` and every class below it."""
    out: dict[PriorityClass, tuple[PriorityClass, ...]] = {}
    for cls in PriorityClass:
        limit = settings.pending_class_term(settings.protected_class(cls))
        out[cls] = tuple(p for p in PriorityClass if settings.pending_class_term(p) <= limit)
    return out


# --------------------------------------------------------------------------------------------
# preempt: which admitted Workloads Kueue's preemption may take, and for whom


@dataclass(frozen=True, slots=True)
class Victim:
    """An admitted Workload the plan exposes: `allowed` says which pending Workloads (scored,
    of its pool) may preempt it; every other pending Workload it protects must stay below."""

    exposure: Exposure
    allowed: Callable[[Scored], bool]
    team: str  # the victim's team
    cluster_queue: str
    # Its ClusterQueue preempts only strictly lower priorities (LowerPriority): a pending
    # Workload at exactly its value cannot take it.
    strict: bool = False


# Sizes and usage over entitlement add up shares of a pool's capacity (floats): one GPU in 30,
# six times, is short of six in 30 (one victim too many), and 1.4 less two tenths is short of
# a 1.2 margin (one victim too few).
_EPS = 1e-9


def _size(vec: Mapping[str, float], cap: Mapping[str, float]) -> float:
    """The largest fraction of the pool's capacity a vector takes in any dimension."""
    return max((q / cap[d] for d, q in vec.items() if cap.get(d, 0.0) > 0), default=0.0)


def _sum(vectors: Iterable[Mapping[str, float]]) -> Vector:
    out: Vector = {}
    for vec in vectors:
        for d, q in vec.items():
            out[d] = out.get(d, 0.0) + q
    return out


def _fits(demand: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(q <= free.get(d, 0.0) + 1e-9 for d, q in demand.items() if q > 0)


def _short(demand: Mapping[str, float], free: Mapping[str, float]) -> Vector:
    """What of `demand` free capacity does not cover: what victims must give."""
    return {d: q - max(free.get(d, 0.0), 0.0) for d, q in demand.items()
            if q > max(free.get(d, 0.0), 0.0)}


def _free(acc: Accounts, pool: str, single: Mapping[str, str]) -> Vector:
    """The pool's capacity no admitted Workload holds now, in the dimensions pending demands
    are counted in."""
    cap = acc.capacity.get(pool, {})
    used = prospective_base(_sum(v for (p, _t), v in acc.current.items() if p == pool), cap,
                            single)
    return {d: c - used.get(d, 0.0) for d, c in cap.items()}


class _Exposer:
    """Chooses the plan's victims, per ClusterQueue that preempts within itself (Kueue's
    `withinClusterQueue`: only pending Workloads of the same ClusterQueue can take them).

    * Team-scoped approval: a team's pending approved Workloads may preempt that team's own
      admitted normal Workloads, and no other team's.
    * Reclaim (RECLAIM_ENABLED): a team above (1 + RECLAIM_MARGIN) x its entitlement yields
      Workloads that ran at least MIN_RUNTIME to pending Workloads of the same class whose
      team is below its entitlement with the work it has queued ahead of them (progressive
      filling: a team's next Workload does not count as under-served once the ones before it
      would lift the team to its entitlement), and only to those that would not end above it.

    Victims go most recently started first (the least work lost), only as many as the
    allowed pending Workloads need, and none while those fit in free capacity; reclaim also
    stops at the pool's budget and before the victim's team falls to its margin. Teams yield
    in order of how far they are above their entitlement, and what one team's victims cover
    is not asked of the next: Kueue takes only as many as the taker needs, so more would be
    exposed only to be guarded again a cycle later."""

    def __init__(self, acc: Accounts, settings: PolicySettings, now: datetime,
                 admitted_classes: Mapping[str, Classified]) -> None:
        self.acc, self.settings, self.now = acc, settings, now
        self.demands = _Demands(acc)
        self.classes = admitted_classes
        self.out: dict[str, Victim] = {}
        self.budget: dict[str, int] = {}

    def us(self, pool: str, team: str) -> float:
        ts = self.acc.shares.get((pool, team))
        return ts.usage_over_entitlement if ts else 0.0

    def delta(self, vec: Mapping[str, float], pool: str, team: str) -> float:
        """How much `vec` moves `team`'s usage over entitlement in the pool (an upper bound
        on what losing it takes off)."""
        cap = self.acc.capacity.get(pool, {})
        return (weighted_share(vec, cap, self.settings, team_weight(team, self.settings))
                * self.acc.total_weight.get(pool, 0.0))

    def budget_left(self, pool: str) -> int:
        left = self.budget.get(pool)
        if left is None:
            hour_ago = self.now.timestamp() - 3600.0
            recent = sum(1 for m in (*self.acc.pending, *self.acc.admitted)
                         if m.pool == pool and (at := m.workload.last_preemption) is not None
                         and at.timestamp() > hour_ago)
            left = self.budget[pool] = max(0, self.settings.reclaim_budget_per_hour - recent)
        return left

    def candidates(self, holders: Iterable[Member], cls: PriorityClass) -> list[Member]:
        def key(m: Member) -> tuple[float, str]:
            started = m.workload.reserved_since
            return (-(started.timestamp() if started else 0.0), m.workload.uid)

        out = [m for m in holders if m.workload.key not in self.out and not m.workload.evicting
               and (c := self.classes.get(m.workload.key)) is not None
               and not c.blocking and c.override is None and c.priority_class is cls]
        return sorted(out, key=key)

    def expose(self, cq: str, holders: list[Member], waiting: list[Scored],
               strict: bool) -> None:
        self.strict = strict
        pool = holders[0].pool
        single = self.demands.single(pool)
        free = _free(self.acc, pool, single)
        # What Kueue is evicting is already on its way to a waiting Workload: counted free,
        # else the plan would expose a second victim for the same taker meanwhile.
        leaving = prospective_base(_sum(admitted_usage(m.workload, self.acc.card_mib)
                                        for m in holders if m.workload.evicting),
                                   self.acc.capacity.get(pool, {}), single)
        free = {d: q + leaving.get(d, 0.0) for d, q in free.items()}
        if self.settings.team_scoped_approval():
            self._for_approval(cq, pool, holders, waiting, free)
        if self.settings.reclaim_enabled:
            self._for_reclaim(cq, pool, holders, waiting, free)

    def _for_approval(self, cq: str, pool: str, holders: list[Member], waiting: list[Scored],
                      free: Mapping[str, float]) -> None:
        cap = self.acc.capacity.get(pool, {})
        for team in sorted({s.member.team for s in waiting
                            if s.classified.priority_class is PriorityClass.APPROVED}):
            mine = [s for s in waiting if s.member.team == team
                    and s.classified.priority_class is PriorityClass.APPROVED]
            demand = _sum(s.demand or {} for s in mine)
            if _fits(demand, free):
                continue
            need, covered = _size(_short(demand, free), cap), 0.0
            exposure = Exposure(ExposureReason.TEAM_APPROVAL, (team,), self.us(pool, team))

            def allowed(s: Scored, team: str = team) -> bool:
                return (s.classified.priority_class is PriorityClass.APPROVED
                        and s.member.team == team and s.member.cluster_queue == cq)

            for m in self.candidates((h for h in holders if h.team == team),
                                     PriorityClass.NORMAL):
                if covered >= need - _EPS:
                    break
                self.out[m.workload.key] = Victim(exposure, allowed, team, cq, self.strict)
                covered += _size(admitted_usage(m.workload, self.acc.card_mib), cap)

    def _for_reclaim(self, cq: str, pool: str, holders: list[Member], waiting: list[Scored],
                     free: Mapping[str, float]) -> None:
        s_ = self.settings
        cap = self.acc.capacity.get(pool, {})
        total = self.acc.total_weight.get(pool, 0.0)
        bar = 1.0 + s_.reclaim_margin
        min_start = self.now.timestamp() - s_.min_runtime
        over = sorted({m.team for m in holders if self.us(pool, m.team) > bar},
                      key=lambda t: (-self.us(pool, t), t))
        # What the victims chosen so far cover, per class (a share of the pool's capacity).
        covered_for: dict[PriorityClass, float] = {}

        def under(s: Scored) -> bool:
            """Its team is below its entitlement now and with its Workloads ahead of it."""
            return self.us(pool, s.member.team) < 1.0 and s.before * total < 1.0

        for team in over:
            us_v = self.us(pool, team)
            for cls in PriorityClass:
                takers = [s for s in waiting if s.classified.priority_class is cls
                          and s.member.team != team and under(s)
                          and s.share * total <= us_v - self.delta(s.demand or {}, pool, team)]
                if not takers:
                    continue
                demand = _sum(s.demand or {} for s in takers)
                if _fits(demand, free):
                    continue
                need, covered, left = _size(_short(demand, free), cap), covered_for.get(
                    cls, 0.0), us_v
                for m in self.candidates((h for h in holders if h.team == team), cls):
                    started = m.workload.reserved_since
                    if covered >= need - _EPS or self.budget_left(pool) <= 0:
                        break
                    if started is None or started.timestamp() > min_start:
                        continue
                    held = admitted_usage(m.workload, self.acc.card_mib)
                    if left - self.delta(held, pool, team) < bar - _EPS:
                        break  # it would take the team below (1 + margin) x its entitlement

                    def allowed(s: Scored, cls: PriorityClass = cls, team: str = team,
                                held: Vector = held, us_v: float = us_v) -> bool:
                        if (s.classified.priority_class is not cls or s.member.team == team
                                or s.member.cluster_queue != cq or not under(s)):
                            return False
                        lost = {d: max(held.get(d, 0.0), (s.demand or {}).get(d, 0.0))
                                for d in {*held, *(s.demand or {})}}
                        return s.share * total <= us_v - self.delta(lost, pool, team)

                    teams = tuple(sorted({s.member.team for s in takers if allowed(s)}))
                    if not teams:
                        continue
                    self.out[m.workload.key] = Victim(
                        Exposure(ExposureReason.RECLAIM, teams, us_v), allowed, team, cq,
                        self.strict)
                    self.budget[pool] = self.budget_left(pool) - 1
                    covered += _size(held, cap)
                    left -= self.delta(held, pool, team)
                covered_for[cls] = covered


def choose_victims(
    acc: Accounts, g: Gathered, scored: Iterable[Scored], settings: PolicySettings, now: datetime,
    admitted_classes: Mapping[str, Classified],
) -> Mapping[str, Victim]:
    """The admitted Workloads this plan exposes to preemption (`_Exposer`), by key."""
    if not (settings.team_scoped_approval() or settings.reclaim_enabled):
        return {}
    within = {name for name, cq in g.queues.items()
              if cq.preemption.within_cluster_queue != "Never"}
    waiting: dict[str, list[Scored]] = {}
    for s in scored:
        cq = s.member.cluster_queue
        if s.breakdown is not None and cq in within and s.classified.override is None:
            waiting.setdefault(cq, []).append(s)
    holders: dict[str, list[Member]] = {}
    for m in acc.admitted:
        if m.cluster_queue in waiting:
            holders.setdefault(m.cluster_queue, []).append(m)
    exposer = _Exposer(acc, settings, now, admitted_classes)
    for cq in sorted(holders):
        strict = g.queues[cq].preemption.within_cluster_queue == "LowerPriority"
        exposer.expose(cq, holders[cq], waiting[cq], strict)
    return MappingProxyType(exposer.out)


def nudge_takers(scored: list[Scored], victims: Mapping[str, Victim],
                 settings: PolicySettings) -> None:
    """A pending Workload that may take an exposed victim is written one point higher, with
    `preempts=<the victims' teams>` in its terms, for as long as it may. Kueue parks a Workload
    that did not fit and retries it when something in its queue changes - a priority change
    of its own, not of an admitted Workload without a WorkloadPriorityClass - so without this
    write a victim exposed after the taker was parked would wait for an unrelated event."""
    if not victims:
        return
    by_cq: dict[str | None, list[Victim]] = {}
    for victim in victims.values():
        by_cq.setdefault(victim.cluster_queue, []).append(victim)
    levels = settings.fairness_levels
    for i, s in enumerate(scored):
        b = s.breakdown
        mine = by_cq.get(s.member.cluster_queue)
        if b is None or not mine or s.classified.override is not None:
            continue
        teams = sorted({v.team for v in mine if v.allowed(s)})
        if not teams:
            continue
        scored[i] = _revalued(s, b, s.target + 1, levels, f" preempts={','.join(teams)}")


Ranked = Mapping[str, list[tuple[int, Scored]]]


def rank_threats(scored: Iterable[Scored]) -> Ranked:
    """Per pool, pending Workloads by the highest priority each can preempt with while the
    plan is written (`threat_value`), highest first."""
    out: dict[str, list[tuple[int, Scored]]] = {}
    for s in scored:
        out.setdefault(s.member.pool, []).append((threat_value(s), s))
    for entries in out.values():
        entries.sort(key=lambda e: -e[0])
    return out


def exposed_range(ranked: list[tuple[int, Scored]], protected: tuple[PriorityClass, ...],
                  allowed: Callable[[Scored], bool]) -> tuple[int, int]:
    """(threat, best): the highest value of a pending Workload that must not preempt the
    victim, and the highest target of one that may. A value in (threat, best) exposes it to
    the allowed ones only."""
    best = INT32_MIN - 1
    for value, s in ranked:
        if s.classified.priority_class not in protected:
            continue  # a higher class: may preempt it anyway
        if s.breakdown is not None and allowed(s):
            best = max(best, s.target)
            continue
        return value, best
    return INT32_MIN - 1, best


def guard_admitted(
    acc: Accounts, g: Gathered, settings: PolicySettings, now: datetime, scored: list[Scored],
    victims: Mapping[str, Victim], admitted_classes: Mapping[str, Classified],
    memo: PlanMemo | None = None,
) -> list[WorkloadDecision]:
    """Admitted Workloads that preemption can reach get their class guard once a pending
    Workload that must not preempt them reaches their priority (this plan's values included:
    the runner writes guards first). Until then, and once guarded, nothing is written: most
    Workloads are admitted before anything outranks them. A victim (`choose_victims`) is
    written just above every pending Workload that must not preempt it instead, while some
    allowed one stands above that. `admitted_classes` holds exactly the admitted Workloads of
    pools where preemption can reach them."""
    classes = _ClassTerms(settings)
    protected_from = _protected_from(settings)
    # A guard's breakdown has no wait: its times are the aging reference, which (unlike the
    # clock) changes only at a rebase.
    ref = reference(now, settings.rebase_period)
    threats = pending_threats(scored, g.queues)
    ranked = rank_threats(scored) if victims else {}
    # Guards of one (class, team, pool, base, override) share their breakdown and terms
    # (the memo's while the team's share, level and the settings and reference are equal).
    shared: dict[tuple[object, ...], _GuardMemo] = {}
    known = memo.guards.read((settings, ref)) if memo is not None else None
    # An admitted Workload's guard decision: the memo's while the Workload, its Classified,
    # shared guard and ClusterQueue are the same.
    made = memo.guard_decisions if memo is not None else None
    kept: dict[int, tuple[Workload, Classified, _GuardMemo, str | None, WorkloadDecision]] = {}
    # The highest threat to a class, per (pool, ClusterQueue, class).
    highest: dict[tuple[str, str | None, PriorityClass], int] = {}
    out: list[WorkloadDecision] = []
    for m in acc.admitted:
        w = m.workload
        wkey = w.key
        c = admitted_classes.get(wkey)
        if c is None:
            continue  # preemption cannot reach its pool
        if c.blocking:
            out.append(_unchanged(m, c, c.problems, admitted=True, rank=-1))
            continue
        if w.evicting:
            # Kueue is taking it off (its quota frees once its pods stop): a guard now would
            # take it out of the preemption under way, and it would come back pending with the
            # guard's value, above the Workload it was evicted for, and take the quota back.
            continue
        cls = c.priority_class
        victim = victims.get(wkey) if victims else None
        if victim is not None:
            threat, best = exposed_range(ranked.get(m.pool, []), protected_from[cls],
                                         victim.allowed)
            low = threat if victim.strict else threat + 1  # nothing it protects can take it
            low = max(low, min(0, best - 1))  # nothing to protect it from: 0, not int32's floor
            if best > low:
                current = kueue_priority(w, c)
                old = parse_terms(w.annotations.get(PRIORITY_TERMS_ANNOTATION))
                if low <= current < best and old.get("state") == _STATE[
                        victim.exposure.reason]:
                    # Already exposed for this reason at a value that still works: its terms'
                    # `for`/`over` stay as written (which teams may take it is the value's
                    # work, and Kueue names the one that did when it preempts).
                    continue
                out.append(_exposed(m, c, acc, classes, low, victim.exposure, ref))
                continue
        if c.override is None:
            current = kueue_priority(w, c)
            where = (m.pool, m.cluster_queue, cls)
            found = highest.get(where)
            if found is None:
                found = highest[where] = max(
                    (max(threats.get(("pool", m.pool, p), INT32_MIN - 1),
                         threats.get(("cq", m.cluster_queue or "", p), INT32_MIN - 1))
                     for p in protected_from[cls]), default=INT32_MIN - 1)
            if found < current and current != classes.guard[cls]:
                text = w.annotations.get(PRIORITY_TERMS_ANNOTATION)
                if not text or parse_terms(text).get("state") not in _STATE.values():
                    continue  # nothing can preempt it yet (and it is not exposed): no write
            # (an exposure no longer chosen is guarded at once: its low value would invite
            # the next waiting Workload to take it)
        key = (cls, m.team, m.pool, c.base, c.override)
        hit = shared.get(key)
        if hit is None:
            ts = acc.shares.get((m.pool, m.team))
            share = (ts.dominant_resource, ts.dominant_share, ts.level) if ts else (
                None, 0.0, 0)
            hit = known.get(key) if known else None
            if hit is None or hit[4] != share:
                target = c.override if c.override is not None else classes.guard[cls]
                boost, clamped = _boost(target, c.base)
                breakdown = PriorityBreakdown(
                    cls, classes.weight[cls], classes.term[cls], m.team, m.pool, *share, 0,
                    ref, ref, 0, c.base, 0, c.override, target, True, clamped,
                )
                hit = (breakdown, guard_terms(cls, m.team, m.pool, c.override, target), boost,
                       clamped, share)
            shared[key] = hit
        prior = made.get(id(w)) if made else None
        if prior is not None and prior[0] is w and prior[1] is c and prior[2] is hit \
                and prior[3] == m.cluster_queue:
            kept[id(w)] = prior
            out.append(prior[4])
            continue
        breakdown, terms, boost, clamped, _share = hit
        problems = c.problems
        if clamped:
            problems = (*problems, InputProblem(w.ref, "spec.priority", str(c.base), clamped))
        # (positional: the fields in order, as `WorkloadDecision` declares them)
        d = WorkloadDecision(
            wkey, w.uid, m.cluster_queue, m.team, -1, c.base, w.priority, c.current_boost,
            boost, breakdown.priority, breakdown, None, problems, False, True, terms)
        if memo is not None:
            kept[id(w)] = (w, c, hit, m.cluster_queue, d)
        out.append(d)
    if memo is not None:
        memo.guards.keep(shared)
        memo.guard_decisions = kept
    out.sort(key=_KEY)
    return out


# Guards of one (class, team, pool, base, override): (breakdown, terms, boost, why clamped,
# the team's (dominant resource, dominant share, level) they were made with).
_GuardMemo = tuple[PriorityBreakdown, str, int, str, tuple[str | None, float, int]]
_KEY = attrgetter("key")


def _exposed(m: Member, c: Classified, acc: Accounts, classes: _ClassTerms, target: int,
             exposure: Exposure, ref: datetime) -> WorkloadDecision:
    w, cls = m.workload, c.priority_class
    boost, clamped = _boost(target, c.base)
    ts = acc.shares.get((m.pool, m.team))
    breakdown = PriorityBreakdown(
        cls, classes.weight[cls], classes.term[cls], m.team, m.pool,
        ts.dominant_resource if ts else None, ts.dominant_share if ts else 0.0,
        ts.level if ts else 0, 0, ref, ref, 0, c.base, 0, None, target, True, clamped,
        ts.dominant_share if ts else 0.0, None, exposure,
    )
    problems = c.problems
    if clamped:
        problems = (*problems, InputProblem(w.ref, "spec.priority", str(c.base), clamped))
    return WorkloadDecision(
        key=w.key, uid=w.uid, cluster_queue=m.cluster_queue, team=m.team, rank=-1,
        base_priority=c.base, current_priority=w.priority, current_boost=c.current_boost,
        target_boost=boost, target_priority=target, breakdown=breakdown, problems=problems,
        admitted=True,
        terms=exposed_terms(cls, m.team, m.pool, _STATE[exposure.reason], exposure.for_teams,
                            exposure.over_entitlement, target),
    )


# --------------------------------------------------------------------------------------------
# order


def order(scored: list[Scored], memo: PlanMemo | None = None) -> list[WorkloadDecision]:
    """Kueue's order inside a ClusterQueue: higher priority, then earlier queue time, then
    UID; `rank` is the position within the Workload's ClusterQueue."""
    ordered = _ordered(scored, memo)
    scored[:] = ordered.scored
    position: dict[str | None, int] = {}
    ranks: list[int] = []
    for cq in ordered.queues:
        rank = position.get(cq, 0)
        position[cq] = rank + 1
        ranks.append(rank)
    # A decision is the last plan's while it is for the same Scored (a Scored never changes
    # once made) at the same rank.
    decisions = ordered.decisions
    for i in compress(range(len(ranks)), map(ne, ranks, ordered.ranks)):
        decisions[i] = _decision(scored[i], ranks[i])
    ordered.ranks = ranks
    return decisions.copy()  # type: ignore[return-value]  # (every position is set)


@dataclass(slots=True)
class _Ordered:
    """Pending Scored in Kueue's order (`_order_key`), with their keys, ClusterQueues,
    ranks and decisions (-1 and None until made), and the same Scored by id."""

    held: dict[int, Scored]
    keys: list[tuple[int, datetime, str]]
    queues: list[str | None]
    scored: list[Scored]
    ranks: list[int]
    decisions: list[WorkloadDecision | None]


# Past this many Scored in or out since the last plan, `_ordered` sorts them all again.
_FEW_SORTED = 256


def _ordered(scored: list[Scored], memo: PlanMemo | None) -> _Ordered:
    """`scored` in Kueue's order (a stable sort). With a memo, the last plan's order is kept
    (the memo's, changed in place) and only the Scored that joined or left it since are moved
    in or out, found by bisection: the memo's Scored never change, so neither do their keys,
    and the others are not read at all (reading a Workload's objects costs cache misses).
    (Only while every UID is set: keys then differ, and the order is the one a sort gives.)"""
    last = memo.order if memo is not None else None
    if last is not None:
        held = last.held
        now_ids = set(map(id, scored))
        left = held.keys() - now_ids
        joined_ids = now_ids - held.keys()
        joined = list(compress(scored, map(joined_ids.__contains__, map(id, scored)))) \
            if joined_ids else []
        if len(joined) + len(left) <= _FEW_SORTED and "" not in map(_SCORED_UID, joined):
            keys, queues, ordered = last.keys, last.queues, last.scored
            ranks, decisions = last.ranks, last.decisions
            for gone in map(held.pop, left):
                i = bisect_left(keys, _order_key(gone))
                assert ordered[i] is gone
                del keys[i], queues[i], ordered[i], ranks[i], decisions[i]
            for s in joined:
                key = _order_key(s)
                i = bisect_left(keys, key)
                keys.insert(i, key)
                queues.insert(i, s.member.cluster_queue)
                ordered.insert(i, s)
                ranks.insert(i, -1)
                decisions.insert(i, None)
                held[id(s)] = s
            return last
    # (the keys built and the positions sorted in C)
    all_keys = list(map(_order_key, scored))
    positions = sorted(range(len(scored)), key=all_keys.__getitem__)
    in_order = list(map(scored.__getitem__, positions))
    out = _Ordered(dict(zip(map(id, in_order), in_order, strict=True)) if memo else {},
                   list(map(all_keys.__getitem__, positions)),
                   list(map(_SCORED_CQ, in_order)), in_order, [-1] * len(scored),
                   [None] * len(scored))
    if memo is not None:
        memo.order = out if "" not in map(_THIRD, all_keys) else None
    return out


def _order_key(s: Scored) -> tuple[int, datetime, str]:
    return (-s.target, s.since, s.member.workload.uid)


def _decision(s: Scored, rank: int) -> WorkloadDecision:
    m, c, b = s.member, s.classified, s.breakdown
    if b is None:
        return _unchanged(m, c, s.problems, admitted=False, rank=rank)
    w = m.workload
    # (positional: the fields in order, as `WorkloadDecision` declares them)
    return WorkloadDecision(
        w.key, w.uid, m.cluster_queue, m.team, rank, c.base, w.priority, c.current_boost,
        s.boost, s.target, b, s.hami, s.problems, False, False, s.terms)


_SCORED_UID, _SCORED_CQ = attrgetter("member.workload.uid"), attrgetter("member.cluster_queue")


def plan_warnings(
    queues: Iterable[ClusterQueue], unknown: int, teams: Collection[str], capacity_known: bool,
    stand_ins: Iterable[str], settings: PolicySettings,
) -> list[str]:
    """The settings' warnings and the cluster's: ClusterQueues where the planned order may not
    hold, `unknown` pending Workloads with an unknown LocalQueue, TEAM_WEIGHTS naming none of
    the `teams` with shares, no capacity known, then `stand_ins` (`stand_in_warnings`)."""
    warnings = list(settings.warnings())
    for queue in sorted(queues, key=lambda c: c.name):
        if queue.preemption.within_cluster_queue == "LowerOrNewerEqualPriority":
            warnings.append(
                f"ClusterQueue {queue.name}: withinClusterQueue=LowerOrNewerEqualPriority: "
                "until the next cycle re-scores it, a just-evicted Workload still carries its "
                "class guard and may preempt a newer admitted Workload of the same class; "
                "LowerPriority has no such window"
            )
        if queue.admission_fair_sharing:
            warnings.append(
                f"ClusterQueue {queue.name}: Admission Fair Sharing orders by LocalQueue usage "
                "before priority, so the planned order may not hold there"
            )
    if unknown:
        warnings.append(
            f"{unknown} pending workload(s) use a LocalQueue not in the snapshot "
            "(ClusterQueue unknown; ranked under '-', shares against the whole cluster)"
        )
    unknown_teams = sorted(t for t in settings.team_weights if t not in teams)
    if unknown_teams and teams:
        warnings.append(f"TEAM_WEIGHTS names team(s) with no Workloads here: "
                        f"{', '.join(unknown_teams)} (a typo, or idle teams)")
    if not capacity_known:
        warnings.append("no capacity known for any weighted resource: all shares are 0")
    warnings += stand_ins
    return warnings


def kueue_team_weights(
    snapshot: ClusterSnapshot, settings: PolicySettings,
) -> tuple[dict[str, float], list[str]]:
    """Kueue's own weights per team: the `fairSharing.weight` of a ClusterQueue that one team
    alone uses (its LocalQueues all belong to that team), or, in a ClusterQueue with Admission
    Fair Sharing, of the LocalQueues of one team. With `TEAM_WEIGHTS: auto` these are the
    weights; with explicit TEAM_WEIGHTS a difference is reported. (With TEAM_SOURCE=label a
    queue's team is not known: nothing is read.)"""
    if settings.team_source is TeamSource.LABEL:
        return {}, []

    def team_of_queue(lq: LocalQueue) -> str:
        if settings.team_source is TeamSource.LOCAL_QUEUE:
            return lq.key
        return settings.team_namespaces.get(lq.namespace, lq.namespace)

    queues = {cq.name: cq for cq in snapshot.cluster_queues}
    teams_of: dict[str, set[str]] = {}
    for lq in snapshot.local_queues:
        teams_of.setdefault(lq.cluster_queue, set()).add(team_of_queue(lq))
    found: dict[str, set[float]] = {}
    for name, teams in teams_of.items():
        cq = queues.get(name)
        if cq is not None and len(teams) == 1 and cq.fair_sharing_weight is not None:
            found.setdefault(next(iter(teams)), set()).add(float(cq.fair_sharing_weight))
    for lq in snapshot.local_queues:
        cq = queues.get(lq.cluster_queue)
        if cq is not None and cq.admission_fair_sharing and lq.fair_sharing_weight is not None:
            found.setdefault(team_of_queue(lq), set()).add(float(lq.fair_sharing_weight))
    weights: dict[str, float] = {}
    notes: list[str] = []
    for team in sorted(found):
        values = sorted(found[team])
        if len(values) > 1:
            notes.append(f"team {team}: Kueue's fairSharing weights disagree ({values}); "
                         f"{values[0]:g} is used")
        weights[team] = min(max(values[0], MIN_TEAM_WEIGHT), MAX_TEAM_WEIGHT)
    if not settings.weights_from_kueue():
        for team, kueue in weights.items():
            mine = settings.team_weights.get(team, 1.0)
            if abs(mine - kueue) > 1e-9 * max(mine, kueue):
                notes.append(f"team {team}: TEAM_WEIGHTS gives {mine:g}, Kueue's fairSharing "
                             f"weight is {kueue:g} (TEAM_WEIGHTS: auto takes Kueue's)")
    return weights, notes


def team_summary(shares: Mapping[PoolTeam, TeamShare]) -> Mapping[str, TeamShare]:
    """Per team, its share in the pool where it is largest (ties: the first pool by name)."""
    best: dict[str, TeamShare] = {}
    for (_pool, team), ts in sorted(shares.items()):
        if team not in best or ts.dominant_share > best[team].dominant_share:
            best[team] = ts
    return MappingProxyType(dict(sorted(best.items())))


# --------------------------------------------------------------------------------------------


def compute_plan(
    snapshot: ClusterSnapshot,
    settings: PolicySettings,
    now: datetime,
    history: UsageHistory | None = None,
    memo: PlanMemo | None = None,
    *,
    unique: bool = False,
) -> Plan:
    """Decide every pending, active Workload's priority and HAMi settings, and the guard of
    every admitted Workload that preemption can reach. Pure and deterministic: `memo` (one
    per control loop) only saves recomputing what the last call found (`PlanMemo`).
    `unique`: the caller has checked the snapshot's Workloads (`gather`)."""
    g = gather(snapshot, unique)
    configured = settings
    kueue_weights, weight_notes = kueue_team_weights(snapshot, settings)
    if settings.weights_from_kueue():
        settings = replace(settings, team_weights=MappingProxyType(kueue_weights))
    acc = account(g, snapshot, settings, now, history, memo)
    scored = score_pending(acc, g, snapshot, settings, now, memo)
    name_reclaimers(scored, acc)
    keep_order(scored, settings)
    hold_behind_preemptors(scored, acc, g, settings)
    pools = preempting_pools(g.queues.values())
    admitted_classes = _admitted_classes(acc, pools, memo)
    victims = choose_victims(acc, g, scored, settings, now, admitted_classes)
    nudge_takers(scored, victims, settings)
    decisions = order(scored, memo)
    decisions += guard_admitted(acc, g, settings, now, scored, victims, admitted_classes,
                                memo)
    return Plan(
        now=now,
        decisions=tuple(decisions),
        teams=team_summary(acc.shares),
        problems=g.plan_problems,
        warnings=(*plan_warnings(
            g.queues.values(), list(map(_CLUSTER_QUEUE, acc.pending)).count(None),
            {team for (_pool, team) in acc.shares}, acc.capacity_known,
            stand_in_warnings(g.workloads, configured,
                              memo.stand_ins if memo is not None else None), configured),
            *weight_notes),
        history=acc.history,
        pool_shares=acc.shares,
        reference=reference(now, settings.rebase_period),
    )
