"""The plan: what one cycle decides, per pending workload, and why.

Produced by `controller.policy.compute_plan(snapshot, settings, now, history)`, a pure function.
Consumed by the dry-run renderer, `explain`, the live applier and the trace simulator.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING

from controller.domain import InputProblem, PriorityClass, Resources

if TYPE_CHECKING:
    from controller.accounting import UsageHistory


class PriorityMode(enum.Enum):
    BOOST = "boost"  # kueue.x-k8s.io/priority-boost annotation (Kueue PriorityBoost gate)
    SPEC = "spec"  # spec.priority, base remembered in wdrf.x-k8s.io/base-priority
    AUTO = "auto"  # boost when the gate is on, else spec (resolved by the live controller)


@dataclass(frozen=True, slots=True)
class TeamShare:
    team: str
    usage: Resources  # admitted usage (+ decayed history when enabled), GPU-equivalents for GPUs
    capacity: Resources
    shares: Mapping[str, float]  # resource -> weighted share
    dominant_resource: str | None
    dominant_share: float  # weighted dominant share, >= 0


@dataclass(frozen=True, slots=True)
class PriorityBreakdown:
    """Why a workload gets its priority: every term of the formula."""

    priority_class: PriorityClass
    class_weight: int
    team: str
    dominant_resource: str | None
    dominant_share: float
    fairness_term: int
    wait_seconds: float
    aging_term: int
    override: int | None  # wdrf.x-k8s.io/priority-override, when valid
    score: int  # the boost: what the policy adds on top of the base priority


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

    @property
    def annotations(self) -> Mapping[str, str]:
        out: dict[str, str] = {}
        if self.node_policy:
            out["hami.io/node-scheduler-policy"] = self.node_policy
        if self.gpu_policy:
            out["hami.io/gpu-scheduler-policy"] = self.gpu_policy
        return out


@dataclass(frozen=True, slots=True)
class WorkloadDecision:
    key: str  # namespace/name
    uid: str
    cluster_queue: str | None
    team: str
    rank: int  # planned admission position within its ClusterQueue (0 = next)
    base_priority: int  # priority before this controller touched it
    current_priority: int | None  # spec.priority now
    current_boost: int | None  # priority-boost annotation now
    target_boost: int  # boost mode: annotation value
    target_priority: int  # spec mode: spec.priority value (= base + boost, clamped to int32)
    breakdown: PriorityBreakdown | None
    hami: HamiDecision | None = None
    problems: tuple[InputProblem, ...] = ()
    # True when bad input means this workload must be left exactly as it is.
    leave_unchanged: bool = False

    @property
    def effective_target(self) -> int:
        return self.target_priority


@dataclass(frozen=True, slots=True)
class Plan:
    now: datetime
    decisions: tuple[WorkloadDecision, ...]  # sorted by planned admission order
    teams: Mapping[str, TeamShare] = field(default_factory=lambda: MappingProxyType({}))
    problems: tuple[InputProblem, ...] = ()
    warnings: tuple[str, ...] = ()  # e.g. ClusterQueues where boosts can preempt or AFS reorders
    # Decayed usage after this cycle (controller.accounting.UsageHistory); the live controller
    # stores it and passes it to the next compute_plan. None when USAGE_HALF_LIFE is 0.
    history: UsageHistory | None = None
