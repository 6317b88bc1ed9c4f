"""The WDRF priority policy: one pure, deterministic function from a snapshot to a plan.

    boost = class_weight x PRIORITY_CLASS_UNIT                     (tier: urgent/approved/normal)
          + fairness(team)   in 0..FAIRNESS_POINTS, quantized      (2^-(U/S), Slurm classic)
          + aging(wait)      = floor(AGING_COEFFICIENT x step-floored min(wait, MAX_AGING_TIME))
    target priority = base + boost (clamped to int32); an admin override sets it outright.

With equal waits, classes never reorder (FAIRNESS_POINTS < class gap x unit, checked at load).
A normal workload can only be overtaken by workloads that arrived before it or less than
`Settings.overtake_window()` after it (while it has waited < MAX_AGING_TIME). See docs/policy.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType

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
    APPROVED_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
    ClusterSnapshot,
    InputProblem,
    JobInfo,
    PriorityClass,
    Workload,
)
from controller.hami import decide_hami
from controller.plan import Plan, PriorityBreakdown, TeamShare, WorkloadDecision

_UNSIGNED = re.compile(r"^[0-9]{1,10}$")
_SIGNED = re.compile(r"^-?[0-9]{1,10}$")


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
    sources = [(workload.ref, workload.annotations)]
    if job is not None:
        sources.append((job.ref, job.annotations))
    for ref, ann in sources:
        for key in (URGENT_ANNOTATION, APPROVED_ANNOTATION):
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
                ref, f"metadata.annotations[{key}]", val,
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
    sources = [(workload.ref, workload.annotations)]
    if job is not None:
        sources.append((job.ref, job.annotations))
    for ref, ann in sources:
        val = ann.get(PRIORITY_OVERRIDE_ANNOTATION)
        if val is None:
            continue
        if _UNSIGNED.match(val) and int(val) <= MAX_OVERRIDE:
            return int(val), []
        return None, [InputProblem(
            ref, f"metadata.annotations[{PRIORITY_OVERRIDE_ANNOTATION}]", val,
            f"expected a plain integer 0..{MAX_OVERRIDE} (no sign, exponent or spaces)",
        )]
    return None, []


def read_base(workload: Workload) -> tuple[int, list[InputProblem]]:
    """Base priority: `wdrf.x-k8s.io/base-priority` if present and valid, else spec.priority,
    else 0. An invalid base annotation is a problem: without the true base, writing spec
    priority would compound boosts."""
    val = workload.annotations.get(BASE_PRIORITY_ANNOTATION)
    if val is not None:
        if _SIGNED.match(val) and INT32_MIN <= int(val) <= INT32_MAX:
            return int(val), []
        return (workload.priority or 0), [InputProblem(
            workload.ref, f"metadata.annotations[{BASE_PRIORITY_ANNOTATION}]", val,
            "expected a signed int32 integer",
        )]
    return (workload.priority or 0), []


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

    plan_problems: list[InputProblem] = list(snapshot.problems)
    warnings: list[str] = list(settings.warnings())

    # Usage of admitted (quota-reserved, unfinished) workloads, per team.
    current: dict[str, Vector] = {}
    pending: list[tuple[Workload, JobInfo | None, str]] = []
    teams_seen: set[str] = set()
    for w in snapshot.workloads:
        if w.finished:
            continue
        job = owner_job(w)
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
        usage = new_history.usage
        teams_seen.update(usage)

    teams: dict[str, TeamShare] = {
        t: team_share(t, usage.get(t, {}), cap, settings) for t in sorted(teams_seen)
    }
    total_weight = sum(team_weight(t, settings) for t in teams)
    fair_points = {
        t: fairness_term(ts.dominant_share, total_weight, settings) for t, ts in teams.items()
    }

    decisions: list[tuple[tuple[int, datetime, str], dict[str, object]]] = []
    unknown_lq = 0
    for w, job, team in pending:
        cq = lq_to_cq.get((w.namespace, w.queue_name))
        if cq is None:
            unknown_lq += 1
        problems: list[InputProblem] = []
        blocking = False

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
        hami, p = decide_hami(w, job, cls, cq, settings, card_mib)
        if p:
            problems += p
            blocking = True

        current_effective = (w.priority or 0) + (current_boost or 0)
        wait = max((now - w.created).total_seconds(), 0.0)
        if blocking:
            fields: dict[str, object] = dict(
                key=w.key, uid=w.uid, cluster_queue=cq, team=team,
                base_priority=base, current_priority=w.priority, current_boost=current_boost,
                target_boost=current_boost or 0,
                target_priority=w.priority if w.priority is not None else base,
                breakdown=None, hami=None, problems=tuple(problems), leave_unchanged=True,
            )
            planned = current_effective
        else:
            ts = teams[team]
            fair = fair_points[team]
            aging = aging_term(wait, settings)
            total = class_term(cls, settings) + fair + aging
            boost = total if override is None else override - base
            boost = clamp_int32(boost)
            planned = clamp_int32(base + boost)
            fields = dict(
                key=w.key, uid=w.uid, cluster_queue=cq, team=team,
                base_priority=base, current_priority=w.priority, current_boost=current_boost,
                target_boost=boost, target_priority=planned,
                breakdown=PriorityBreakdown(
                    priority_class=cls, class_weight=settings.class_weight(cls), team=team,
                    dominant_resource=ts.dominant_resource, dominant_share=ts.dominant_share,
                    fairness_term=fair, wait_seconds=wait, aging_term=aging,
                    override=override, score=boost,
                ),
                hami=hami, problems=tuple(problems), leave_unchanged=False,
            )
        # Kueue's order inside a ClusterQueue: higher priority, then earlier creation, then UID.
        decisions.append(((-planned, w.created, w.uid), fields))

    decisions.sort(key=lambda kd: kd[0])
    ranked: list[WorkloadDecision] = []
    position: dict[object, int] = {}
    for _, f in decisions:
        r = position.get(f["cluster_queue"], 0)
        position[f["cluster_queue"]] = r + 1
        ranked.append(WorkloadDecision(rank=r, **f))  # type: ignore[arg-type]

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
