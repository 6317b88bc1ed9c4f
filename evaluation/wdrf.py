"""WDRF in the Kueue model: `controller.policy.compute_plan` on a snapshot of the whole simulated
cluster, applied as the live controller applies it.

Every evaluated controller cycle (one `LOOP_INTERVAL` tick after anything changed, see
`KueueSim._next_tick`) builds a `ClusterSnapshot` of the Kueue model: its ClusterQueues (with the
model's preemption settings, cohort and Fair Sharing weight), one LocalQueue per team, every
pending Workload (with `last_eviction` after an eviction) and every admitted one (with
`status.admission` on its ClusterQueue). New Workloads carry their class stand-in, as the
recommended setup gives them at creation (manifests/admission/class-priority.yaml: the class's
WorkloadPriorityClass, whose value Kueue copies into `spec.priority`), so Kueue orders and
preempts by it before the controller's first cycle writes anything (urgent work at once, not
up to a `LOOP_INTERVAL` later). The plan's decisions, pending *and* admitted, are then written
back onto the simulated Workloads by the live controller's own patch
(`controller.workload.priority_patch` in boost mode: the `kueue.x-k8s.io/priority-boost`
annotation, with `wdrf.x-k8s.io/priority-terms` when the priority is written or what people act
on changed), and Kueue's model orders and preempts by the written effective priority. An
admitted Workload the plan does not decide about keeps the priority it had when admitted (Kueue
keeps what is written). A write is one patch of one Workload, counted when the live controller
would send one.

Only the plan's public outputs are used (`target_priority`, `target_boost`, `terms`, `admitted`,
`hami`), so this follows the policy whatever its formula.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import TypedDict

from controller.config import Settings
from controller.domain import (
    APPROVED_ANNOTATION,
    GPU,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    URGENT_ANNOTATION,
    Admission,
    ClusterQueue,
    ClusterSnapshot,
    Container,
    KueueApiVersion,
    LocalQueue,
    PodSet,
    Preemption,
    PriorityClass,
    PriorityMode,
    ResourceQuota,
    Workload,
    frozen_resources,
)
from controller.plan import parse_terms
from controller.policy import PlanMemo, compute_plan
from controller.workload import PriorityTarget, effective_priority, priority_patch
from evaluation.kueue import DONE, PENDING, PREEMPTED, KueueSim, Policy
from evaluation.policies import describe_settings
from evaluation.trace import PCT, SimJob

COHORT_NAME = "all-teams"
FLAVOR = "default-flavor"


class _StandIn(TypedDict):
    priority: int | None
    priority_class_name: str | None
    workload_priority_class: bool


def write_cause(old: str | None, new: str) -> str:
    """What one write was for, from the terms annotation before and after: `new` (a pending
    Workload's first value), `guard`, `unexpose` (an exposure ended: guarded again),
    `expose` (reclaim or team approval), `re-expose` (exposed again, to other teams or at
    another value), `requeue` (evicted: pending again), or for a pending Workload rewritten:
    `class`, `since` (its queued-since or approval credit), `rebase`, `nudge` (a taker's
    point), `level-up`, `level-down`, `other`."""
    if not old:
        return "new"
    before, after = parse_terms(old), parse_terms(new)
    state, was = after.get("state"), before.get("state")
    if state == "admitted":
        return "unexpose" if was not in (None, "admitted") else "guard"
    if state is not None:
        return "re-expose" if was not in (None, "admitted") else "expose"
    if was is not None:
        return "requeue"
    for key, cause in (("class", "class"), ("since", "since"), ("ref", "rebase"),
                       ("preempts", "nudge")):
        if before.get(key) != after.get(key):
            return cause
    lb, la = before.get("level", ""), after.get("level", "")
    if lb != la:
        b, a = lb.partition("/")[0], la.partition("/")[0]
        if b.isdigit() and a.isdigit():
            return "level-up" if int(a) > int(b) else "level-down"
    return "other"


class WdrfKueue(Policy):
    """The controller's `compute_plan` every cycle on the Kueue model's whole cluster."""

    controller = True

    def __init__(self, settings: Settings, epoch: datetime, name: str = "WDRF",
                 aggregate_admitted: bool = True, apply_hami: bool = False,
                 stand_ins: bool = True) -> None:
        super().__init__()
        self.settings = settings
        self.guards = {c: settings.guard(c) for c in PriorityClass}
        # The class stand-in a new Workload carries (`stand_ins=False`: none, spec.priority
        # absent until the controller's first cycle).
        self.stand_ins = {c: settings.stand_in_value(c) for c in PriorityClass} if stand_ins \
            else None
        # Exposures (reclaim, team-scoped approval) pick single admitted Workloads by how long
        # they ran: a summary of several cannot stand for them, so the plan sees each one.
        self.exposes = settings.reclaim_enabled or settings.team_scoped_approval()
        self.aggregate_admitted = aggregate_admitted and not self.exposes
        # The plan's HAMi node/GPU policy per Workload is applied only when asked: the
        # evaluation gives every policy the same packing unless packing is the point of a row.
        self.apply_hami = apply_hami
        self.epoch = epoch
        self.name = name
        self.description = "controller.policy.compute_plan every LOOP_INTERVAL, " + (
            describe_settings(settings)
        ) + ("; the plan's HAMi packing applied" if apply_hami else "")
        self._init_state()

    def _init_state(self) -> None:
        self.prio: dict[int, int] = {}
        self.wl: dict[int, Workload] = {}
        self.by_key: dict[str, int] = {}
        self.hami: dict[int, tuple[str, str]] = {}
        self.history: object | None = None
        # What the last plan worked out (the same plan, faster: most Workloads are the same
        # objects from one tick to the next).
        self.memo = PlanMemo()
        self.plan_calls = 0
        self.plan_seconds = 0.0
        self.plan_workloads = 0
        self.problems = 0
        self.cq_objs: tuple[ClusterQueue, ...] = ()
        self.lqs: tuple[LocalQueue, ...] = ()
        self.dirty = True
        self.agg_cache: dict[tuple[str, str, PriorityClass], tuple[int, Workload]] = {}
        self.applied: dict[int, PriorityTarget] = {}
        # Reclaim: when a Workload passes MIN_RUNTIME, and when a preemption leaves the pool's
        # hourly budget, the plan may decide differently with nothing else changing.
        self.clock_events: list[float] = []

    def reset(self, sim: KueueSim) -> None:

        super().reset(sim)
        self._init_state()
        if not isinstance(sim, KueueSim):
            raise TypeError("WdrfKueue runs in the Kueue model (evaluation.kueue)")
        k = sim.k
        cohort = COHORT_NAME if len(sim.cqs) > 1 else None
        pre = Preemption(
            within_cluster_queue=k.within_cluster_queue,
            reclaim_within_cohort=k.reclaim_within_cohort,
            borrow_within_cohort=k.borrow_within_cohort,
        )
        self.cq_objs = tuple(
            ClusterQueue(
                name=cq.name,
                api_version=KueueApiVersion.V1BETA2,
                quotas=(ResourceQuota(FLAVOR, GPU, Decimal(cq.nominal) / PCT),),
                cohort=cohort,
                queueing_strategy=k.queueing_strategy,
                preemption=pre,
                fair_sharing_weight=Decimal(str(cq.weight)) if k.fair_sharing else None,
            )
            for cq in sim.cqs.values()
        )
        self.lqs = tuple(
            LocalQueue(namespace=t, name="default", cluster_queue=sim.cq_of_team[t])
            for t in sim.teams
        )

    # -- Workload objects ----------------------------------------------------------------------
    def _new_workload(self, job: SimJob) -> Workload:
        res: dict[str, Decimal] = {GPU: Decimal(job.gpus_per_pod)}
        if job.fractional:
            res[GPUCORES] = Decimal(job.pct)
            res[GPUMEM_PERCENTAGE] = Decimal(job.pct)
        ann: dict[str, str] = {}
        if job.cls is PriorityClass.URGENT:
            ann[URGENT_ANNOTATION] = "true"
        elif job.cls is PriorityClass.APPROVED:
            ann[APPROVED_ANNOTATION] = "true"
        name = f"job-{job.job_id}"
        self.by_key[f"{job.team}/{name}"] = job.job_id
        return Workload(
            namespace=job.team,
            name=name,
            uid=f"uid-{job.job_id:07d}",
            api_version=KueueApiVersion.V1BETA2,
            queue_name="default",
            created=self.epoch + timedelta(seconds=job.submit),
            pod_sets=(PodSet("main", job.pods, (Container("main", frozen_resources(res)),)),),
            annotations=MappingProxyType(ann),
            **self._stand_in(job.cls),
        )

    def _stand_in(self, cls: PriorityClass) -> _StandIn:
        """spec.priority and the WorkloadPriorityClass Kueue gives a Workload of `cls`."""
        if self.stand_ins is None:
            return _StandIn(priority=None, priority_class_name=None,
                            workload_priority_class=False)
        return _StandIn(priority=self.stand_ins[cls], priority_class_name=f"wdrf-{cls.value}",
                        workload_priority_class=True)

    def priority(self, job: SimJob) -> int:
        return self.prio.get(job.job_id, 0)

    def packing(self, job: SimJob) -> tuple[str, str]:
        return self.hami.get(job.job_id) or super().packing(job)

    def on_arrival(self, job: SimJob, now: float) -> None:
        w = self.wl[job.job_id] = self._new_workload(job)
        if w.priority:
            self.prio[job.job_id] = w.priority  # Kueue orders by the stand-in at once
        self.dirty = True

    def on_admit(self, job: SimJob, now: float) -> None:

        sim = self.sim
        assert isinstance(sim, KueueSim)
        w = self.wl[job.job_id]
        usage = {GPU: Decimal(job.pods * job.gpus_per_pod)}
        # Kueue sets QuotaReserved=True now and resets a Preempted=True condition to False
        # (reason QuotaReserved, this time), so the parsed Workload has reserved_since = now,
        # no preempted_at, and preemption_cleared_at = now if it had been preempted.
        self.wl[job.job_id] = replace(
            w, quota_reserved=True, admitted=True,
            admission=Admission(sim.cq_of_team[job.team], frozen_resources(usage),
                                MappingProxyType({GPU: FLAVOR})),
            reserved_since=self.epoch + timedelta(seconds=now), preempted_at=None,
            preemption_cleared_at=(self.epoch + timedelta(seconds=now) if w.preempted_at
                                   else w.preemption_cleared_at),
        )
        if self.settings.reclaim_enabled:
            heapq.heappush(self.clock_events, now + self.settings.min_runtime)
            if w.preempted_at is not None:  # the budget counts it an hour from now
                heapq.heappush(self.clock_events, now + 3600.0)
        self.dirty = True

    def on_release(self, job: SimJob, now: float) -> None:

        self.dirty = True
        if self.sim.state[job.job_id] == DONE:
            jid = job.job_id
            del self.wl[jid]
            self.prio.pop(jid, None)
            self.hami.pop(jid, None)
            self.applied.pop(jid, None)

    def on_evict(self, job: SimJob, now: float, reason: str) -> None:

        w = self.wl[job.job_id]
        at = self.epoch + timedelta(seconds=now)
        self.wl[job.job_id] = replace(
            w, quota_reserved=False, admitted=False, admission=None, last_eviction=at,
            reserved_since=None, preempted_at=at if reason == PREEMPTED else None,
        )
        if self.settings.reclaim_enabled and reason == PREEMPTED:
            heapq.heappush(self.clock_events, now + 3600.0)
        self.dirty = True

    # -- the controller cycle ------------------------------------------------------------------
    def _aggregate(self, team: str, cq: str, cls: PriorityClass, used: int) -> Workload:
        """One admitted Workload standing for a team's guarded admitted work of one class in
        one ClusterQueue (it carries the guard, as they do): `used` GPU-percent as `used` GPUs
        at 1 % each (GPU-equivalents exact)."""
        key = (team, cq, cls)
        cached = self.agg_cache.get(key)
        if cached is not None and cached[0] == used:
            return cached[1]
        res = {GPU: Decimal(used), GPUCORES: Decimal(1), GPUMEM_PERCENTAGE: Decimal(1)}
        stand_in = self._stand_in(cls)  # as its members: the same base, boost and guard
        ann = {KUEUE_PRIORITY_BOOST_ANNOTATION: str(
            self.guards[cls] - (stand_in["priority"] or 0))}
        if cls is PriorityClass.URGENT:
            ann[URGENT_ANNOTATION] = "true"
        elif cls is PriorityClass.APPROVED:
            ann[APPROVED_ANNOTATION] = "true"
        name = f"admitted-{cls.value}"
        w = Workload(
            namespace=team, name=name, uid=f"aggregate-{team}-{cq}-{cls.value}",
            api_version=KueueApiVersion.V1BETA2, queue_name="default", created=self.epoch,
            pod_sets=(PodSet("main", 1, (Container("main", frozen_resources(res)),)),),
            quota_reserved=True, admitted=True,
            admission=Admission(cq, frozen_resources({GPU: Decimal(used)}),
                                MappingProxyType({GPU: FLAVOR})),
            annotations=MappingProxyType(ann),
            **stand_in,
        )
        self.agg_cache[key] = (used, w)
        return w

    def tick(self, now: float) -> bool:

        sim = self.sim
        assert isinstance(sim, KueueSim)
        groups: dict[str, list[int]] = {}
        if self.aggregate_admitted:
            workloads: list[Workload] = []
            sums: dict[tuple[str, str, PriorityClass], list[int]] = {}
            for jid, w in self.wl.items():
                job = sim.jobs[jid]
                if sim.state[jid] == PENDING or self.prio.get(jid) != self.guards[job.cls]:
                    workloads.append(w)  # pending, or admitted and not (yet) guarded
                else:
                    sums.setdefault((job.team, sim.cq_of_team[job.team], job.cls), []).append(jid)
            for (team, cq, cls), members in sums.items():
                agg = self._aggregate(team, cq, cls, sum(sim.jobs[j].need for j in members))
                workloads.append(agg)
                groups[agg.key] = members
        else:
            workloads = list(self.wl.values())
        snapshot = ClusterSnapshot(
            workloads=tuple(workloads), cluster_queues=self.cq_objs, local_queues=self.lqs,
        )
        t0 = time.perf_counter()
        plan = compute_plan(snapshot, self.settings, self.epoch + timedelta(seconds=now),
                            self.history, self.memo)  # type: ignore[arg-type]
        self.plan_seconds += time.perf_counter() - t0
        self.plan_calls += 1
        self.plan_workloads += len(snapshot.workloads)
        self.history = plan.history
        changed = False
        for d in plan.decisions:
            if d.leave_unchanged:
                self.problems += 1
                continue
            target = PriorityTarget(d.base_priority, d.target_priority, d.target_boost, d.terms)
            group = groups.get(d.key)
            members = group if group is not None else [self.by_key[d.key]]
            for jid in members:
                changed |= self._apply(jid, target, now)
                if group is None and self.apply_hami and d.hami is not None and (
                    d.hami.node_policy or d.hami.gpu_policy
                ):
                    default = super().packing(sim.jobs[jid])
                    self.hami[jid] = (d.hami.node_policy or default[0],
                                      d.hami.gpu_policy or default[1])
        self.dirty = False
        return changed

    def _apply(self, jid: int, target: PriorityTarget, now: float) -> bool:
        """Patch the simulated Workload as the live controller would; True when its effective
        priority changed."""
        if self.applied.get(jid) == target:
            return False  # written already: nothing to patch, priority unchanged
        self.applied[jid] = target
        w = self.wl[jid]
        patch = priority_patch(_wire(w), PriorityMode.BOOST, target)
        if patch is not None:
            cause = write_cause(w.annotations.get(PRIORITY_TERMS_ANNOTATION), target.terms)
            w = replace(w, annotations=MappingProxyType(patch.annotations_after(w.annotations)))
            self.wl[jid] = w
            self.writes += 1
            self.write_times.append(now)
            self.job_writes[jid] += 1
            counts = self.job_write_causes.get(cause)
            if counts is None:
                counts = self.job_write_causes[cause] = [0] * len(self.job_writes)
            counts[jid] += 1
        prio = effective_priority(_wire(w))
        if self.prio.get(jid, 0) != prio:
            self.prio[jid] = prio
            return True
        return False

    def next_change(self, now: float) -> float:
        """Without decayed usage the plan moves only with the cluster (a new, admitted, evicted
        or finished Workload), at `MAX_AGING_TIME` and at a rebase: visit one tick an hour as
        well, so clock-driven changes are seen within the hour. With reclaim, also when an
        admitted Workload passes MIN_RUNTIME and when a preemption leaves the hourly budget."""
        if self.settings.usage_half_life > 0 or self.dirty:
            return now
        events = self.clock_events
        while events and events[0] <= now:
            heapq.heappop(events)
        return min(now + 3600.0, events[0]) if events else now + 3600.0

    def extra(self) -> Mapping[str, float]:
        return {
            "plan_calls": self.plan_calls,
            "plan_seconds": self.plan_seconds,
            "plan_ms_mean": 1000 * self.plan_seconds / self.plan_calls if self.plan_calls else 0.0,
            "plan_workloads_mean": (
                self.plan_workloads / self.plan_calls if self.plan_calls else 0.0
            ),
            "problems": self.problems,
        }


def _wire(w: Workload) -> dict[str, object]:
    """What the live controller's patch reads of a simulated Workload: its identity, its
    annotations and spec.priority (its class stand-in's value, when it has one)."""
    out: dict[str, object] = {"metadata": {"namespace": w.namespace, "name": w.name,
                                           "uid": w.uid, "annotations": dict(w.annotations)}}
    if w.priority is not None:
        out["spec"] = {"priority": w.priority}
    return out
