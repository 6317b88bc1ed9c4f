"""The priority encoding (model v2): int32 values that do not move with the clock.

Every pending Workload ages at the same rate, so at any instant `t` the order of

    class + fairness + a x wait(t)              (the formula, docs/policy.md)

equals the order of `class + fairness - a x queued_since`: the `a x t` part is common to all.
The written aging term is therefore

    aging = floor(a x clamp(R + P - queued_since, 0, MAX_AGING_TIME + P))

with `R` the reference instant (the last rebase: REBASE_EPOCH + k x P) and `P` the rebase
period. It is constant while `R` is; at a rebase every pending Workload's value rises by `a x P`
(one write each, no Event), which keeps values inside a fixed band whatever the date. The
credited wait is capped at MAX_AGING_TIME as of the reference, so between rebases a Workload
can be credited up to MAX_AGING_TIME + P; the order equals the formula's for every pair of
Workloads that have both waited less than MAX_AGING_TIME.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from controller.config import REBASE_EPOCH_ISO
from controller.domain import PriorityClass, RequeueTimestamp, Workload
from controller.plan import GUARD_STATE, TERMS_VERSION

if TYPE_CHECKING:
    from controller.config import PolicySettings

REBASE_EPOCH = datetime.fromisoformat(REBASE_EPOCH_ISO)


def reference(now: datetime, period: float) -> datetime:
    """The aging reference for `now`: the last instant EPOCH + k x period at or before it."""
    elapsed = (now - REBASE_EPOCH).total_seconds()
    return REBASE_EPOCH + timedelta(seconds=math.floor(elapsed / period) * period)


def next_rebase(now: datetime, period: float) -> datetime:
    return reference(now, period) + timedelta(seconds=period)


def requeue_mode(
    snapshot_mode: RequeueTimestamp | None, settings: PolicySettings
) -> RequeueTimestamp:
    """REQUEUE_TIMESTAMP: a fixed value wins; auto follows Kueue's config when the snapshot
    knows it, else Kueue's default (eviction)."""
    if settings.requeue_timestamp != "auto":
        return RequeueTimestamp(settings.requeue_timestamp)
    return snapshot_mode or RequeueTimestamp.EVICTION


def queued_since(workload: Workload, mode: RequeueTimestamp) -> datetime:
    """When the Workload last entered the queue: creation, or its last eviction when Kueue
    requeues by eviction time (a requeued Workload does not count its run time as waiting)."""
    evicted = workload.last_eviction
    if mode is RequeueTimestamp.EVICTION and evicted is not None and evicted > workload.created:
        return evicted
    return workload.created


def aging_term(queued_ts: float, reference_ts: float, settings: PolicySettings) -> int:
    """The encoded aging term from POSIX seconds (hot path: no datetimes)."""
    period = settings.rebase_period
    x = reference_ts + period - queued_ts
    if x < 0.0:
        x = 0.0
    cap = settings.max_aging_time + period
    if x > cap:
        x = cap
    return math.floor(settings.aging_coefficient * x + 1e-9)


def base_term(base: int, settings: PolicySettings) -> int:
    """The base priority's contribution, 0..2 x BASE_PRIORITY_CAP: a user-chosen
    WorkloadPriorityClass can move a Workload only inside its class band."""
    cap = settings.base_priority_cap
    return cap + max(-cap, min(cap, base))


def pending_value(
    cls: PriorityClass, base: int, fairness: int, aging: int, settings: PolicySettings
) -> int:
    return settings.class_term(cls) + base_term(base, settings) + fairness + aging


def formula_value(
    cls: PriorityClass, base: int, fairness: int, wait_seconds: float, settings: PolicySettings
) -> float:
    """The priority the formula gives at one instant (the v1 model without its step): what the
    encoding's order must equal. Used by tests and `explain`."""
    wait = min(max(wait_seconds, 0.0), settings.max_aging_time)
    return (settings.class_term(cls) + base_term(base, settings) + fairness
            + settings.aging_coefficient * wait)


def iso(ts: datetime) -> str:
    """RFC 3339 in UTC to the second, as Kubernetes writes timestamps."""
    if ts.tzinfo is not UTC and ts.utcoffset() != _ZERO:  # (parsed timestamps are in UTC)
        ts = ts.astimezone(UTC)
    # isoformat(timespec="seconds") truncated to the second, in half its time (hot path).
    return "%04d-%02d-%02dT%02d:%02d:%02dZ" % (  # noqa: UP031
        ts.year, ts.month, ts.day, ts.hour, ts.minute, ts.second)


_ZERO = timedelta(0)
_CLASS_NAME = {c: c.value for c in PriorityClass}  # (an enum's .value is slow in the hot path)


def pending_terms(
    cls: PriorityClass, team: str, pool: str, level: int, levels: int, fairness: int,
    since: str, ref: str, base: int, override: int | None, priority: int,
) -> str:
    return (f"{TERMS_VERSION} class={_CLASS_NAME[cls]} team={team} pool={pool}"
            f" level={level}/{levels} fair={fairness} since={since} ref={ref} base={base}"
            f" override={'-' if override is None else override} priority={priority}")


def guard_terms(
    cls: PriorityClass, team: str, pool: str, override: int | None, priority: int
) -> str:
    return (f"{TERMS_VERSION} class={_CLASS_NAME[cls]} team={team} pool={pool} state={GUARD_STATE}"
            f" override={'-' if override is None else override} priority={priority}")


def exposed_terms(
    cls: PriorityClass, team: str, pool: str, state: str, for_teams: tuple[str, ...],
    over_entitlement: float, priority: int,
) -> str:
    """An admitted Workload exposed to preemption by some teams' pending Workloads."""
    return (f"{TERMS_VERSION} class={_CLASS_NAME[cls]} team={team} pool={pool} state={state}"
            f" for={','.join(for_teams)} over={over_entitlement:.2f} override=-"
            f" priority={priority}")
