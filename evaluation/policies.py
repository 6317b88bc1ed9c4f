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
- DRF with classes (ideal): classes first (urgent > approved > normal, as fixed priorities that
  Kueue's preemption also sees), then progressive filling by weighted dominant share inside a
  class. What WDRF aims at, with no controller loop and no API writes.
- WDRF: `controller.policy.compute_plan` every LOOP_INTERVAL on a `ClusterSnapshot` built from
  the simulated cluster; Kueue then orders by the plan's target priority, then creation time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from controller.config import SETTING_FIELDS, Settings
from controller.domain import (
    PriorityClass,
)
from evaluation.engine import Key
from evaluation.kueue import KueueSim, Policy
from evaluation.trace import PCT, SimJob

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

    def reset(self, sim: KueueSim) -> None:
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


class DrfClasses(Policy):
    """Classes first, then weighted DRF inside a class: of the teams' best pending Workloads of
    the highest class, the one whose team has the lowest weighted dominant share goes first
    (re-computed after every admission). The classes are fixed priorities, so Kueue preempts
    by class exactly as for Static classes; nothing preempts within a class."""

    name = "DRF with classes (ideal)"
    description = (
        "classes first (fixed priorities 1000/100/1, preemption by class as Static classes), "
        "then progressive filling by weighted dominant (GPU) share of quota inside a class, "
        "re-computed after every admission; no aging"
    )
    per_team = True
    class_first = True

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        super().__init__()
        self.weights = dict(weights or {})

    def priority(self, job: SimJob) -> int:
        return STATIC_PRIORITY[job.cls]

    def team_key(self, team: str) -> float:
        sim = self.sim
        # Kueue admits on quota: the share is the quota the team holds (pods running or not).
        return sim.team_quota[sim.team_idx[team]] / sim.capacity / self.weights.get(team, 1.0)
