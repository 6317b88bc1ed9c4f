"""The one applier: sends `Change`s, retries what can be retried, never lets one object stop
the others.

* 409 Conflict (or a failed JSON-patch `test`: every write is a compare-and-swap against the
  object as read): the write was computed from stale state. It is never sent again in this
  cycle: counted as `conflict` (`wdrf_patches_total{result="conflict"}`) and planned again by
  the next cycle from the caches, which have seen the change by then. The object is re-read
  once only to tell a failed test from an invalid patch (the same patch recomputed against the
  fresh object) and to count a write someone else already made as `noop`.
* 429, 5xx, timeouts, connection errors: exponential backoff with jitter, bounded per cycle by
  a retry budget (seconds of sleeping). When it is spent the remaining retriable failures wait
  for the next cycle, which re-diffs from the cache anyway.
* 422 on a GPU-fraction change whose re-read gives the same patch (not a failed `test`: the
  Job is still suspended, same UID): this Job's container resources cannot change here
  (Kubernetes < 1.36, MutablePodResourcesForSuspendedJobs off, an admission policy...). The
  applier remembers it for that Job only (`fraction_refused`, by UID) and the runner emits an
  Event instead. A Job that Kueue unsuspended between our read and our patch fails the
  patch's `test /spec/suspend` and is simply dropped: no global switch-off.
* A write refused locally (dry run, not the leader, deadline passed) is counted as `refused`,
  never sent. Once `stopping()` is true (SIGTERM) no new write starts (`deferred`); those in
  flight finish.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from controller.live.api import JSON, JSON_PATCH, ApiError, Transport, WriteRefused
from controller.live.backoff import Backoff
from controller.live.diff import GPU_FRACTION, Change, redo
from controller.live.metrics import Metrics

log = logging.getLogger(__name__)


class Result(enum.StrEnum):
    """What became of one write (the `result` label of the writes metric, and in the log)."""

    APPLIED = "applied"
    NOOP = "noop"  # after a re-read there was nothing left to write
    CONFLICT = "conflict"  # still conflicting after the attempts allowed
    FAILED = "failed"
    REFUSED = "refused"
    UNSUPPORTED = "unsupported"
    DEFERRED = "deferred"  # retry budget spent or apiserver unreachable: next cycle


APPLIED, NOOP, CONFLICT = Result.APPLIED, Result.NOOP, Result.CONFLICT
FAILED, REFUSED, UNSUPPORTED, DEFERRED = (
    Result.FAILED, Result.REFUSED, Result.UNSUPPORTED, Result.DEFERRED)


@dataclass(frozen=True, slots=True)
class Outcome:
    change: Change  # the change as finally sent (after re-reads)
    result: Result
    error: ApiError | None = None


@dataclass
class ApplyReport:
    outcomes: list[Outcome] = field(default_factory=list)

    def by_result(self, result: Result) -> list[Outcome]:
        return [o for o in self.outcomes if o.result == result]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.result] = out.get(o.result, 0) + 1
        return out


def has_test_op(change: Change) -> bool:
    return change.content_type == JSON_PATCH and any(
        isinstance(op, dict) and op.get("op") == "test" for op in change.body
    )


def is_conflict(error: ApiError, change: Change) -> bool:
    """409, or a 422 to a JSON patch with a `test` op: the apiserver answers a failed test
    with a bare 422 "Invalid" ("the server rejected our request due to an error in our
    request"). Re-reading tells which: if the recomputed patch is the same, it was not the
    test (see `Applier._apply_one`)."""
    return error.status == 409 or (error.status == 422 and has_test_op(change))


class _CycleState:
    """What the changes of one `apply` share: the retry budget and the outage detector."""

    def __init__(self, budget: float) -> None:
        self._lock = threading.Lock()
        self._budget = budget
        self._unreachable = 0

    def take(self, wanted: float) -> float:
        """Seconds of sleeping granted (0 when the cycle's budget is spent)."""
        with self._lock:
            granted = max(0.0, min(wanted, self._budget))
            self._budget -= granted
            return granted

    def has_budget(self) -> bool:
        with self._lock:
            return self._budget > 0

    def record(self, outcome: Outcome) -> None:
        with self._lock:
            self._unreachable = self._unreachable + 1 if _unreachable(outcome) else 0

    def apiserver_gone(self) -> bool:
        with self._lock:
            return self._unreachable >= 3


OutcomeHook = Callable[[Outcome], None]


class Applier:
    def __init__(
        self,
        transport: Transport,
        metrics: Metrics,
        max_attempts: int = 5,
        retry_budget: float = 10.0,
        backoff: Callable[[], Backoff] = lambda: Backoff(initial=0.2, cap=5.0),
        sleep: Callable[[float], None] = time.sleep,
        workers: int = 1,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self._transport = transport
        self._metrics = metrics
        self._max_attempts = max(1, max_attempts)
        self._retry_budget = retry_budget
        self._new_backoff = backoff
        self._sleep = sleep
        self._workers = max(1, workers)
        self._stopping = stopping
        # UIDs of Jobs whose GPU-fraction change the apiserver refused (422, not a failed
        # test): not tried again for that Job.
        self._refused_lock = threading.Lock()
        self.fraction_refused: set[str] = set()

    def refused_fraction(self, uid: str) -> bool:
        with self._refused_lock:
            return uid in self.fraction_refused

    def apply(
        self, changes: Sequence[Change], on_outcome: OutcomeHook | None = None,
        chain: Callable[[Change], str | None] | None = None,
    ) -> ApplyReport:
        """Send every change (in `workers` threads); `on_outcome` runs after each one, in
        the same thread (e.g. to emit its Event). Changes with the same `chain` key are sent
        one after another in the order given (each once the one before has its outcome);
        chains, and changes whose key is None, run side by side. Outcomes come in the order
        of `changes`."""
        state = _CycleState(self._retry_budget)

        def one(change: Change) -> Outcome:
            if state.apiserver_gone() or self._stopping():
                # The apiserver is gone (do not hammer it with the rest of the cycle), or we
                # are shutting down (only writes already in flight finish).
                outcome = Outcome(change, DEFERRED)
            else:
                try:
                    outcome = self._apply_one(change, state)
                except Exception as e:  # a bug in one object must not stop the others
                    log.exception("applying %s to %s crashed", change.what, change.ref)
                    outcome = Outcome(change, FAILED, ApiError(0, type(e).__name__, str(e)))
                state.record(outcome)
            self._metrics.patches.labels(change.ref.kind, outcome.result).inc()
            if on_outcome is not None:
                try:
                    on_outcome(outcome)
                except Exception:
                    log.exception("after applying %s to %s", change.what, change.ref)
            return outcome

        if self._workers == 1 or len(changes) < 2:
            return ApplyReport([one(c) for c in changes])
        tasks: list[list[int]] = []
        chained: dict[str, list[int]] = {}
        for i, c in enumerate(changes):
            key = chain(c) if chain is not None else None
            if key is None:
                tasks.append([i])
            elif key in chained:
                chained[key].append(i)
            else:
                tasks.append(chained.setdefault(key, [i]))
        outcomes: list[Outcome | None] = [None] * len(changes)

        def run(task: list[int]) -> None:
            for i in task:
                outcomes[i] = one(changes[i])

        with ThreadPoolExecutor(self._workers, thread_name_prefix="apply") as pool:
            list(pool.map(run, tasks))
        return ApplyReport([o for o in outcomes if o is not None])

    def _apply_one(self, change: Change, state: _CycleState) -> Outcome:
        backoff = self._new_backoff()
        current: Change | None = change
        last_error: ApiError | None = None
        for _attempt in range(self._max_attempts):
            if current is None:
                return Outcome(change, NOOP)
            try:
                self._send(current)
            except WriteRefused as e:
                return Outcome(current, REFUSED, e)
            except ApiError as e:
                self._metrics.api_errors.labels(e.code_label).inc()
                last_error = e
                if e.status == 404:  # deleted since the cache saw it: nothing to do
                    return Outcome(current, NOOP, e)
                if is_conflict(e, current):
                    try:
                        fresh = self._reread(current)
                    except ApiError as read_error:
                        if read_error.status == 404:
                            return Outcome(change, NOOP)
                        self._metrics.api_errors.labels(read_error.code_label).inc()
                        return Outcome(current, CONFLICT, e)
                    if e.status == 422 and fresh is not None and fresh.body == current.body:
                        # Invalid, not a failed test (same object, same state).
                        if current.what == GPU_FRACTION:
                            with self._refused_lock:
                                self.fraction_refused.add(current.ref.uid)
                            return Outcome(current, UNSUPPORTED, e)
                        return Outcome(current, FAILED, e)
                    if fresh is None:  # already as intended (or another object now): done
                        return Outcome(current, NOOP, e)
                    if e.status == 409 and fresh.body == current.body:
                        continue  # the apiserver's own write race; our fields are as read
                    # Stale: never resent; the next cycle plans from the fresh state.
                    log.info("%s on %s not written: changed since it was read (%s); the next "
                             "cycle plans it again", current.what, current.ref, e.status)
                    return Outcome(current, CONFLICT, e)
                if e.retriable and state.has_budget() and not self._stopping():
                    delay = state.take(backoff.next())
                    log.info("retrying %s on %s in %.2fs: %s", current.what, current.ref, delay, e)
                    self._sleep(delay)
                    continue
                return Outcome(current, DEFERRED if e.retriable else FAILED, e)
            return Outcome(current, APPLIED)
        if current is None:
            return Outcome(change, NOOP)
        result = CONFLICT if last_error is not None and last_error.status in (409, 422) else (
            DEFERRED)
        return Outcome(current, result, last_error)

    def _send(self, change: Change) -> None:
        self._transport.request(
            "PATCH",
            change.resource.item(change.name, change.namespace or None),
            body=change.body,
            content_type=change.content_type,
        )

    def _reread(self, change: Change) -> Change | None:
        fresh: JSON = self._transport.request(
            "GET", change.resource.item(change.name, change.namespace or None)
        )
        uid = str((fresh.get("metadata") or {}).get("uid") or "")
        return redo(change, fresh, False if self.refused_fraction(uid) else None)


def _unreachable(outcome: Outcome) -> bool:
    return outcome.error is not None and outcome.error.status == 0 and outcome.result != REFUSED
