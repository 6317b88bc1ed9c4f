"""The policies compared: Kueue baselines as models, and WDRF through the controller's own code.

- FIFO: Kueue BestEffortFIFO with every workload at the same priority (creation time only).
- Static classes: urgent/approved/normal as fixed WorkloadPriorityClass values, no fairness or
  aging (Kueue with three priority classes).
- AFS model: Kueue Admission Fair Sharing: LocalQueues (teams) ordered by decayed usage
  (sampled every `sampling` seconds, half-life `half_life`, plus an entry penalty at admission),
  then by priority class, then creation time.
- DRF (ideal): progressive filling by unweighted dominant share, re-computed after every
  admission inside the scheduler (Volcano's `drf` plugin); no classes, no aging. An idealised
  baseline: no controller loop, no API writes.
- WDRF: `controller.policy.compute_plan` every LOOP_INTERVAL on a `ClusterSnapshot` built from
  the simulated cluster; Kueue then orders by the plan's target priority, then creation time.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeAlias

from controller.accounting import UsageHistory
from controller.config import SETTING_FIELDS, Settings
from controller.domain import (
    APPROVED_ANNOTATION,
    GPU,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    URGENT_ANNOTATION,
    Admission,
    ClusterQueue,
    ClusterSnapshot,
    Container,
    KueueApiVersion,
    LocalQueue,
    PodSet,
    PriorityClass,
    ResourceQuota,
    Workload,
    frozen_resources,
)
from controller.plan import Plan
from controller.policy import compute_plan
from controller.sim.trace import PCT, SimJob

if TYPE_CHECKING:
    from controller.sim.engine import Key, Simulation
    from controller.sim.kueue import KueueSim

    AnySim: TypeAlias = Simulation | KueueSim

STATIC_PRIORITY = {PriorityClass.URGENT: 1000, PriorityClass.APPROVED: 100, PriorityClass.NORMAL: 1}


def describe_settings(settings: Settings) -> str:
    """'default settings', or the keys that differ from the defaults, and the starvation bound."""
    default = Settings()
    diffs = [
        f"{key}={describe_value(getattr(settings, f.name))}"
        for key, f in SETTING_FIELDS.items()
        if getattr(settings, f.name) != getattr(default, f.name)
    ]
    bound = settings.starvation_bound(lambda sec: f"{math.ceil(sec / 360) / 10:.1f} h").rstrip(".")
    return (", ".join(diffs) if diffs else "default settings") + f" (starvation bound: {bound})"


def describe_value(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


class Policy:
    """What the engine asks a policy. Subclasses override what they need."""

    name = "base"
    description = ""
    controller = False  # runs a controller loop every LOOP_INTERVAL
    per_team = False  # per-team queues picked by `team_key` (lowest first)

    def __init__(self) -> None:
        self.writes = 0
        self.write_times: list[float] = []
        self.job_writes: list[int] = []
        self._sim: AnySim | None = None

    @property
    def sim(self) -> AnySim:
        if self._sim is None:
            raise RuntimeError("policy used before reset()")
        return self._sim

    def reset(self, sim: AnySim) -> None:
        self._sim = sim
        self.writes = 0
        self.write_times = []
        self.job_writes = [0] * len(sim.jobs)

    def priority(self, job: SimJob) -> int:
        """The job's effective Kueue priority now (pending or admitted)."""
        return 0

    def job_key(self, job: SimJob) -> Key:
        return (job.submit, job.job_id)

    def team_key(self, team: str) -> float:
        return 0.0

    def packing(self, job: SimJob) -> tuple[str, str]:
        cfg = self.sim.cfg
        return cfg.node_policy, cfg.gpu_policy

    def advance(self, now: float) -> None:
        """Time moves to `now` (before anything changes at `now`)."""

    def on_arrival(self, job: SimJob, now: float) -> None:
        pass

    def on_admit(self, job: SimJob, now: float) -> None:
        pass

    def on_release(self, job: SimJob, now: float) -> None:
        pass

    def on_evict(self, job: SimJob, now: float, reason: str) -> None:
        """An admitted job was evicted (Kueue model): it is pending again."""

    def tick(self, now: float) -> bool:
        """One controller cycle; True when any pending job's order key changed."""
        return False

    def next_change(self, now: float) -> float:
        """Earliest time after `now` at which a cycle could decide differently with nothing
        else changing (math.inf: never)."""
        return math.inf

    def extra(self) -> Mapping[str, float]:
        return {}


class Fifo(Policy):
    name = "FIFO"
    description = "Kueue BestEffortFIFO, one priority for all (creation time only)"


class StaticClasses(Policy):
    name = "Static classes"
    description = "urgent/approved/normal as fixed priorities 1000/100/1; no fairness, no aging"

    def __init__(self, name: str | None = None, description: str | None = None) -> None:
        super().__init__()
        if name:
            self.name = name
        if description:
            self.description = description

    def job_key(self, job: SimJob) -> Key:
        return (-STATIC_PRIORITY[job.cls], job.submit, job.job_id)

    def priority(self, job: SimJob) -> int:
        return STATIC_PRIORITY[job.cls]


class AfsModel(Policy):
    """Kueue Admission Fair Sharing (model): LocalQueue decayed usage before priority."""

    name = "Kueue AFS (model)"
    per_team = True

    def __init__(self, half_life: float = 168 * 3600.0, sampling: float = 300.0) -> None:
        super().__init__()
        self.half_life = half_life
        self.sampling = sampling
        self.description = (
            f"Admission Fair Sharing: team usage decayed with half-life {half_life / 3600:g} h, "
            f"sampled every {sampling / 60:g} min, plus entry penalty; then class, then time"
        )
        self.consumed: dict[str, float] = {}
        self.last_sample = 0.0
        self.alpha = 1.0 - math.pow(0.5, sampling / half_life)

    def reset(self, sim: AnySim) -> None:
        super().reset(sim)
        self.consumed = {t: 0.0 for t in sim.teams}
        self.last_sample = 0.0

    def job_key(self, job: SimJob) -> Key:
        return (-STATIC_PRIORITY[job.cls], job.submit, job.job_id)

    def team_key(self, team: str) -> float:
        return self.consumed[team]

    def priority(self, job: SimJob) -> int:
        return STATIC_PRIORITY[job.cls]

    def advance(self, now: float) -> None:
        steps = int((now - self.last_sample) // self.sampling)
        if steps <= 0:
            return
        keep = math.pow(1.0 - self.alpha, steps)
        sim = self.sim
        for team, i in sim.team_idx.items():
            usage = sim.team_alloc[i] / PCT
            self.consumed[team] = self.consumed[team] * keep + usage * (1.0 - keep)
        self.last_sample += steps * self.sampling

    def on_admit(self, job: SimJob, now: float) -> None:
        self.consumed[job.team] += self.alpha * job.need / PCT  # entry penalty


class DrfIdeal(Policy):
    name = "DRF (ideal)"
    description = (
        "progressive filling by unweighted dominant (GPU) share, re-computed after every "
        "admission; no classes, no aging"
    )
    per_team = True

    def team_key(self, team: str) -> float:
        sim = self.sim
        return sim.team_alloc[sim.team_idx[team]] / sim.capacity


class Wdrf(Policy):
    """The controller's `compute_plan`, called every LOOP_INTERVAL on the simulated cluster.

    `incremental=False` hands compute_plan the whole cluster every cycle: every pending and
    every admitted Workload. `incremental=True` (the default, and what makes the full trace
    affordable) hands it only what can have changed, and keeps every other workload's last
    decision:
      - admitted Workloads of a team are summarised as one admitted Workload with the same
        GPU-equivalents (the policy reads admitted work only as team usage);
      - pending Workloads are re-planned when new, when their AGING_STEP-floored wait moves,
        or when their team's fairness term moved (detected on one pending Workload of each
        team whose usage changed, or of every team when the set of teams changed or usage
        decays); one pending Workload of each team with no admitted work keeps the set of
        teams the same.
    Both rely on the plan's documented formula (boost = class + fairness(team) + aging(wait));
    `tests/unit/test_sim_wdrf.py` checks that both modes give identical admissions and writes.
    """

    controller = True

    def __init__(
        self,
        settings: Settings,
        epoch: datetime,
        name: str = "WDRF",
        incremental: bool = True,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.epoch = epoch
        self.name = name
        self.incremental = incremental
        self.description = "controller.policy.compute_plan every LOOP_INTERVAL, " + (
            describe_settings(settings)
        )
        self.plan_calls = 0
        self.plan_seconds = 0.0
        self.plan_workloads = 0
        self.problems = 0
        self._reset_state()

    def _reset_state(self) -> None:
        self.targets: dict[int, int] = {}
        self.fair: dict[str, int | None] = {}
        self.hami: dict[int, tuple[str, str]] = {}
        self.by_key: dict[str, int] = {}
        self.pending_wl: dict[int, Workload] = {}
        self.admitted_wl: dict[int, Workload] = {}
        self.pending_by_team: dict[str, dict[int, None]] = {}
        self.aggregate: dict[str, tuple[int, Workload]] = {}
        self.new: set[int] = set()
        self.usage_changed: set[str] = set()
        self.teams_last: frozenset[str] = frozenset()
        self.steps: list[tuple[float, int]] = []
        self.history: UsageHistory | None = None

    # -- domain objects ------------------------------------------------------------------------
    def reset(self, sim: AnySim) -> None:
        super().reset(sim)
        self._reset_state()
        self.plan_calls = 0
        self.plan_seconds = 0.0
        self.plan_workloads = 0
        self.problems = 0
        gpus = Decimal(sim.cfg.nodes * sim.cfg.node_gpus)
        self.cq = ClusterQueue(
            name="gpu",
            api_version=KueueApiVersion.V1BETA2,
            quotas=(ResourceQuota("default-flavor", GPU, gpus),),
        )
        self.lqs = tuple(
            LocalQueue(namespace=t, name="default", cluster_queue="gpu") for t in sim.teams
        )

    def _workload(self, job: SimJob) -> Workload:
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
        )

    def _aggregate(self, team: str, used: int) -> Workload:
        """One admitted Workload carrying a team's whole admitted usage: `used` GPU-percent as
        `used` GPUs at 1 % each (GPU-equivalents = used / 100, exact in binary floats since
        every job's share is a multiple of 1/4 GPU)."""
        cached = self.aggregate.get(team)
        if cached is not None and cached[0] == used:
            return cached[1]
        res = {GPU: Decimal(used), GPUCORES: Decimal(1), GPUMEM_PERCENTAGE: Decimal(1)}
        w = Workload(
            namespace=team,
            name="admitted-aggregate",
            uid=f"aggregate-{team}",
            api_version=KueueApiVersion.V1BETA2,
            queue_name="default",
            created=self.epoch,
            pod_sets=(PodSet("main", 1, (Container("main", frozen_resources(res)),)),),
            quota_reserved=True,
            admitted=True,
            admission=Admission("gpu", frozen_resources({GPU: Decimal(used)})),
        )
        self.aggregate[team] = (used, w)
        return w

    # -- engine hooks --------------------------------------------------------------------------
    def job_key(self, job: SimJob) -> Key:
        # Kueue: higher effective priority first, then creation time (then UID).
        return (-self.targets.get(job.job_id, 0), job.submit, job.job_id)

    def packing(self, job: SimJob) -> tuple[str, str]:
        return self.hami.get(job.job_id) or super().packing(job)

    def on_arrival(self, job: SimJob, now: float) -> None:
        jid = job.job_id
        self.pending_wl[jid] = self._workload(job)
        self.pending_by_team.setdefault(job.team, {})[jid] = None
        self.new.add(jid)
        first = job.submit + self.settings.aging_step
        if first - job.submit <= self.settings.max_aging_time + 1e-9:
            heapq.heappush(self.steps, (first, jid))

    def on_admit(self, job: SimJob, now: float) -> None:
        jid = job.job_id
        w = self.pending_wl.pop(jid)
        del self.pending_by_team[job.team][jid]
        self.new.discard(jid)
        self.targets.pop(jid, None)
        self.hami.pop(jid, None)
        self.usage_changed.add(job.team)
        if not self.incremental:
            usage = {GPU: Decimal(job.pods * job.gpus_per_pod)}
            self.admitted_wl[jid] = replace(
                w, quota_reserved=True, admitted=True,
                admission=Admission("gpu", frozen_resources(usage)),
            )

    def on_release(self, job: SimJob, now: float) -> None:
        self.usage_changed.add(job.team)
        self.admitted_wl.pop(job.job_id, None)

    def _plan(
        self, pending_ids: Iterable[int], now: float, history: UsageHistory | None
    ) -> Plan:
        sim = self.sim
        if self.incremental:
            admitted = [
                self._aggregate(t, sim.team_alloc[i])
                for t, i in sim.team_idx.items()
                if sim.team_alloc[i] > 0
            ]
        else:
            admitted = list(self.admitted_wl.values())
        snapshot = ClusterSnapshot(
            workloads=(*(self.pending_wl[j] for j in pending_ids), *admitted),
            cluster_queues=(self.cq,),
            local_queues=self.lqs,
        )
        t0 = time.perf_counter()
        plan = compute_plan(snapshot, self.settings, self.epoch + timedelta(seconds=now), history)
        self.plan_seconds += time.perf_counter() - t0
        self.plan_calls += 1
        self.plan_workloads += len(snapshot.workloads)
        return plan

    def _apply(self, plan: Plan, now: float) -> tuple[bool, set[str]]:
        """Record the plan's targets; (any target changed, teams whose fairness term moved)."""
        changed = False
        moved: set[str] = set()
        for d in plan.decisions:
            jid = self.by_key[d.key]
            if d.leave_unchanged:
                self.problems += 1
                continue
            if d.breakdown is not None:
                f = d.breakdown.fairness_term
                if self.fair.get(d.team, -1) != f:
                    moved.add(d.team)
                    self.fair[d.team] = f
            target = d.target_priority
            if self.targets.get(jid, d.base_priority) != target:
                self.writes += 1
                self.write_times.append(now)
                changed = True
            self.targets[jid] = target
            if d.hami is not None and (d.hami.node_policy or d.hami.gpu_policy):
                default = super().packing(self.sim.jobs[jid])
                self.hami[jid] = (
                    d.hami.node_policy or default[0],
                    d.hami.gpu_policy or default[1],
                )
        return changed, moved

    def _crossers(self, now: float) -> set[int]:
        out: set[int] = set()
        step, cap = self.settings.aging_step, self.settings.max_aging_time
        pending = self.sim.pending
        while self.steps and self.steps[0][0] <= now + 1e-9:
            ts, jid = heapq.heappop(self.steps)
            job = pending.get(jid)
            if job is None:
                continue
            out.add(jid)
            nxt = ts + step
            if nxt - job.submit <= cap + 1e-9:
                heapq.heappush(self.steps, (nxt, jid))
        return out

    def tick(self, now: float) -> bool:
        sim = self.sim
        crossers = self._crossers(now)
        history_in = self.history
        if not self.incremental:
            plan = self._plan(list(self.pending_wl), now, history_in)
            self.history = plan.history
            changed, _ = self._apply(plan, now)
        else:
            pend_teams = {t for t, d in self.pending_by_team.items() if d}
            adm_teams = {t for t, i in sim.team_idx.items() if sim.team_alloc[i] > 0}
            teams_now = frozenset(pend_teams | adm_teams)
            if teams_now != self.teams_last or self.settings.usage_half_life > 0:
                check = pend_teams
            else:
                check = self.usage_changed & pend_teams
            # One pending workload per team to check, and per team with no admitted work (so
            # that the set of teams the policy sees is the real one).
            reps = {
                next(iter(self.pending_by_team[t])) for t in check | (pend_teams - adm_teams)
            }
            first = self.new | crossers | reps
            changed = False
            moved: set[str] = set()
            if first:
                plan = self._plan(sorted(first), now, history_in)
                self.history = plan.history
                changed, moved = self._apply(plan, now)
            elif self.settings.usage_half_life > 0:
                self.history = self._plan((), now, history_in).history
            again = {j for t in moved for j in self.pending_by_team.get(t, ())} - first
            if again:
                changed2, _ = self._apply(self._plan(sorted(again | reps), now, history_in), now)
                changed = changed or changed2
            self.teams_last = teams_now
        self.new.clear()
        self.usage_changed.clear()
        return changed

    def next_change(self, now: float) -> float:
        """When some pending workload's aging term next steps (AGING_STEP-floored wait, capped
        at MAX_AGING_TIME); with decayed usage, every cycle (shares move continuously)."""
        if self.settings.usage_half_life > 0:
            return now
        pending = self.sim.pending
        while self.steps and self.steps[0][1] not in pending:
            heapq.heappop(self.steps)
        return self.steps[0][0] if self.steps else math.inf

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
