"""Which Kubernetes Events the controller's writes and findings give (mapping only; the
`EventRecorder` sends and rate-limits them).

* A priority write that succeeded: `PriorityChanged` on the Workload and its owner Job when
  what people act on changed (`controller.plan.change_is_eventful`: the class, an override, a
  reclaim); an encoding change alone (fairness level, aging, a rebase, a guard) is not news,
  and on a big cluster it would be one Event per Workload.
* A HAMi write that succeeded: `HamiSettingsApplied`; a GPU fraction the apiserver refused:
  `GpuFractionNotApplied`; a write that failed for another reason than an outage: `PatchFailed`.
  A conflict (the object changed since it was read) is not one: the next cycle plans from the
  fresh object, so it is logged and counted (`wdrf_patches_total{result="conflict"}`), and on
  a big cluster an Event per conflict would be noise on objects nothing is wrong with.
* Notices from the diff and invalid input from the plan: their own reasons.
"""

from __future__ import annotations

from controller.domain import InputProblem, ObjectRef, Workload
from controller.live.apply import APPLIED, DEFERRED, FAILED, UNSUPPORTED, Outcome
from controller.live.diff import (
    GPU_FRACTION,
    PRIORITY,
    Diff,
    fraction_refused_notice,
)
from controller.live.events import EventRecorder
from controller.plan import Plan, change_is_eventful


def problem_reason(problem: InputProblem) -> str:
    return "InvalidAnnotation" if "annotations" in problem.field else "InvalidInput"


def workload_and_owner(wl: Workload | None) -> list[ObjectRef]:
    if wl is None:
        return []
    refs = [wl.ref]
    if wl.owner is not None and wl.owner.is_batch_job:
        refs.append(ObjectRef("Job", wl.owner.name, wl.namespace, wl.owner.uid, "batch/v1"))
    return refs


def problems_of(plan: Plan) -> list[InputProblem]:
    out: list[InputProblem] = []
    for d in plan.decisions:
        out.extend(d.problems)
    out.extend(plan.problems)
    return out


def outcome_events(events: EventRecorder, outcome: Outcome, workload: Workload | None) -> None:
    """Events for one write, right after it (in the applier's worker thread)."""
    from controller.render import reason as why

    c, d = outcome.change, outcome.change.decision
    targets = workload_and_owner(workload)
    if outcome.result == APPLIED and c.what == PRIORITY:
        if not change_is_eventful(c.old_terms, d.terms):
            return
        where = "admitted" if d.admitted else f"position {d.rank + 1}"  # positions from 1
        text = f"{c.summary}: {why(d)} ({where} in ClusterQueue {d.cluster_queue})"
        for ref in targets:
            events.emit(ref, "PriorityChanged", text)
    elif outcome.result == APPLIED:
        text = f"HAMi settings applied to {c.ref}: {c.summary}"
        for ref in {c.ref, *targets}:
            events.emit(ref, "HamiSettingsApplied", text)
    elif outcome.result == UNSUPPORTED and c.what == GPU_FRACTION and d.hami is not None:
        note = fraction_refused_notice(c.ref, d.hami)
        for ref in {c.ref, *targets}:
            events.emit(ref, note.reason, note.message, "Warning")
    elif outcome.result is FAILED or (
        outcome.result == DEFERRED and outcome.error is not None
        and outcome.error.status != 0
    ):
        events.emit(c.ref, "PatchFailed", f"could not apply {c.summary}: {outcome.error}",
                    "Warning")


def finding_events(events: EventRecorder, plan: Plan, diff: Diff) -> None:
    """Events that do not come from a write: notices and invalid input."""
    for notice in diff.notices:
        events.emit(notice.ref, notice.reason, notice.message, notice.type)
    for problem in problems_of(plan):
        if problem.object is None or not problem.object.name:
            continue
        events.emit(problem.object, problem_reason(problem), str(problem), "Warning")
