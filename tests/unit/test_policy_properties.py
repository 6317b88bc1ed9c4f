"""Property tests for the priority policy, model v2 (docs/policy.md), on the real compute_plan.

The oracle is `controller.encoding.formula_value`: class + base term + fairness + a x min(wait,
MAX_AGING_TIME) at one instant. The written encoding must order exactly as it does, without
moving with the clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from controller.classify import classify
from controller.config import MAX_BOOST, Settings
from controller.domain import (
    APPROVED_ANNOTATION,
    GPU,
    INT32_MAX,
    INT32_MIN,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    URGENT_ANNOTATION,
    ClusterQueue,
    KueueApiVersion,
    Preemption,
    PriorityClass,
    ResourceQuota,
    Workload,
)
from controller.encoding import exposed_terms, formula_value, guard_terms, reference
from controller.plan import Plan, WorkloadDecision, lowers_admitted_value
from controller.policy import compute_plan
from tests.support.builders import NOW, carried, evicted_while_admitted, snapshot, wl, written
from tests.support.builders import settings as make_settings

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEAMS = ("team-a", "team-b", "team-c", "team-d")
CLASSES = list(PriorityClass)
CLASS_ANN = {
    PriorityClass.URGENT: {URGENT_ANNOTATION: "true"},
    PriorityClass.APPROVED: {APPROVED_ANNOTATION: "true"},
    PriorityClass.NORMAL: {},
}
RANK = {PriorityClass.NORMAL: 0, PriorityClass.APPROVED: 1, PriorityClass.URGENT: 2}
S = Settings()
WEEK = 7 * 86400.0

# Per-team admitted usage: whole GPUs, 25 % slices and CPU cores.
usage_st = st.fixed_dictionaries({
    t: st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 16)) for t in TEAMS
})
# A pending Workload: (team index, class, wait below the aging cap)
pending_st = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(CLASSES), st.floats(0, S.max_aging_time - 1)),
    min_size=2, max_size=12,
)


def admitted(usage: dict[str, tuple[int, int, int]], cls: PriorityClass = PriorityClass.NORMAL,
             ) -> list[Workload]:
    out = []
    for team, (whole, slices, cpus) in usage.items():
        for i in range(whole):
            out.append(wl(f"{team}-whole-{i}", team, admitted=True, annotations=CLASS_ANN[cls]))
        for i in range(slices):
            out.append(wl(f"{team}-slice-{i}", team, admitted=True,
                          resources={"nvidia.com/gpucores": "25",
                                     "nvidia.com/gpumem-percentage": "25"}))
        if cpus:
            out.append(wl(f"{team}-cpu", team, gpu=None, admitted=True,
                          resources={"cpu": str(cpus)}))
    return out


def pending(spec: list[tuple[int, PriorityClass, float]], at: float = 0.0) -> list[Workload]:
    """Workloads created `wait` before NOW (`at` shifts nothing: creation times are fixed)."""
    return [wl(f"p{i}", TEAMS[t], wait=w + at, annotations=CLASS_ANN[c])
            for i, (t, c, w) in enumerate(spec)]


def preempting(within: str = "LowerPriority", gpus: int = 16) -> ClusterQueue:
    return ClusterQueue(
        "cq", KueueApiVersion.V1BETA2,
        quotas=(ResourceQuota("default", GPU, Decimal(gpus)),
                ResourceQuota("default", "cpu", Decimal(64))),
        preemption=Preemption(within_cluster_queue=within, reclaim_within_cohort="Any",
                              borrow_within_cohort="LowerPriority"),
    )


def decision(plan: Plan, key: str) -> WorkloadDecision:
    return next(d for d in plan.decisions if d.key == key)


def targets(plan: Plan) -> dict[str, int]:
    return {d.key: d.target_priority for d in plan.decisions}


# --------------------------------------------------------------------------------------------
# 1. The encoding orders exactly as the formula, and does not move with the clock


@FAST
@given(usage_st, pending_st, st.floats(0, 1))
def test_oracle_order_equals_the_formula_at_every_instant(
    usage: dict[str, tuple[int, int, int]], spec: list[tuple[int, PriorityClass, float]],
    instant: float,
) -> None:
    """At any instant inside a rebase period, the plan's order of pending Workloads equals the
    order of class + fairness + a x min(wait, cap), ties (and floor rounding) aside."""
    now = reference(NOW, S.rebase_period) + timedelta(seconds=instant * (S.rebase_period - 1))
    items = pending(spec)
    items = [replace(w, created=w.created + (now - NOW)) for w in items]  # same waits at `now`
    plan = compute_plan(snapshot(admitted(usage) + items, gpus=16, teams=TEAMS), S, now)
    ds = [d for d in plan.decisions if not d.admitted]
    for x in ds:
        for y in ds:
            bx, by = x.breakdown, y.breakdown
            assert bx is not None and by is not None
            fx = formula_value(bx.priority_class, bx.base, bx.fairness_term,
                               bx.wait_seconds(now), S)
            fy = formula_value(by.priority_class, by.base, by.fairness_term,
                               by.wait_seconds(now), S)
            if fx - fy >= 2:  # floor() on both sides: within 2 points is a tie
                assert x.target_priority > y.target_priority, (x.key, y.key)


@FAST
@given(usage_st, pending_st, st.floats(0, 1), st.floats(0, 1))
def test_values_do_not_move_with_the_clock_between_rebases(
    usage: dict[str, tuple[int, int, int]], spec: list[tuple[int, PriorityClass, float]],
    t1: float, t2: float,
) -> None:
    """Same cluster, two instants in one rebase period: every written value is identical (so a
    steady cluster costs no writes), for pending and admitted Workloads alike."""
    ref = reference(NOW, S.rebase_period)
    a = ref + timedelta(seconds=t1 * (S.rebase_period - 1))
    b = ref + timedelta(seconds=t2 * (S.rebase_period - 1))
    first = min(a, b)
    items = [replace(w, created=w.created + (first - NOW)) for w in pending(spec)]
    snap = replace(snapshot(admitted(usage) + items, gpus=16, teams=TEAMS),
                   cluster_queues=(preempting(),))
    pa, pb = compute_plan(snap, S, a), compute_plan(snap, S, b)
    assert targets(pa) == targets(pb)
    assert {d.key: d.terms.replace("priority=", "") for d in pa.decisions} == {
        d.key: d.terms.replace("priority=", "") for d in pb.decisions}


@FAST
@given(pending_st)
def test_a_rebase_shifts_every_uncapped_pending_value_by_a_times_the_period(
    spec: list[tuple[int, PriorityClass, float]],
) -> None:
    ref = reference(NOW, S.rebase_period)
    before = ref + timedelta(seconds=S.rebase_period - 1)
    after = ref + timedelta(seconds=S.rebase_period)
    items = [replace(w, created=w.created + (before - NOW)) for w in pending(spec)]
    snap = snapshot(items, gpus=16, teams=TEAMS)
    p1, p2 = compute_plan(snap, S, before), compute_plan(snap, S, after)
    shift = math.floor(S.aging_coefficient * S.rebase_period)
    for d in p1.decisions:
        b = d.breakdown
        assert b is not None
        # wait < cap at `before`; at the new reference the cap may bind (credited <= cap + P)
        new = decision(p2, d.key).target_priority
        assert d.target_priority <= new <= d.target_priority + shift + 1
        if b.wait_seconds(before) + 1 < S.max_aging_time:
            assert abs(new - d.target_priority - shift) <= 1


# --------------------------------------------------------------------------------------------
# 2. Classes, shares, starvation bound


@FAST
@given(usage_st, st.permutations(TEAMS), st.floats(0, 30 * 86400))
def test_class_order_holds_at_equal_wait_whatever_the_shares(
    usage: dict[str, tuple[int, int, int]], teams: list[str], wait: float
) -> None:
    pend = [
        wl("u", teams[0], wait=wait, annotations=CLASS_ANN[PriorityClass.URGENT]),
        wl("a", teams[1], wait=wait, annotations=CLASS_ANN[PriorityClass.APPROVED]),
        wl("n", teams[2], wait=wait),
    ]
    plan = compute_plan(snapshot(admitted(usage) + pend, gpus=16, teams=TEAMS), S, NOW)
    u, a, n = (decision(plan, f"{t}/{k}") for t, k in zip(teams, "uan", strict=False))
    assert u.target_priority > a.target_priority > n.target_priority
    assert u.rank < a.rank < n.rank


@FAST
@given(usage_st, st.sampled_from(CLASSES), st.floats(0, 10 * 86400))
def test_lower_share_ranks_higher_within_a_class(
    usage: dict[str, tuple[int, int, int]], cls: PriorityClass, wait: float
) -> None:
    pend = [wl("p", t, wait=wait, annotations=CLASS_ANN[cls]) for t in TEAMS]
    plan = compute_plan(snapshot(admitted(usage) + pend, gpus=16, teams=TEAMS), S, NOW)
    ds = {t: decision(plan, f"{t}/p") for t in TEAMS}
    for x in TEAMS:
        for y in TEAMS:
            bx, by = ds[x].breakdown, ds[y].breakdown
            assert bx is not None and by is not None
            if bx.dominant_share < by.dominant_share:
                assert ds[x].target_priority >= ds[y].target_priority
                if bx.fairness_term != by.fairness_term:  # quantization may tie close shares
                    assert ds[x].rank < ds[y].rank


@FAST
@given(usage_st, st.sampled_from(TEAMS), st.integers(1, 4))
def test_more_usage_never_raises_rank(
    usage: dict[str, tuple[int, int, int]], team: str, extra: int
) -> None:
    pend = [wl("p", t, wait=60) for t in TEAMS]
    more = dict(usage)
    w, sl, c = more[team]
    more[team] = (w + extra, sl, c)
    p1 = compute_plan(snapshot(admitted(usage) + pend, gpus=32, teams=TEAMS), S, NOW)
    p2 = compute_plan(snapshot(admitted(more) + pend, gpus=32, teams=TEAMS), S, NOW)
    assert decision(p2, f"{team}/p").target_priority <= decision(p1, f"{team}/p").target_priority


@FAST
@given(st.sampled_from(CLASSES), st.integers(0, 4), st.integers(0, 4), st.floats(0, 1),
       st.floats(0, 1), st.floats(0, 1))
def test_starvation_bound_on_compute_plan(
    later_cls: PriorityClass, n_gpus: int, x_gpus: int, n_frac: float, x_frac: float,
    instant: float,
) -> None:
    """A normal Workload N that has waited less than MAX_AGING_TIME ranks above any X of class
    `later_cls` that arrived at least overtake_window(later_cls) after it, whatever the two
    teams' shares; where that window is infinite (urgent), a fresh X outranks N even at the cap."""
    window = S.overtake_window(later_cls)
    now = reference(NOW, S.rebase_period) + timedelta(seconds=instant * (S.rebase_period - 1))
    usage = {"team-a": (n_gpus, 0, 0), "team-b": (x_gpus, 0, 0), "team-c": (0, 0, 0),
             "team-d": (0, 0, 0)}
    if math.isinf(window):
        assert later_cls is PriorityClass.URGENT
        n_wait, x_wait = S.max_aging_time * (1 + n_frac), 0.0
    else:
        n_wait = window + (S.max_aging_time - 1 - window) * n_frac
        x_wait = (n_wait - window) * x_frac
    n = replace(wl("n", "team-a", wait=n_wait), created=now - timedelta(seconds=n_wait))
    x = replace(wl("x", "team-b", wait=x_wait, annotations=CLASS_ANN[later_cls]),
                created=now - timedelta(seconds=x_wait))
    plan = compute_plan(snapshot([*admitted(usage), n, x], gpus=16, teams=TEAMS), S, now)
    dn, dx = decision(plan, "team-a/n"), decision(plan, "team-b/x")
    if math.isinf(window):
        assert dx.target_priority > dn.target_priority
    else:
        assert dn.target_priority > dx.target_priority


# --------------------------------------------------------------------------------------------
# 3. Preemption-safe by construction


def effective(plan: Plan, w: Workload) -> int:
    """`w`'s priority once `plan` is written: the decision's, or what it carries already."""
    d = next((d for d in plan.decisions if d.key == w.key), None)
    if d is not None:
        return d.target_priority
    return carried(w)


def with_current(w: Workload, current: int) -> Workload:
    """`w` as Kueue sees it after earlier cycles: effective priority `current` (boost mode)."""
    return replace(w, annotations={**w.annotations,
                                   KUEUE_PRIORITY_BOOST_ANNOTATION: str(current)})


# Which pending Workloads Kueue evicted while they were admitted (still carrying the value
# written then: their guard, or an exposure's value below it), and at which fraction of it.
stale_st = st.lists(st.one_of(st.none(), st.floats(0, 1)), min_size=1, max_size=12)


def stale_pending(waiting: list[Workload], stale: list[float | None], s: Settings,
                  ) -> list[Workload]:
    """`waiting` with some of them evicted while admitted: each `stale` fraction x of its
    class's guard (x = 1: the guard itself, `state=admitted`; below: an exposure,
    `state=reclaimable`), None: never admitted."""
    out = []
    for i, w in enumerate(waiting):
        x = stale[i % len(stale)]
        if x is None:
            out.append(w)
            continue
        cls = classify(w, None).priority_class
        guard = s.guard(cls)
        value = guard if x >= 1 else int(x * guard)
        terms = (guard_terms(cls, w.namespace, "cq/cq", None, guard) if x >= 1 else
                 exposed_terms(cls, w.namespace, "cq/cq", "reclaimable", ("team-b",), 2.0,
                               value))
        out.append(evicted_while_admitted(w, value, terms))
    return out


@FAST
@given(usage_st, pending_st, st.sampled_from(CLASSES), st.booleans(),
       st.sampled_from(["LowerPriority", "LowerOrNewerEqualPriority"]),
       st.lists(st.one_of(st.just(0), st.just(-1), st.floats(0, 1)), min_size=1, max_size=20),
       stale_st)
def test_no_pending_workload_can_preempt_an_admitted_one_of_its_class(
    usage: dict[str, tuple[int, int, int]], spec: list[tuple[int, PriorityClass, float]],
    admitted_cls: PriorityClass, approved_preempts: bool, within: str,
    currents: list[float], stale: list[float | None],
) -> None:
    """After the plan is written, every admitted Workload is strictly above every pending
    Workload of its own class (and of approved, for normal, unless APPROVED_PREEMPTS_NORMAL),
    whether the pending one carries its old or its new value - except an old value written
    while that Workload was admitted (a guard or exposure, evicted since), which is lowered
    first and counts at its new value only: aging and fairness never make Kueue preempt
    within a class, not even with LowerOrNewerEqualPriority. Guards are written only where
    needed, so an admitted Workload may keep its earlier value (0, a pending value of its
    class, or its guard). Urgent work still preempts lower classes."""
    s = S if not approved_preempts else make_settings(
        approved_preempts_normal=True, priority_class_unit=3000, max_aging_time=86400.0,
        rebase_period=86400.0)
    spec = [(t, c, min(w, s.max_aging_time * 3)) for t, c, w in spec]

    def class_of(w: Workload) -> PriorityClass:  # slices and CPU Workloads are normal
        return admitted_cls if "-whole-" in w.name else PriorityClass.NORMAL

    def current(i: int, cls: PriorityClass) -> int:
        x = currents[i % len(currents)]
        if x == -1:
            return s.guard(cls)
        return 0 if x == 0 else s.class_term(cls) + int(x * s.band_span())

    running = [with_current(w, current(i, class_of(w)))
               for i, w in enumerate(admitted(usage, admitted_cls))]
    waiting = stale_pending(pending(spec), stale, s)
    snap = replace(snapshot(running + waiting, gpus=16, teams=TEAMS),
                   cluster_queues=(preempting(within),))
    plan = compute_plan(snap, s, NOW)
    by_key = {d.key: d for d in plan.decisions}
    after = {w.key: by_key[w.key].target_priority if w.key in by_key
             else current(i, class_of(w)) for i, w in enumerate(running)}
    assume(running)
    for a in running:
        cls = class_of(a)
        for p in waiting:
            d = by_key[p.key]
            assert d.breakdown is not None
            pcls = d.breakdown.priority_class
            protected = RANK[pcls] <= RANK[cls] or (
                cls is PriorityClass.NORMAL and pcls is PriorityClass.APPROVED
                and not s.approved_preempts_normal)
            if protected:
                old = carried(p)
                if lowers_admitted_value(d, p.annotations.get(PRIORITY_TERMS_ANNOTATION)):
                    old = d.target_priority  # lowered before any guard is written
                assert max(d.target_priority, old) < after[a.key], (p.key, a.key)
            else:  # a higher class: it may preempt (what "urgent" means to an admin)
                assert d.target_priority > after[a.key], (p.key, a.key)


@FAST
@given(usage_st, pending_st, st.sampled_from(CLASSES),
       st.lists(st.one_of(st.just(0), st.just(-1), st.floats(0, 1)), min_size=1, max_size=20),
       stale_st)
def test_a_value_written_while_admitted_moves_no_guard(
    usage: dict[str, tuple[int, int, int]], spec: list[tuple[int, PriorityClass, float]],
    admitted_cls: PriorityClass, currents: list[float], stale: list[float | None],
) -> None:
    """Pending Workloads still carrying a value written while they were admitted: every
    admitted Workload gets exactly the decision it gets once those are lowered to the plan's
    values (the lowering lands first; nothing is guarded, and later unguarded, for a value
    that is being taken away)."""
    def current(i: int) -> int:
        x = currents[i % len(currents)]
        if x == -1:
            return S.guard(admitted_cls)
        return 0 if x == 0 else S.class_term(admitted_cls) + int(x * S.band_span())

    running = [with_current(w, current(i)) for i, w in enumerate(admitted(usage, admitted_cls))]
    waiting = stale_pending(pending(spec), stale, S)
    snap = replace(snapshot(running + waiting, gpus=16, teams=TEAMS),
                   cluster_queues=(preempting(),))
    plan = compute_plan(snap, S, NOW)
    terms = {w.key: w.annotations.get(PRIORITY_TERMS_ANNOTATION) for w in waiting}
    lowered = {d.key for d in plan.decisions
               if d.key in terms and lowers_admitted_value(d, terms[d.key])}
    assume(lowered)
    landed = written(replace(snap, workloads=tuple(w for w in snap.workloads
                                                   if w.key in lowered)), plan, boost=True)
    by_key = {w.key: w for w in landed.workloads}
    after = compute_plan(replace(snap, workloads=tuple(
        by_key.get(w.key, w) for w in snap.workloads)), S, NOW)

    def guards(p: Plan) -> list[tuple[str, int, str]]:
        return [(d.key, d.target_priority, d.terms) for d in p.decisions if d.admitted]

    assert guards(plan) == guards(after)


@FAST
@given(st.integers(1, 8), st.sampled_from(CLASSES))
def test_guards_are_written_only_when_something_reaches_the_admitted_workload(
    n: int, cls: PriorityClass,
) -> None:
    """An admitted Workload above every pending Workload that must not preempt it gets no
    write; one that a pending Workload reaches gets its guard (at most one write each)."""
    high = S.class_term(cls) + S.band_span()
    running = [with_current(wl(f"run{i}", admitted=True, annotations=CLASS_ANN[cls]), high)
               for i in range(n)]
    quiet = replace(snapshot(running, gpus=16), cluster_queues=(preempting(),))
    assert not [d for d in compute_plan(quiet, S, NOW).decisions if d.admitted]
    reached = replace(snapshot([*running, wl("new", annotations=CLASS_ANN[cls],
                                             priority=high)], gpus=16),
                      cluster_queues=(preempting(),))
    guards = [d for d in compute_plan(reached, S, NOW).decisions if d.admitted]
    assert len(guards) == n and {d.target_priority for d in guards} == {S.guard(cls)}
    guarded = replace(reached, workloads=tuple(
        with_current(w, S.guard(cls)) if w.quota_reserved else w for w in reached.workloads))
    again = [d for d in compute_plan(guarded, S, NOW).decisions if d.admitted]
    assert all(d.target_priority == S.guard(cls) for d in again)  # no write: already there


@FAST
@given(st.sampled_from(CLASSES), st.sampled_from(CLASSES), st.floats(0, 30 * 86400),
       st.integers(0, 4))
def test_an_evicted_workload_never_preempts_its_evictor(
    evictor_cls: PriorityClass, victim_cls: PriorityClass, wait: float, gpus: int,
) -> None:
    """If Y (pending) could preempt X (admitted), then once Y is admitted and X pending again
    (with any wait and share), X cannot preempt Y: no ping-pong."""
    cq = preempting()
    usage = {t: (gpus if t == "team-a" else 0, 0, 0) for t in TEAMS}
    y = wl("y", "team-b", wait=wait, annotations=CLASS_ANN[evictor_cls])
    x_admitted = wl("x", "team-a", admitted=True, annotations=CLASS_ANN[victim_cls])
    p1 = compute_plan(replace(snapshot([*admitted(usage), y, x_admitted], teams=TEAMS),
                              cluster_queues=(cq,)), S, NOW)
    y_value = decision(p1, "team-b/y").target_priority
    if y_value <= effective(p1, x_admitted):
        return  # Y could not preempt X in the first place
    # Y is admitted carrying the value it was given while pending.
    y_admitted = with_current(wl("y", "team-b", admitted=True,
                                 annotations=CLASS_ANN[evictor_cls]), y_value)
    x = wl("x", "team-a", wait=wait, annotations=CLASS_ANN[victim_cls])
    p2 = compute_plan(replace(snapshot([*admitted(usage), y_admitted, x], teams=TEAMS),
                              cluster_queues=(cq,)), S, NOW)
    assert decision(p2, "team-a/x").target_priority < effective(p2, y_admitted)


def test_admitted_workloads_get_guards_only_where_preemption_can_reach_them() -> None:
    items = [wl("run", admitted=True), wl("p")]
    plain = compute_plan(snapshot(items), S, NOW)
    assert [d.key for d in plain.decisions] == ["team-a/p"]
    for pre in (Preemption(within_cluster_queue="LowerPriority"),
                Preemption(borrow_within_cohort="LowerPriority")):
        cq = replace(preempting(), preemption=pre)
        plan = compute_plan(replace(snapshot(items), cluster_queues=(cq,)), S, NOW)
        guard = decision(plan, "team-a/run")
        assert guard.admitted and guard.target_priority == S.guard(PriorityClass.NORMAL)
        assert guard.hami is None and "state=admitted" in guard.terms
    # Reclaim with Any takes quota whatever the priority: no guard would protect from it
    cq = replace(preempting(), preemption=Preemption(reclaim_within_cohort="Any"))
    plan = compute_plan(replace(snapshot(items), cluster_queues=(cq,)), S, NOW)
    assert [d.key for d in plan.decisions] == ["team-a/p"]


# --------------------------------------------------------------------------------------------
# 4. Stability: fairness that moves only when it matters


@FAST
@given(usage_st, st.integers(1, 3))
def test_hysteresis_keeps_levels_when_a_share_hovers(
    usage: dict[str, tuple[int, int, int]], extra_cpus: int,
) -> None:
    """After the controller wrote a plan, a small usage change (a few CPU cores on a 64-core
    pool) moves no team by a level: no Workload is rewritten."""
    pend = [wl("p", t, wait=60) for t in TEAMS]
    snap = snapshot(admitted(usage) + pend, gpus=16, teams=TEAMS)
    p1 = compute_plan(snap, S, NOW)
    after = written(snap, p1, boost=False)
    tiny = wl("tiny", "team-a", gpu=None, admitted=True,
              resources={"cpu": str(extra_cpus) + "e-3"})
    more = [*after.workloads, tiny]
    p2 = compute_plan(replace(after, workloads=tuple(more)), S, NOW)
    assert targets(p1) == {k: v for k, v in targets(p2).items() if k in targets(p1)}


def test_deactivated_workloads_do_not_make_a_team_present() -> None:
    """W counts teams that compete: a held (spec.active=false) Workload does not."""
    base = [wl("run", "team-a", admitted=True), wl("p", "team-a")]
    held = replace(wl("held", "team-b"), active=False)
    p1 = compute_plan(snapshot(base, teams=TEAMS), S, NOW)
    p2 = compute_plan(snapshot([*base, held], teams=TEAMS), S, NOW)
    assert targets(p1) == targets(p2)
    active = wl("q", "team-b")
    p3 = compute_plan(snapshot([*base, active], teams=TEAMS), S, NOW)
    assert decision(p3, "team-a/p").target_priority < decision(p1, "team-a/p").target_priority


# --------------------------------------------------------------------------------------------
# 5. Accounting, determinism, int32


@FAST
@given(usage_st, st.randoms(use_true_random=False))
def test_deterministic_order_independent_and_duplicates_count_once(
    usage: dict[str, tuple[int, int, int]], rnd: random.Random
) -> None:
    pend = [wl(f"p{i}", TEAMS[i % 4], wait=i * 977.0, annotations=CLASS_ANN[CLASSES[i % 3]])
            for i in range(9)]
    items = admitted(usage) + pend
    snap = replace(snapshot(items, gpus=16, teams=TEAMS), cluster_queues=(preempting(),))
    p1 = compute_plan(snap, S, NOW)
    assert p1 == compute_plan(snap, S, NOW)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    doubled = [*shuffled, items[rnd.randrange(len(items))]]
    p3 = compute_plan(replace(snap, workloads=tuple(doubled)), S, NOW)
    assert p3.decisions == p1.decisions and p3.teams == p1.teams
    assert len(p3.problems) == 1 and "duplicate" in p3.problems[0].message


def test_partially_admitted_gang_is_charged_for_what_was_admitted() -> None:
    from controller.domain import Admission, PodSetAssignment, frozen_resources

    gang = wl("gang", "team-b", admitted=True, count=8)
    psa = PodSetAssignment("main", 2, frozen_resources({GPU: Decimal(2)}), {GPU: "default"})
    gang = replace(gang, admission=Admission("cq", frozen_resources({GPU: Decimal(2)}),
                                             {GPU: "default"}, (psa,)))
    plan = compute_plan(snapshot([gang, wl("p", "team-b")], gpus=16), S, NOW)
    assert plan.teams["team-b"].dominant_share == 2 / 16


@FAST
@given(st.integers(INT32_MIN, INT32_MAX), st.integers(INT32_MIN, INT32_MAX),
       st.floats(0, 100 * 86400), st.integers(0, 10**6))
def test_class_order_survives_any_base_and_the_int32_ceiling(
    base_u: int, base_n: int, wait: float, cap: int
) -> None:
    """A user-chosen base (WorkloadPriorityClass, spec.priority) moves a Workload at most
    BASE_PRIORITY_CAP inside its band: urgent stays above normal at any base, and every value
    fits int32 (in both modes: spec writes the priority, boost mode base + boost = priority)."""
    s = make_settings(base_priority_cap=min(cap, 20000))
    assert s.max_score() <= MAX_BOOST
    u = wl("u", wait=0, priority=base_u, annotations=CLASS_ANN[PriorityClass.URGENT])
    n = wl("n", wait=wait, priority=base_n)
    plan = compute_plan(snapshot([u, n]), s, NOW)
    du, dn = decision(plan, "team-a/u"), decision(plan, "team-a/n")
    assert du.target_priority > dn.target_priority
    for d in (du, dn):
        assert INT32_MIN <= d.target_priority <= INT32_MAX
        assert INT32_MIN <= d.target_boost <= INT32_MAX
        if not d.problems:
            assert d.base_priority + d.target_boost == d.target_priority


@FAST
@given(st.integers(0, 10**9), st.integers(INT32_MIN, INT32_MAX))
def test_override_is_exactly_the_override_whatever_the_base(override: int, base: int) -> None:
    d = compute_plan(snapshot([wl("p", priority=base, annotations={
        PRIORITY_OVERRIDE_ANNOTATION: str(override)})]), S, NOW).decisions[0]
    assert d.target_priority == override
    if not d.problems:  # boost mode cannot express it when override - base leaves int32
        assert base + d.target_boost == override
    else:
        assert "outside int32" in d.problems[0].message


def test_requeued_workload_waits_from_its_eviction() -> None:
    evicted_at = NOW - timedelta(hours=1)
    w = replace(wl("p", wait=3 * 86400), last_eviction=evicted_at)
    d = compute_plan(snapshot([w]), S, NOW).decisions[0]
    assert d.breakdown is not None and d.breakdown.queued_since == evicted_at
    assert d.breakdown.wait_seconds(NOW) == 3600
    creation = make_settings(requeue_timestamp="creation")
    d = compute_plan(snapshot([w]), creation, NOW).decisions[0]
    assert d.breakdown is not None and d.breakdown.wait_seconds(NOW) == 3 * 86400


def test_a_new_teams_first_job_rewrites_no_other_teams_workloads() -> None:
    """50 active teams with varied usage; a 51st team submits its first Job. W moves by 2 %:
    with hysteresis no other team's Workload changes value; without it some would (the
    churn this setting removes)."""
    rnd = random.Random(5)
    teams = [f"t{i:02d}" for i in range(50)]
    items = []
    for t in teams:
        for j in range(rnd.randrange(0, 4)):
            cpus = str(rnd.randrange(1, 9))
            items.append(wl(f"run{j}", t, admitted=True, resources={"cpu": cpus}))
        items.append(wl("p", t, wait=rnd.uniform(0, 86400)))
    snap = snapshot(items, gpus=64, cpu=256, teams=(*teams, "newcomer"))
    for hysteresis, expect_changes in ((0.5, False), (0.0, True)):
        s = make_settings(fairness_hysteresis=hysteresis)
        before = written(snap, compute_plan(snap, s, NOW), boost=False)
        grown = replace(before, workloads=(*before.workloads, wl("first", "newcomer")))
        p1, p2 = compute_plan(before, s, NOW), compute_plan(grown, s, NOW)
        changed = [k for k, v in targets(p1).items() if targets(p2)[k] != v]
        assert bool(changed) is expect_changes, (hysteresis, changed)
