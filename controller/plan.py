"""The plan: what one cycle decides, per Workload, and why.

Produced by `controller.policy.compute_plan(snapshot, settings, now, history)`, a pure function.
Consumed by the dry-run renderer, `explain`, the live applier and the trace simulator.

Each decision carries `terms`, the value of the `wdrf.x-k8s.io/priority-terms` annotation the
live controller writes in the same patch as the priority: `key=value` words saying why the
Workload has its priority. `change_is_eventful` reads some of them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TypeVar

from controller.domain import (
    InputProblem,
    PriorityClass,
    PriorityMode,
    Resources,
    fast_init,
    pool_key,
)
from controller.usage import UsageHistory
from controller.workload import TERMS_VERSION, Terms, change_is_eventful

__all__ = [
    "ADMITTED_STATES",
    "EXPOSED_STATE",
    "GUARD_STATE",
    "TERMS_VERSION",
    "Exposure",
    "ExposureReason",
    "HamiDecision",
    "Plan",
    "PriorityBreakdown",
    "PriorityMode",
    "TeamShare",
    "WorkloadDecision",
    "change_is_eventful",
    "current_positions",
    "head_first",
    "lowers_admitted_value",
    "parse_terms",
    "pool_of",
    "positions_right",
    "written_while_admitted",
]


@fast_init
@dataclass(frozen=True, slots=True)
class TeamShare:
    team: str
    usage: Resources  # admitted usage (+ decayed history when enabled), GPU-equivalents for GPUs
    capacity: Resources
    shares: Mapping[str, float]  # resource (flavor:resource when flavored) -> weighted share
    dominant_resource: str | None
    dominant_share: float  # weighted dominant share, >= 0
    pool: str = ""  # the cohort (or lone ClusterQueue) whose capacity the share is against
    level: int = 0  # fairness level after hysteresis (0..FAIRNESS_LEVELS)
    fairness_term: int = 0  # level x FAIRNESS_POINTS / FAIRNESS_LEVELS
    # U/S: dominant share of the pool over the team's entitlement (weight / W), i.e. weighted
    # dominant share x W; 1.0 = exactly its entitlement. The exponent of the fairness factor.
    usage_over_entitlement: float = 0.0


class ExposureReason(enum.Enum):
    """Why an admitted Workload's guard is lowered."""

    RECLAIM = "reclaim"  # its team is over its entitlement; an under-served team waits
    TEAM_APPROVAL = "team-approval"  # its own team lead approved other work of the team


@dataclass(frozen=True, slots=True)
class Exposure:
    """An admitted Workload whose priority is lowered just below the pending Workloads that
    may preempt it, and above every other pending Workload: Kueue's preemption then takes it
    for those only (docs/policy.md, "Reclaim")."""

    reason: ExposureReason
    for_teams: tuple[str, ...]  # the teams whose pending Workloads may preempt it
    over_entitlement: float  # its team's usage over entitlement (U/S) in the pool


@fast_init
@dataclass(frozen=True, slots=True)
class PriorityBreakdown:
    """Why a Workload gets its priority: every term of the encoding (docs/policy.md)."""

    priority_class: PriorityClass
    class_weight: int
    class_term: int  # class weight x PRIORITY_CLASS_UNIT: the floor of the class band
    team: str
    pool: str
    dominant_resource: str | None
    dominant_share: float
    fairness_level: int
    fairness_term: int
    queued_since: datetime  # creation, or the last eviction (REQUEUE_TIMESTAMP)
    reference: datetime  # aging reference (the last rebase instant)
    aging_term: int  # AGING_COEFFICIENT x clamp(reference + period - queued_since, 0, cap + period)
    base: int  # base priority as read (spec.priority / base-priority annotation)
    base_term: int  # the base's contribution: BASE_PRIORITY_CAP + clamp(base, +-cap)
    override: int | None  # wdrf.x-k8s.io/priority-override, when valid
    priority: int  # the effective priority Kueue sees: what all the terms add up to
    guard: bool = False  # admitted: the class guard value, not the pending encoding
    clamped: str = ""  # why the value was clamped (int32 / boost range), empty when not
    # Pending: the team's weighted dominant share now; `dominant_share` is the one the team
    # will have when this Workload's turn comes (its usage and its Workloads queued ahead of
    # this one in the pool), which ranks it (progressive filling).
    team_share: float = 0.0
    # Pending, team-scoped approval: the wait is credited from its team's longest-waiting
    # Workload of the pool when that one waited longer (it takes the team's head).
    credited_since: datetime | None = None
    exposure: Exposure | None = None  # admitted: the lowered guard, when it is lowered

    def wait_seconds(self, now: datetime) -> float:
        """How long it has waited at `now` (the plan's clock). Not a field: a decision does not
        move with the clock, so a pool whose inputs did not change keeps its decisions."""
        return max((now - self.queued_since).total_seconds(), 0.0)



@fast_init
@dataclass(frozen=True, slots=True)
class HamiDecision:
    """HAMi settings for the pod template / gated pods of a pending workload."""

    node_policy: str | None = None  # binpack | spread
    gpu_policy: str | None = None  # binpack | spread | topology-aware | ...
    gpucores: int | None = None  # from wdrf.x-k8s.io/gpu-fraction
    gpumem_percentage: int | None = None
    reason: str = ""  # where each value came from
    # Human-readable differences from what the pod template has now ("key: old -> new");
    # empty when applying the decision would change nothing.
    changes: tuple[str, ...] = ()
    # Why the GPU fraction must not be written ("" = it may): Kueue would never admit the
    # Workload, its ClusterQueue does not cover the resource (`controller.hami.check_fraction`).
    fraction_blocked: str = ""

    @property
    def annotations(self) -> Mapping[str, str]:
        out: dict[str, str] = {}
        if self.node_policy:
            out["hami.io/node-scheduler-policy"] = self.node_policy
        if self.gpu_policy:
            out["hami.io/gpu-scheduler-policy"] = self.gpu_policy
        return out


@fast_init
@dataclass(frozen=True, slots=True)
class WorkloadDecision:
    key: str  # namespace/name
    uid: str
    cluster_queue: str | None
    team: str
    rank: int  # planned admission position within its ClusterQueue (0 = next); -1 admitted
    base_priority: int  # priority before this controller touched it
    current_priority: int | None  # spec.priority now
    current_boost: int | None  # priority-boost annotation now
    target_boost: int  # boost mode: annotation value (= target_priority - base, in int32)
    target_priority: int  # spec mode: spec.priority value; the effective priority in both
    breakdown: PriorityBreakdown | None
    hami: HamiDecision | None = None
    problems: tuple[InputProblem, ...] = ()
    # True when bad input means this workload must be left exactly as it is.
    leave_unchanged: bool = False
    # A decision for an admitted Workload whose ClusterQueue's cohort can preempt: it gets the
    # class guard priority, so Kueue's preemption only sees class differences. Only the
    # priority is written (no HAMi change).
    admitted: bool = False
    # wdrf.x-k8s.io/priority-terms to write with the priority ("" = write nothing).
    terms: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    now: datetime
    decisions: tuple[WorkloadDecision, ...]  # pending in planned admission order, then admitted
    # Per team, its share in the pool where it is largest (summary for metrics and tables).
    teams: Mapping[str, TeamShare] = field(default_factory=lambda: MappingProxyType({}))
    problems: tuple[InputProblem, ...] = ()
    warnings: tuple[str, ...] = ()  # e.g. ClusterQueues where AFS reorders
    # Decayed usage after this cycle; the live controller stores it and passes it to the next
    # compute_plan. None when USAGE_HALF_LIFE is 0.
    history: UsageHistory | None = None
    # Every (pool, team) share: a team spread over several pools is charged in each.
    pool_shares: Mapping[tuple[str, str], TeamShare] = field(
        default_factory=lambda: MappingProxyType({})
    )
    reference: datetime | None = None  # the aging reference of this plan (last rebase)

    @property
    def pending(self) -> tuple[WorkloadDecision, ...]:
        return tuple(d for d in self.decisions if not d.admitted)


# ---------------------------------------------------------------------------------------------
# The priority-terms annotation (controller.workload.Terms)


def parse_terms(text: str | None) -> dict[str, str]:
    """The terms this controller wrote (`Terms.parse`), {} when absent or of another version."""
    terms = Terms.parse(text)
    return dict(terms) if terms.current else {}


# The terms `state` of a value written while the Workload was admitted: its guard, or its
# guard lowered to expose it (per `ExposureReason`). Pending values have no `state`.
GUARD_STATE = "admitted"
EXPOSED_STATE: Mapping[ExposureReason, str] = MappingProxyType({
    ExposureReason.RECLAIM: "reclaimable", ExposureReason.TEAM_APPROVAL: "yielding"})
ADMITTED_STATES = frozenset({GUARD_STATE, *EXPOSED_STATE.values()})


def written_while_admitted(text: str | None) -> bool:
    """Whether terms are those of a value written while the Workload was admitted (a guard or
    an exposure). On a pending Workload: evicted since, and not written again yet."""
    return text is not None and " state=" in text and parse_terms(text).get(
        "state") in ADMITTED_STATES


def lowers_admitted_value(d: WorkloadDecision, old_terms: str | None) -> bool:
    """Whether writing a pending decision lowers a value written while its Workload was
    admitted (`written_while_admitted`): the plan counted that Workload as a threat at its
    target only (`policy.threat_value`), so this write must land before the guards and
    exposures of its pool."""
    return (not d.admitted and not d.leave_unchanged and d.target_priority < kueue_value(d)
            and written_while_admitted(old_terms))




# ---------------------------------------------------------------------------------------------
# Head-first writes and convergence

HEAD_POSITIONS = 10  # a ClusterQueue's head: the positions Kueue will admit from soon


def kueue_value(d: WorkloadDecision) -> int:
    """The effective priority Kueue orders by now (before this cycle's writes)."""
    return (d.current_priority or 0) + (d.current_boost or 0)


def current_positions(pending: Iterable[WorkloadDecision]) -> dict[str, int]:
    """Each pending Workload's position in Kueue's current order of its ClusterQueue: the
    highest effective priority first, then the longest queued (creation or last eviction),
    then the UID (the plan's own tie-break, `policy.order`)."""
    by_queue: dict[str | None, list[WorkloadDecision]] = {}
    for d in pending:
        by_queue.setdefault(d.cluster_queue, []).append(d)
    out: dict[str, int] = {}
    for queue in by_queue.values():
        queue.sort(key=_kueue_order)
        out.update((d.key, i) for i, d in enumerate(queue))
    return out


def _kueue_order(d: WorkloadDecision) -> tuple[int, float, str]:
    b = d.breakdown
    return -kueue_value(d), b.queued_since.timestamp() if b is not None else math.inf, d.uid


def positions_right(pending: Sequence[WorkloadDecision], current: Mapping[str, int]) -> int:
    """How many leading positions of one ClusterQueue's current order are the plan's:
    `pending` are its pending decisions, `current` their `current_positions`."""
    planned = sorted(pending, key=lambda d: d.rank)
    right = 0
    for i, d in enumerate(planned):
        if current.get(d.key) != i:
            break
        right = i + 1
    return right


def pool_of(d: WorkloadDecision) -> str:
    """The pool (cohort or lone ClusterQueue) a decision's priority competes in."""
    return d.breakdown.pool if d.breakdown is not None else pool_key(d.cluster_queue or "-")


T = TypeVar("T")


def head_first(
    writes: Sequence[T], decision: Callable[[T], WorkloadDecision],
    decisions: Sequence[WorkloadDecision],
) -> list[T]:
    """Priority writes of one plan in the order Kueue will use them, for when the budget is
    short: each pending write at its slot, the nearer to the head of its ClusterQueue of its
    planned position and its position in Kueue's current order (a demotion of what Kueue
    would admit next matters as much as the raise of what it should); slot by slot across
    ClusterQueues (slot 0 of every queue, then slot 1, ...). An admitted Workload's guard
    goes just before the first pending write of its pool, or first when the pool has none
    (values already written may outrank it): a guard must land before the raises it protects
    from (the applier sends the guards of a budget before the rest). `decisions` is the whole
    plan (Kueue's current order is over every pending Workload, written or not)."""
    queues = {decision(w).cluster_queue for w in writes if not decision(w).admitted}
    current = current_positions(d for d in decisions if not d.admitted
                                and d.cluster_queue in queues)
    slots: list[int] = []
    first_in_pool: dict[str, int] = {}
    for w in writes:
        d = decision(w)
        if d.admitted:
            slots.append(-1)
            continue
        slot = min(d.rank, current.get(d.key, d.rank))
        slots.append(slot)
        pool = pool_of(d)
        first_in_pool[pool] = min(first_in_pool.get(pool, slot), slot)
    keyed = []
    for i, w in enumerate(writes):
        d = decision(w)
        if d.admitted:
            keyed.append(((first_in_pool.get(pool_of(d), -1), 0, d.cluster_queue or "", i), w))
        else:
            keyed.append(((slots[i], 1, d.cluster_queue or "", i), w))
    keyed.sort(key=lambda kw: kw[0])
    return [w for _, w in keyed]
