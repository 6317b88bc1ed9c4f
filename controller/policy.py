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
Admitted: the class guard (`Settings.guard`), above every pending Workload that must not
          preempt it, written once such a Workload reaches it (`guard_admitted`), so Kueue's
          preemption only ever sees class differences.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from controller.accounting import (
    UNKNOWN_POOL,
    UsageHistory,
    Vector,
    active_weights,
    admitted_usage,
    card_memory,
    cluster_capacity,
    fairness_level,
    gpu_inventory,
    level_points,
    pool_capacities,
    pool_of,
    resource_of,
    resource_problems,
    team_of,
    team_share,
)
from controller.classify import Classified, clamp_int32, classify, implied_base
from controller.config import INT32_MAX, INT32_MIN, Settings
from controller.domain import (
    PRIORITY_TERMS_ANNOTATION,
    ClusterQueue,
    ClusterSnapshot,
    InputProblem,
    JobInfo,
    OwnerInfo,
    PriorityClass,
    TeamSource,
    Workload,
)
from controller.encoding import (
    aging_term,
    base_term,
    guard_terms,
    iso,
    pending_terms,
    queued_since,
    reference,
    requeue_mode,
)
from controller.hami import decide_hami
from controller.plan import HamiDecision, Plan, PriorityBreakdown, TeamShare, WorkloadDecision

__all__ = ["clamp_int32", "compute_plan", "implied_base"]

PoolTeam = tuple[str, str]


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


def gather(snapshot: ClusterSnapshot) -> Gathered:
    workloads, dup_problems = deduplicate(w for w in snapshot.workloads if not w.finished)
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
    if o is None or o.kind != "Job":
        return None
    j = jobs.get((w.namespace, o.name))
    if j is None or (o.uid and j.uid and o.uid != j.uid):
        return None
    return j


def owner_of(w: Workload, g: Gathered) -> JobInfo | OwnerInfo | None:
    """The object users annotate: the owner Job, or an owner of another integrated kind
    (the same UID as the ownerReference, so a recreated owner is not mistaken)."""
    job = owner_job(w, g.jobs)
    if job is not None or w.owner is None or w.owner.kind == "Job":
        return job
    o = g.owners.get((w.namespace, w.owner.kind, w.owner.name))
    if o is None or (w.owner.uid and o.uid and w.owner.uid != o.uid):
        return None
    return o


# --------------------------------------------------------------------------------------------
# account


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


def _history_key(pool: str, team: str) -> str:
    return f"{pool}|{team}"


def _previous_levels(members: Iterable[Member], levels: int) -> dict[PoolTeam, int]:
    """The level each (pool, team) had in the last plan, read back from the priority-terms
    annotation the controller wrote on its pending Workloads (most common value; ties: the
    lower). Pure: a restarted controller keeps its hysteresis."""
    seen: dict[PoolTeam, Counter[int]] = {}
    suffix = f"/{levels} "
    for m in members:
        text = m.workload.annotations.get(PRIORITY_TERMS_ANNOTATION)
        if not text or f" pool={m.pool} " not in text or f" team={m.team} " not in text:
            continue
        start = text.find(" level=")
        end = text.find(suffix, start)
        if start < 0 or end < 0 or not text[start + 7:end].isdigit():
            continue
        seen.setdefault((m.pool, m.team), Counter())[int(text[start + 7:end])] += 1
    return {k: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for k, c in seen.items()}


def account(
    g: Gathered, snapshot: ClusterSnapshot, settings: Settings, now: datetime,
    history: UsageHistory | None,
) -> Accounts:
    inventory, _ = gpu_inventory(snapshot.nodes, settings, now)
    card_mib = card_memory(inventory, settings)
    capacities, _source = pool_capacities(snapshot.cluster_queues, inventory)
    whole = cluster_capacity(capacities)
    pool_by_cq = {name: pool_of(cq) for name, cq in g.queues.items()}

    by_label = settings.team_source is TeamSource.LABEL
    pending: list[Member] = []
    admitted: list[Member] = []
    current: dict[PoolTeam, Vector] = {}
    present: set[PoolTeam] = set()
    for w in g.workloads:
        if w.quota_reserved:
            cq = w.admission.cluster_queue if w.admission else g.lq_to_cq.get(
                (w.namespace, w.queue_name))
        elif w.active:
            cq = g.lq_to_cq.get((w.namespace, w.queue_name))
        else:
            continue  # deactivated and pending: not competing, not "present"
        pool = pool_by_cq.get(cq, UNKNOWN_POOL) if cq else UNKNOWN_POOL
        job = owner_of(w, g)
        team = team_of(w, settings, job.labels if (by_label and job) else None)
        member = Member(w, job, team, cq, pool)
        present.add((pool, team))
        if w.quota_reserved:
            admitted.append(member)
            acc_vec = current.setdefault((pool, team), {})
            for dim, q in admitted_usage(w, card_mib).items():
                acc_vec[dim] = acc_vec.get(dim, 0.0) + q
        else:
            pending.append(member)

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
    for pt in sorted(set(usage) | present):
        cap = capacities.get(pt[0]) or whole
        shares_raw[pt] = team_share(pt[1], usage.get(pt, {}), cap, settings, pt[0])
    active = active_weights(shares_raw, present, settings)

    previous = _previous_levels(pending, settings.fairness_levels)
    shares: dict[PoolTeam, TeamShare] = {}
    for pt, ts in shares_raw.items():
        total = active.get(pt[0], 0.0)
        level = fairness_level(ts.dominant_share, total, settings, previous.get(pt))
        shares[pt] = replace(ts, level=level, fairness_term=level_points(level, settings),
                             usage_over_entitlement=ts.dominant_share * total)
    weighted = {resource_of(d) for vec in capacities.values() for d, q in vec.items() if q > 0}
    return Accounts(
        pending=tuple(pending),
        admitted=tuple(admitted),
        shares=MappingProxyType(shares),
        history=new_history,
        card_mib=card_mib,
        capacity_known=any(settings.resource_weights.get(r, 0) > 0 for r in weighted),
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

    def __init__(self, settings: Settings) -> None:
        self.weight = {c: settings.class_weight(c) for c in PriorityClass}
        self.term = {c: settings.class_term(c) for c in PriorityClass}
        self.guard = {c: settings.guard(c) for c in PriorityClass}


def score_pending(
    acc: Accounts, g: Gathered, snapshot: ClusterSnapshot, settings: Settings, now: datetime,
) -> list[Scored]:
    mode = requeue_mode(snapshot.requeue_timestamp, settings)
    ref = reference(now, settings.rebase_period)
    ref_ts, ref_iso = ref.timestamp(), iso(ref)
    now_ts = now.timestamp()
    levels = settings.fairness_levels
    classes = _ClassTerms(settings)
    hami_cache: dict[tuple[object, ...], HamiDecision | None] = {}
    out: list[Scored] = []
    for m in acc.pending:
        w, job = m.workload, m.job
        c = classify(w, job)
        parse_problems = g.workload_problems.get((w.namespace, w.name), ())
        problems: list[InputProblem] = [*parse_problems, *c.problems]
        blocking = c.blocking or bool(parse_problems)
        for prob, is_blocking in resource_problems(w, settings):
            problems.append(prob)
            blocking = blocking or is_blocking
        hami, p = decide_hami(w, job if isinstance(job, JobInfo) else None, c.priority_class,
                              m.cluster_queue, settings, acc.card_mib, hami_cache)
        if p:
            problems += p
            blocking = True
        since = queued_since(w, mode)
        if blocking:
            out.append(Scored(m, c, tuple(problems), hami, since, kueue_priority(w, c),
                              c.current_boost or 0, None, ""))
            continue
        since_ts = since.timestamp()
        ts = acc.shares[(m.pool, m.team)]
        aging = aging_term(since_ts, ref_ts, settings)
        cls = c.priority_class
        bterm = base_term(c.base, settings)
        if c.override is not None:
            target = c.override
        else:
            target = classes.term[cls] + bterm + ts.fairness_term + aging
        boost, clamped = _boost(target, c.base)
        if clamped:
            problems.append(InputProblem(w.ref, "spec.priority", str(c.base), clamped))
        breakdown = PriorityBreakdown(
            cls, classes.weight[cls], classes.term[cls], m.team, m.pool,
            ts.dominant_resource, ts.dominant_share, ts.level, ts.fairness_term,
            since, max(now_ts - since_ts, 0.0), ref, aging, c.base, bterm, c.override, target,
            False, clamped,
        )
        terms = pending_terms(cls, m.team, m.pool, ts.level, levels, ts.fairness_term,
                              iso(since), ref_iso, c.base, c.override, target)
        out.append(Scored(m, c, tuple(problems), hami, since, target, boost, breakdown, terms))
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


Threats = Mapping[tuple[str, PriorityClass], int]


def pending_threats(scored: Iterable[Scored]) -> Threats:
    """Per (pool, class), the highest priority a pending Workload of that class has now or is
    given by this plan: both values exist while the plan is being written."""
    out: dict[tuple[str, PriorityClass], int] = {}
    for s in scored:
        c = s.classified
        key = (s.member.pool, c.priority_class)
        value = max(s.target, kueue_priority(s.member.workload, c))
        if value > out.get(key, INT32_MIN - 1):
            out[key] = value
    return MappingProxyType(out)


def _protected_from(settings: Settings) -> Mapping[PriorityClass, tuple[PriorityClass, ...]]:
    """For each class of admitted work, the pending classes that must not preempt it:
    `Settings.protected_class` and every class below it."""
    out: dict[PriorityClass, tuple[PriorityClass, ...]] = {}
    for cls in PriorityClass:
        limit = settings.class_term(settings.protected_class(cls))
        out[cls] = tuple(p for p in PriorityClass if settings.class_term(p) <= limit)
    return out


def guard_admitted(
    acc: Accounts, g: Gathered, settings: Settings, now: datetime, threats: Threats,
) -> list[WorkloadDecision]:
    """Admitted Workloads that preemption can reach get their class guard once a pending
    Workload that must not preempt them reaches their priority (`threats`, this plan's values
    included: the runner writes guards first). Until then, and once guarded, nothing is
    written: most Workloads are admitted before anything outranks them."""
    pools = preempting_pools(g.queues.values())
    classes = _ClassTerms(settings)
    protected_from = _protected_from(settings)
    # Guards of one (class, team, pool, base, override) share their breakdown and terms.
    shared: dict[tuple[object, ...], tuple[PriorityBreakdown, str, int, str]] = {}
    out: list[WorkloadDecision] = []
    for m in acc.admitted:
        if m.pool not in pools:
            continue
        w = m.workload
        c = classify(w, m.job)
        if c.blocking:
            out.append(_unchanged(m, c, c.problems, admitted=True, rank=-1))
            continue
        cls = c.priority_class
        if c.override is None:
            current = kueue_priority(w, c)
            threat = max((threats.get((m.pool, p), INT32_MIN - 1) for p in protected_from[cls]),
                         default=INT32_MIN - 1)
            if threat < current and current != classes.guard[cls]:
                continue  # nothing can preempt it yet: no write
        key = (cls, m.team, m.pool, c.base, c.override)
        hit = shared.get(key)
        if hit is None:
            target = c.override if c.override is not None else classes.guard[cls]
            boost, clamped = _boost(target, c.base)
            ts = acc.shares.get((m.pool, m.team))
            breakdown = PriorityBreakdown(
                cls, classes.weight[cls], classes.term[cls], m.team, m.pool,
                ts.dominant_resource if ts else None, ts.dominant_share if ts else 0.0,
                ts.level if ts else 0, 0, now, 0.0, now, 0, c.base, 0, c.override, target,
                True, clamped,
            )
            hit = (breakdown, guard_terms(cls, m.team, m.pool, c.override, target), boost,
                   clamped)
            shared[key] = hit
        breakdown, terms, boost, clamped = hit
        problems = c.problems
        if clamped:
            problems = (*problems, InputProblem(w.ref, "spec.priority", str(c.base), clamped))
        out.append(WorkloadDecision(
            key=w.key, uid=w.uid, cluster_queue=m.cluster_queue, team=m.team, rank=-1,
            base_priority=c.base, current_priority=w.priority, current_boost=c.current_boost,
            target_boost=boost, target_priority=breakdown.priority, breakdown=breakdown,
            problems=problems, admitted=True, terms=terms,
        ))
    out.sort(key=lambda d: d.key)
    return out


# --------------------------------------------------------------------------------------------
# order


def order(scored: list[Scored]) -> list[WorkloadDecision]:
    """Kueue's order inside a ClusterQueue: higher priority, then earlier queue time, then
    UID; `rank` is the position within the Workload's ClusterQueue."""
    scored.sort(key=lambda s: (-s.target, s.since, s.member.workload.uid))
    position: dict[str | None, int] = {}
    out: list[WorkloadDecision] = []
    for s in scored:
        m, c = s.member, s.classified
        rank = position.get(m.cluster_queue, 0)
        position[m.cluster_queue] = rank + 1
        if s.breakdown is None:
            out.append(_unchanged(m, c, s.problems, admitted=False, rank=rank))
            continue
        w = m.workload
        out.append(WorkloadDecision(
            key=w.key, uid=w.uid, cluster_queue=m.cluster_queue, team=m.team, rank=rank,
            base_priority=c.base, current_priority=w.priority, current_boost=c.current_boost,
            target_boost=s.boost, target_priority=s.target, breakdown=s.breakdown,
            hami=s.hami, problems=s.problems, terms=s.terms,
        ))
    return out


def plan_warnings(
    g: Gathered, acc: Accounts, settings: Settings
) -> list[str]:
    warnings = list(settings.warnings())
    for queue in sorted(g.queues.values(), key=lambda c: c.name):
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
    unknown = sum(1 for m in acc.pending if m.cluster_queue is None)
    if unknown:
        warnings.append(
            f"{unknown} pending workload(s) use a LocalQueue not in the snapshot "
            "(ClusterQueue unknown; ranked under '-', shares against the whole cluster)"
        )
    seen = {team for (_pool, team) in acc.shares}
    unknown_teams = sorted(t for t in settings.team_weights if t not in seen)
    if unknown_teams and seen:
        warnings.append(f"TEAM_WEIGHTS names team(s) with no Workloads here: "
                        f"{', '.join(unknown_teams)} (a typo, or idle teams)")
    if not acc.capacity_known:
        warnings.append("no capacity known for any weighted resource: all shares are 0")
    return warnings


def _team_summary(shares: Mapping[PoolTeam, TeamShare]) -> Mapping[str, TeamShare]:
    """Per team, its share in the pool where it is largest (ties: the first pool by name)."""
    best: dict[str, TeamShare] = {}
    for (_pool, team), ts in sorted(shares.items()):
        if team not in best or ts.dominant_share > best[team].dominant_share:
            best[team] = ts
    return MappingProxyType(dict(sorted(best.items())))


# --------------------------------------------------------------------------------------------


def compute_plan(
    snapshot: ClusterSnapshot,
    settings: Settings,
    now: datetime,
    history: UsageHistory | None = None,
) -> Plan:
    """Decide every pending, active Workload's priority and HAMi settings, and the guard of
    every admitted Workload that preemption can reach. Pure and deterministic."""
    g = gather(snapshot)
    acc = account(g, snapshot, settings, now, history)
    scored = score_pending(acc, g, snapshot, settings, now)
    threats = pending_threats(scored)
    decisions = order(scored)
    decisions += guard_admitted(acc, g, settings, now, threats)
    return Plan(
        now=now,
        decisions=tuple(decisions),
        teams=_team_summary(acc.shares),
        problems=g.plan_problems,
        warnings=tuple(plan_warnings(g, acc, settings)),
        history=acc.history,
        pool_shares=acc.shares,
        reference=reference(now, settings.rebase_period),
    )
