"""The WDRF priority policy: one pure, deterministic function from a snapshot to a plan.

    boost = class_weight x PRIORITY_CLASS_UNIT                     (tier: urgent/approved/normal)
          + fairness(team)   in 0..FAIRNESS_POINTS, quantized      (2^-(U/S), Slurm classic)
          + aging(wait)      = floor(AGING_COEFFICIENT x step-floored min(wait, MAX_AGING_TIME))
    target priority = base + boost (clamped to int32); an admin override sets it outright.

With equal waits, classes never reorder (FAIRNESS_POINTS < class gap x unit, checked at load).
A normal workload can only be overtaken by workloads that arrived before it, or less than
`Settings.overtake_window(cls)` after it for an overtaking class `cls` (while it has waited
< MAX_AGING_TIME); where that window is infinite (urgent, by default) work of that class can
overtake it at any time. `Settings.starvation_bound()` states it. See docs/policy.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from controller.accounting import (
    UsageHistory,
    Vector,
    admitted_usage,
    capacity,
    card_memory,
    fairness_term,
    gpu_inventory,
    resource_problems,
    team_of,
    team_share,
    team_weight,
)
from controller.config import INT32_MAX, INT32_MIN, MAX_OVERRIDE, Settings
from controller.domain import (
    APPLIED_PRIORITY_ANNOTATION,
    APPROVED_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
    ClusterSnapshot,
    InputProblem,
    JobInfo,
    PriorityClass,
    TeamSource,
    Workload,
)
from controller.hami import decide_hami
from controller.plan import HamiDecision, Plan, PriorityBreakdown, TeamShare, WorkloadDecision

_UNSIGNED = re.compile(r"^[0-9]{1,10}$")
_SIGNED = re.compile(r"^-?[0-9]{1,10}$")
_CLASS_KEYS = (URGENT_ANNOTATION, APPROVED_ANNOTATION)
_POLICY_KEYS = frozenset({
    URGENT_ANNOTATION, APPROVED_ANNOTATION, PRIORITY_OVERRIDE_ANNOTATION,
    BASE_PRIORITY_ANNOTATION, KUEUE_PRIORITY_BOOST_ANNOTATION,
})


def clamp_int32(value: int) -> int:
    return max(INT32_MIN, min(INT32_MAX, value))


# --------------------------------------------------------------------------------------------
# Annotations


def read_class(
    workload: Workload, job: JobInfo | None
) -> tuple[PriorityClass, list[InputProblem]]:
    """Class from `wdrf.x-k8s.io/urgent|approved` on the Workload and its owner Job: exactly
    "true" sets it, exactly "false" is the explicit default, anything else is a problem.
    The highest class any source sets wins."""
    problems: list[InputProblem] = []
    urgent = approved = False
    sources: list[Workload | JobInfo] = [workload] if job is None else [workload, job]
    for src in sources:
        ann = src.annotations
        for key in _CLASS_KEYS:
            val = ann.get(key)
            if val is None or val == "false":
                continue
            if val == "true":
                if key == URGENT_ANNOTATION:
                    urgent = True
                else:
                    approved = True
                continue
            problems.append(InputProblem(
                src.ref, f"metadata.annotations[{key}]", val,
                'expected exactly "true" (or "false"); the value is case- and space-sensitive',
            ))
    if urgent:
        return PriorityClass.URGENT, problems
    if approved:
        return PriorityClass.APPROVED, problems
    return PriorityClass.NORMAL, problems


def read_override(
    workload: Workload, job: JobInfo | None
) -> tuple[int | None, list[InputProblem]]:
    """`wdrf.x-k8s.io/priority-override`: a plain decimal integer 0..MAX_OVERRIDE (no sign,
    exponent or spaces), from the Workload, else the owner Job."""
    sources: list[Workload | JobInfo] = [workload] if job is None else [workload, job]
    for src in sources:
        val = src.annotations.get(PRIORITY_OVERRIDE_ANNOTATION)
        if val is None:
            continue
        if _UNSIGNED.match(val) and int(val) <= MAX_OVERRIDE:
            return int(val), []
        return None, [InputProblem(
            src.ref, f"metadata.annotations[{PRIORITY_OVERRIDE_ANNOTATION}]", val,
            f"expected a plain integer 0..{MAX_OVERRIDE} (no sign, exponent or spaces)",
        )]
    return None, []


def _int32(val: str | None) -> int | None:
    if val is not None and _SIGNED.match(val) and INT32_MIN <= int(val) <= INT32_MAX:
        return int(val)
    return None


def implied_base(priority: int | None, annotations: Mapping[str, str]) -> int | None:
    """The base priority a Workload's spec.priority and annotations imply; None when
    `wdrf.x-k8s.io/base-priority` is present but invalid.

    Without a (valid) base annotation: spec.priority, else 0. With one, and a valid
    `wdrf.x-k8s.io/applied-priority` (the spec.priority this controller last wrote):
    spec.priority == applied -> ours, the base annotation; == base -> Kueue reset it to the
    class value, the base annotation; anything else -> someone set a new base (a changed
    WorkloadPriorityClass, an admin), spec.priority. Without a valid applied annotation the
    base annotation wins, as it did before that annotation existed."""
    val = annotations.get(BASE_PRIORITY_ANNOTATION)
    if val is None:
        return priority or 0
    base = _int32(val)
    if base is None:
        return None
    applied = _int32(annotations.get(APPLIED_PRIORITY_ANNOTATION))
    if applied is None or priority is None or priority in (applied, base):
        return base
    return priority


def read_base(workload: Workload) -> tuple[int, list[InputProblem]]:
    """Base priority, see `implied_base`. An invalid base annotation is a problem: without the
    true base, writing spec priority would compound boosts."""
    base = implied_base(workload.priority, workload.annotations)
    if base is None:
        return (workload.priority or 0), [InputProblem(
            workload.ref, f"metadata.annotations[{BASE_PRIORITY_ANNOTATION}]",
            workload.annotations[BASE_PRIORITY_ANNOTATION],
            "expected a signed int32 integer",
        )]
    return base, []


def read_current_boost(workload: Workload) -> tuple[int | None, list[InputProblem]]:
    val = workload.annotations.get(KUEUE_PRIORITY_BOOST_ANNOTATION)
    if val is None:
        return None, []
    if _SIGNED.match(val) and INT32_MIN <= int(val) <= INT32_MAX:
        return int(val), []
    return None, [InputProblem(
        workload.ref, f"metadata.annotations[{KUEUE_PRIORITY_BOOST_ANNOTATION}]", val,
        "expected a signed int32 integer (Kueue's webhook should have rejected this)",
    )]


# --------------------------------------------------------------------------------------------
# The formula


def aging_term(wait_seconds: float, settings: Settings) -> int:
    """Monotone in wait, constant from MAX_AGING_TIME on, changes only every AGING_STEP."""
    capped = min(max(wait_seconds, 0.0), settings.max_aging_time)
    stepped = math.floor(capped / settings.aging_step) * settings.aging_step
    return math.floor(settings.aging_coefficient * stepped + 1e-9)


def class_term(cls: PriorityClass, settings: Settings) -> int:
    return settings.class_weight(cls) * settings.priority_class_unit


def score(cls: PriorityClass, fairness: int, wait_seconds: float, settings: Settings) -> int:
    return class_term(cls, settings) + fairness + aging_term(wait_seconds, settings)


def combined_usage(
    current: Mapping[str, Mapping[str, float]], decayed: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """Per team and resource, the larger of current and decayed usage: last night's hog stays
    charged this morning, and a team that starts hogging now is charged at once (a decayed
    average alone would lag behind current usage by about a half-life)."""
    out: dict[str, dict[str, float]] = {}
    for team in set(current) | set(decayed):
        cur, old = current.get(team, {}), decayed.get(team, {})
        out[team] = {r: max(cur.get(r, 0.0), old.get(r, 0.0)) for r in set(cur) | set(old)}
    return out


# --------------------------------------------------------------------------------------------


def compute_plan(
    snapshot: ClusterSnapshot,
    settings: Settings,
    now: datetime,
    history: UsageHistory | None = None,
) -> Plan:
    """Decide every pending, active workload's priority and HAMi settings. Pure."""
    lq_to_cq = {(lq.namespace, lq.name): lq.cluster_queue for lq in snapshot.local_queues}
    jobs = {(j.namespace, j.name): j for j in snapshot.jobs}

    def owner_job(w: Workload) -> JobInfo | None:
        o = w.owner
        if o is None or o.kind != "Job":
            return None
        j = jobs.get((w.namespace, o.name))
        if j is None or (o.uid and j.uid and o.uid != j.uid):
            return None
        return j

    inventory, _ = gpu_inventory(snapshot.nodes, settings, now)
    card_mib = card_memory(inventory, settings)
    cap, _cap_source = capacity(snapshot, inventory)

    # Parser problems on a Workload travel with its decision (and leave it unchanged).
    plan_problems: list[InputProblem] = []
    parse_problems: dict[tuple[str, str], list[InputProblem]] = {}
    pending_keys = {(w.namespace, w.name) for w in snapshot.workloads if w.pending and w.active}
    for prob in snapshot.problems:
        o = prob.object
        if o is not None and o.kind == "Workload" and (o.namespace, o.name) in pending_keys:
            parse_problems.setdefault((o.namespace, o.name), []).append(prob)
        else:
            plan_problems.append(prob)
    warnings: list[str] = list(settings.warnings())

    # Usage of admitted (quota-reserved, unfinished) workloads, per team.
    current: dict[str, Vector] = {}
    pending: list[tuple[Workload, JobInfo | None, str]] = []
    teams_seen: set[str] = set()
    by_label = settings.team_source is TeamSource.LABEL
    for w in snapshot.workloads:
        if w.finished:
            continue
        # The owner Job matters for pending work (class annotations) and for label teams.
        job = owner_job(w) if (by_label or not w.quota_reserved) else None
        team = team_of(w, settings, job.labels if job else None)
        teams_seen.add(team)
        if w.quota_reserved:
            vec = current.setdefault(team, {})
            for name, q in admitted_usage(w, card_mib).items():
                vec[name] = vec.get(name, 0.0) + q
        elif w.active:
            pending.append((w, job, team))

    new_history: UsageHistory | None = None
    usage: Mapping[str, Mapping[str, float]] = current
    if settings.usage_half_life > 0:
        new_history = (history or UsageHistory()).advance(current, now, settings.usage_half_life)
        usage = combined_usage(current, new_history.usage)
        teams_seen.update(usage)

    teams: dict[str, TeamShare] = {
        t: team_share(t, usage.get(t, {}), cap, settings) for t in sorted(teams_seen)
    }
    total_weight = sum(team_weight(t, settings) for t in teams)
    fair_points = {
        t: fairness_term(ts.dominant_share, total_weight, settings) for t, ts in teams.items()
    }

    # Hot loop (10,000+ workloads): settings and per-class values read once.
    # Enum hashing is Python-level and slow: branch on identity instead of dict lookups.
    urgent, approved, normal = PriorityClass.URGENT, PriorityClass.APPROVED, PriorityClass.NORMAL
    term_u, term_a, term_n = (class_term(c, settings) for c in (urgent, approved,
                                                                 PriorityClass.NORMAL))
    weight_u, weight_a, weight_n = (settings.class_weight(c) for c in (urgent, approved,
                                                                       PriorityClass.NORMAL))
    max_wait = settings.max_aging_time
    step = settings.aging_step
    coef = settings.aging_coefficient
    hami_cache: dict[tuple[object, ...], HamiDecision | None] = {}
    rows: list[tuple[tuple[int, datetime, str], tuple[Any, ...]]] = []
    unknown_lq = 0
    for w, job, team in pending:
        cq = lq_to_cq.get((w.namespace, w.queue_name))
        if cq is None:
            unknown_lq += 1
        problems: list[InputProblem] = list(parse_problems.get((w.namespace, w.name), ()))

        ann = w.annotations
        if (not ann or ann.keys().isdisjoint(_POLICY_KEYS)) and (
            job is None or not job.annotations
            or job.annotations.keys().isdisjoint(_POLICY_KEYS)
        ):  # hot path: nothing to read, all defaults
            cls, override, current_boost = normal, None, None
            base = w.priority or 0
            blocking = bool(problems)
        else:
            cls, p = read_class(w, job)
            problems += p
            override, p = read_override(w, job)
            problems += p
            base, p = read_base(w)
            problems += p
            blocking = bool(problems)
            current_boost, p = read_current_boost(w)
            problems += p
        for prob, is_blocking in resource_problems(w, settings):
            problems.append(prob)
            blocking = blocking or is_blocking
        hami, p = decide_hami(w, job, cls, cq, settings, card_mib, hami_cache)
        if p:
            problems += p
            blocking = True

        if blocking:
            # Bad input: leave exactly what is there; rank by what Kueue sees now.
            planned = (w.priority or 0) + (current_boost or 0)
            args: tuple[Any, ...] = (
                w.key, w.uid, cq, team, base, w.priority, current_boost,
                current_boost or 0, w.priority if w.priority is not None else base,
                None, None, tuple(problems), True,
            )
        else:
            ts = teams[team]
            fair = fair_points[team]
            wait = (now - w.created).total_seconds()
            if wait < 0:
                wait = 0.0
            # = aging_term(wait, settings), inlined
            aging = math.floor(coef * (math.floor(min(wait, max_wait) / step) * step) + 1e-9)
            if cls is urgent:
                total, cweight = term_u + fair + aging, weight_u
            elif cls is approved:
                total, cweight = term_a + fair + aging, weight_a
            else:
                total, cweight = term_n + fair + aging, weight_n
            boost = total if override is None else override - base
            boost = INT32_MIN if boost < INT32_MIN else INT32_MAX if boost > INT32_MAX else boost
            planned = base + boost
            planned = (
                INT32_MIN if planned < INT32_MIN else INT32_MAX if planned > INT32_MAX else planned
            )
            breakdown = PriorityBreakdown(
                cls, cweight, team, ts.dominant_resource, ts.dominant_share,
                fair, wait, aging, override, boost,
            )
            args = (
                w.key, w.uid, cq, team, base, w.priority, current_boost, boost, planned,
                breakdown, hami, tuple(problems), False,
            )
        # Kueue's order inside a ClusterQueue: higher priority, then earlier creation, then UID.
        rows.append(((-planned, w.created, w.uid), args))

    rows.sort(key=lambda row: row[0])
    ranked: list[WorkloadDecision] = []
    position: dict[str | None, int] = {}
    for _, a in rows:
        r = position.get(a[2], 0)
        position[a[2]] = r + 1
        # Positional: key, uid, cluster_queue, team, rank, then the rest in field order.
        ranked.append(WorkloadDecision(a[0], a[1], a[2], a[3], r, *a[4:]))

    for queue in sorted(snapshot.cluster_queues, key=lambda c: c.name):
        if queue.preemption.can_evict:
            warnings.append(
                f"ClusterQueue {queue.name}: preemption withinClusterQueue="
                f"{queue.preemption.within_cluster_queue}, reclaimWithinCohort="
                f"{queue.preemption.reclaim_within_cohort}: raising a pending workload's priority "
                "can evict running workloads"
            )
        if queue.admission_fair_sharing:
            warnings.append(
                f"ClusterQueue {queue.name}: Admission Fair Sharing orders by LocalQueue usage "
                "before priority, so the planned order may not hold there"
            )
    if unknown_lq:
        warnings.append(
            f"{unknown_lq} pending workload(s) use a LocalQueue not in the snapshot "
            "(ClusterQueue unknown; ranked under '-')"
        )
    if not any(cap.get(r, 0) > 0 for r in settings.resource_weights):
        warnings.append("no capacity known for any weighted resource: all shares are 0")

    return Plan(
        now=now,
        decisions=tuple(ranked),
        teams=MappingProxyType(teams),
        problems=tuple(plan_problems),
        warnings=tuple(warnings),
        history=new_history,
    )
