"""One cycle's writes: what is sent, in which order, under which budget, and what became of it.

* HAMi (Job template) writes go first: a template change can make Kueue rebuild a Workload's
  spec; the priority written after it then sticks.
* Priority writes go in the order Kueue will use them (`controller.plan.head_first`), at most
  WRITE_BUDGET per cycle; the rest wait for the next cycle (re-planned then). Within one
  ClusterQueue the pending Workloads' writes of a cycle land one after another in the plan's
  order, the head first (`pending_queue`, `landing_order`); ClusterQueues are written side by
  side.
* A pending Workload that still carries a value written while it was admitted (a guard or
  an exposure: Kueue evicted it since) is lowered first, and those writes finish before any
  other priority write: the plan counted it at its new value only (`policy.threat_value`).
  Where such a lowering did not land, the pool's exposures are held for the next cycle.
* Then admitted Workloads' guards (and exposures) are sent, and finished, before any other
  priority write: the writes run concurrently, and a pending Workload's raise that landed
  before the guard it needs would let Kueue preempt the admitted one. Where a guard or an
  exposure did not land (or was held), the pool's other priority writes are held for the next
  cycle (docs/policy.md, "Preemption: safe by construction").
* Each outcome gets its Event (`controller.live.outcomes`), and per ClusterQueue the writer
  records whether Kueue's current order is the plan's (the convergence metrics).

Pure of process concerns: `LiveController` owns one and calls `write` once per leader cycle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from controller.live.apply import APPLIED, DEFERRED, NOOP, Applier, ApplyReport, Outcome
from controller.live.diff import PRIORITY, Change, Diff
from controller.live.events import EventRecorder
from controller.live.metrics import Metrics
from controller.live.outcomes import finding_events, outcome_events
from controller.plan import (
    HEAD_POSITIONS,
    Plan,
    WorkloadDecision,
    current_positions,
    head_first,
    lowers_admitted_value,
    pool_of,
    positions_right,
)
from controller.workload import WorkloadInfo

log = logging.getLogger(__name__)


def order_writes(changes: list[Change], plan: Plan) -> list[Change]:
    """Priority writes in the order Kueue will use them (`controller.plan.head_first`), after
    the lowerings of values written while admitted (`is_lowering`), which the rest of the
    plan counts on and a short budget must not leave out."""
    ordered = head_first(changes, lambda c: c.decision, plan.decisions)
    lowerings = [c for c in ordered if is_lowering(c)]
    if not lowerings:
        return ordered
    return lowerings + [c for c in ordered if not is_lowering(c)]


def pending_queue(change: Change) -> str | None:
    """The chain a pending Workload's write goes in: its ClusterQueue's. Kueue (BestEffortFIFO)
    parks the pending Workloads it could not admit and tries them again only in a batch, one
    second after quota is released; a Workload whose value changes leaves the parked ones at
    once. A deeper position's write landing before the head's in that second would let Kueue
    admit the deeper one alone, so within one ClusterQueue the writes land one at a time."""
    d = change.decision
    return None if d.admitted or d.cluster_queue is None else d.cluster_queue


def landing_order(changes: list[Change]) -> list[Change]:
    """Pending writes in the plan's order of each ClusterQueue (`rank`), the order their chains
    send them in. Not `head_first`'s slots: a demotion of Kueue's current head shares slot 0
    with the raise of the plan's head, and landing first it would put the demoted Workload
    into Kueue's heap while the plan's head is still parked. In the plan's order each write
    that lands is below every one that landed before it in its queue."""
    return sorted(changes, key=lambda c: c.decision.rank)


def is_lowering(change: Change) -> bool:
    """A pending Workload's write that lowers a value written while it was admitted."""
    return change.what == PRIORITY and lowers_admitted_value(change.decision, change.old_terms)


def is_exposure(change: Change) -> bool:
    b = change.decision.breakdown
    return change.decision.admitted and b is not None and b.exposure is not None


class CycleWriter:
    def __init__(self, applier: Applier, events: EventRecorder, metrics: Metrics, budget: int,
                 stopping: Callable[[], bool]) -> None:
        self.applier = applier
        self.events = events
        self.metrics = metrics
        self.budget = budget  # priority writes per cycle at most (WRITE_BUDGET)
        self._stopping = stopping
        self._unconverged_since: dict[str, float] = {}  # ClusterQueue -> monotonic time

    def write(self, plan: Plan, diff: Diff, workloads: Mapping[str, WorkloadInfo]) -> ApplyReport:
        """Send one plan's changes; the report has an outcome for every change (DEFERRED for
        those over the budget or held behind a guard that did not land)."""
        hami = [c for c in diff.changes if c.what != PRIORITY]
        prio = order_writes([c for c in diff.changes if c.what == PRIORITY], plan)
        self._track_convergence(plan, prio)
        over = prio[self.budget:] if self.budget >= 0 else []
        prio = prio[: max(self.budget, 0)]
        if over:
            log.info("write budget: %d priority writes this cycle, %d wait for the next",
                     len(prio), len(over))
            for c in over:
                self.metrics.patches.labels(c.ref.kind, DEFERRED).inc()

        def after(outcome: Outcome) -> None:
            info = workloads.get(outcome.change.decision.key)
            outcome_events(self.events, outcome, info.workload if info is not None else None)

        first, raises, held = self._guards_first(prio, over, after)
        if held:
            log.warning("%d priority write(s) held for the next cycle: a lowering, guard or "
                        "exposure in their pool did not land", len(held))
            for c in held:
                self.metrics.patches.labels(c.ref.kind, DEFERRED).inc()
        report = ApplyReport(
            self.applier.apply(hami, after).outcomes + first
            + self.applier.apply(landing_order(raises), after, chain=pending_queue).outcomes
            + [Outcome(c, DEFERRED) for c in [*held, *over]]
        )
        if not self._stopping():
            finding_events(self.events, plan, diff)
        return report

    def _guards_first(
        self, prio: list[Change], over: list[Change], after: Callable[[Outcome], None]
    ) -> tuple[list[Outcome], list[Change], list[Change]]:
        """Sends the lowerings of values written while admitted and waits for them, then the
        admitted Workloads' guards and exposures, and waits for them. Returns their outcomes,
        the writes to send now and the writes held: a pool's exposures where one of its
        lowerings did not land (or is over the budget), and its pending writes where one of
        its guards or exposures did not land or is held."""
        lowerings = [c for c in prio if is_lowering(c)]
        outcomes = self.applier.apply(lowerings, after).outcomes if lowerings else []
        not_lowered = {pool_of(o.change.decision) for o in outcomes
                       if o.result not in (APPLIED, NOOP)}
        not_lowered |= {pool_of(c.decision) for c in over if is_lowering(c)}
        guards: list[Change] = []
        held: list[Change] = []
        for c in prio:
            if c.decision.admitted:
                exposure_held = is_exposure(c) and pool_of(c.decision) in not_lowered
                (held if exposure_held else guards).append(c)
        rest = [c for c in prio if not c.decision.admitted and not is_lowering(c)]
        if guards:
            outcomes += self.applier.apply(guards, after).outcomes
        unsafe = {pool_of(o.change.decision) for o in outcomes
                  if o.change.decision.admitted and o.result not in (APPLIED, NOOP)}
        unsafe |= {pool_of(c.decision) for c in held}
        now: list[Change] = []
        for c in rest:
            (held if pool_of(c.decision) in unsafe else now).append(c)
        return outcomes, now, held

    def _track_convergence(self, plan: Plan, writes: list[Change]) -> None:
        """Per ClusterQueue, how many leading positions of Kueue's current order (the values
        as observed, before this cycle's writes) are the plan's, and whether all are: a
        queue with no pending priority write left is converged. Logs each queue when it
        becomes converged."""
        queues = {c.decision.cluster_queue or "-" for c in writes if not c.decision.admitted}
        pending: dict[str, list[WorkloadDecision]] = {}
        for d in plan.decisions:
            if not d.admitted:
                pending.setdefault(d.cluster_queue or "-", []).append(d)
        current = current_positions(d for q in queues for d in pending.get(q, ()))
        right = {q: positions_right(pending[q], current) if q in queues else len(pending[q])
                 for q in pending}
        now = time.monotonic()
        for q, n in right.items():
            if n < len(pending[q]):
                self._unconverged_since.setdefault(q, now)
            elif q in self._unconverged_since:
                since = self._unconverged_since.pop(q)
                log.info("ClusterQueue %s converged: its %d pending Workloads are in the plan's "
                         "order (%.0fs after it was first seen out of order)", q, n, now - since,
                         extra={"cluster_queue": q, "pending": n,
                                "seconds": round(now - since, 1)})
        for q in set(self._unconverged_since) - set(pending):
            del self._unconverged_since[q]  # the queue has no pending Workload left
        m = self.metrics
        m.set_labelled(m.positions_right, {q: float(n) for q, n in right.items()})
        m.set_labelled(m.order_converged,
                       {q: float(n == len(pending[q])) for q, n in right.items()})
        m.head_unconverged.set(sum(n < min(HEAD_POSITIONS, len(pending[q]))
                                   for q, n in right.items()))
