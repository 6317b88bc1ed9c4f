"""Property tests for the priority policy (the properties issue 3 requires)."""

from __future__ import annotations

import math
import random
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wdrf_build import NOW, snapshot, wl
from wdrf_build import settings as make_settings

from controller.config import INT32_MAX, MAX_BOOST, Settings
from controller.domain import APPROVED_ANNOTATION, URGENT_ANNOTATION, PriorityClass, Workload
from controller.plan import Plan, WorkloadDecision
from controller.policy import aging_term, class_term, compute_plan, score

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEAMS = ("team-a", "team-b", "team-c", "team-d")
CLASS_ANN = {
    PriorityClass.URGENT: {URGENT_ANNOTATION: "true"},
    PriorityClass.APPROVED: {APPROVED_ANNOTATION: "true"},
    PriorityClass.NORMAL: {},
}

# Per-team admitted usage: whole GPUs, 25 % slices and CPU cores.
usage_st = st.fixed_dictionaries({
    t: st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 16)) for t in TEAMS
})


def admitted(usage: dict[str, tuple[int, int, int]]) -> list[Workload]:
    out = []
    for team, (whole, slices, cpus) in usage.items():
        for i in range(whole):
            out.append(wl(f"{team}-whole-{i}", team, admitted=True))
        for i in range(slices):
            out.append(wl(f"{team}-slice-{i}", team, admitted=True,
                          resources={"nvidia.com/gpucores": "25",
                                     "nvidia.com/gpumem-percentage": "25"}))
        if cpus:
            out.append(wl(f"{team}-cpu", team, gpu=None, admitted=True,
                          resources={"cpu": str(cpus)}))
    return out


def decision(plan: Plan, key: str) -> WorkloadDecision:
    return next(d for d in plan.decisions if d.key == key)


def position(plan: Plan, key: str) -> int:
    return [d.key for d in plan.decisions].index(key)


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
    plan = compute_plan(snapshot(admitted(usage) + pend, gpus=16, teams=TEAMS), Settings(), NOW)
    u, a, n = (decision(plan, f"{t}/{k}") for t, k in zip(teams, "uan", strict=False))
    assert u.target_priority > a.target_priority > n.target_priority
    assert u.rank < a.rank < n.rank


@FAST
@given(usage_st, st.sampled_from(list(PriorityClass)), st.floats(0, 10 * 86400))
def test_lower_share_ranks_higher_within_a_class(
    usage: dict[str, tuple[int, int, int]], cls: PriorityClass, wait: float
) -> None:
    pend = [wl("p", t, wait=wait, annotations=CLASS_ANN[cls]) for t in TEAMS]
    plan = compute_plan(snapshot(admitted(usage) + pend, gpus=16, teams=TEAMS), Settings(), NOW)
    ds = {t: decision(plan, f"{t}/p") for t in TEAMS}
    for x in TEAMS:
        for y in TEAMS:
            sx, sy = plan.teams[x].dominant_share, plan.teams[y].dominant_share
            if sx < sy:
                assert ds[x].target_priority >= ds[y].target_priority
                fx, fy = ds[x].breakdown, ds[y].breakdown
                assert fx is not None and fy is not None
                if fx.fairness_term != fy.fairness_term:  # quantization may tie close shares
                    assert ds[x].target_priority > ds[y].target_priority
                    assert ds[x].rank < ds[y].rank


@FAST
@given(usage_st, st.sampled_from(TEAMS), st.integers(1, 4), st.booleans())
def test_more_usage_never_raises_rank(
    usage: dict[str, tuple[int, int, int]], team: str, extra: int, fractional: bool
) -> None:
    pend = [wl("p", t, wait=3600) for t in TEAMS]
    base = admitted(usage)
    res = {"nvidia.com/gpucores": "30", "nvidia.com/gpumem-percentage": "30"} if fractional else {}
    more = base + [wl(f"extra-{i}", team, admitted=True, resources=res) for i in range(extra)]
    before = compute_plan(snapshot(base + pend, gpus=16, teams=TEAMS), Settings(), NOW)
    after = compute_plan(snapshot(more + pend, gpus=16, teams=TEAMS), Settings(), NOW)
    key = f"{team}/p"
    assert decision(after, key).target_priority <= decision(before, key).target_priority
    assert position(after, key) >= position(before, key)
    assert after.teams[team].dominant_share >= before.teams[team].dominant_share


@FAST
@given(st.floats(0, 20 * 86400), st.floats(0, 20 * 86400), st.sampled_from(list(PriorityClass)))
def test_priority_never_decreases_with_wait_and_stops_at_max_aging(
    w1: float, w2: float, cls: PriorityClass
) -> None:
    s = Settings()
    lo, hi = sorted((w1, w2))
    assert aging_term(lo, s) <= aging_term(hi, s)
    if lo >= s.max_aging_time:
        assert aging_term(lo, s) == aging_term(hi, s) == aging_term(s.max_aging_time, s)
    plans = [
        compute_plan(snapshot([wl("p", wait=w, annotations=CLASS_ANN[cls])]), s, NOW)
        for w in (lo, hi)
    ]
    assert plans[0].decisions[0].target_priority <= plans[1].decisions[0].target_priority


_S = Settings()


@FAST
@given(
    st.sampled_from(list(PriorityClass)),
    st.integers(0, _S.fairness_levels),
    st.integers(0, _S.fairness_levels),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_starvation_bound(
    later_cls: PriorityClass, level_n: int, level_x: int, n_frac: float, frac: float
) -> None:
    """A normal workload N that has waited less than MAX_AGING_TIME ranks above any X of class
    `later_cls` that arrived at least overtake_window(later_cls) after it, whatever X's share.
    Where that window is infinite (urgent, with the defaults), the bound says so: a fresh X then
    outranks N at any wait, even at the aging cap."""
    s = _S
    level = s.fairness_points // s.fairness_levels
    window = s.overtake_window(later_cls)
    if math.isinf(window):
        assert later_cls is PriorityClass.URGENT  # the defaults bound approved and normal
        assert f"by {later_cls.value} work at any time" in s.starvation_bound(str)
        n_wait = s.max_aging_time * (1 + n_frac)
        assert score(PriorityClass.NORMAL, level_n * level, n_wait, s) < score(
            later_cls, level_x * level, 0, s
        )
        return
    assert window <= s.max_aging_time
    n_wait = window + (s.max_aging_time - 1 - window) * n_frac
    x_wait = (n_wait - window) * frac  # X arrived >= window after N
    assert score(PriorityClass.NORMAL, level_n * level, n_wait, s) > score(
        later_cls, level_x * level, x_wait, s
    )
    for lower in PriorityClass:  # the window also covers every lower class
        if s.class_weight(lower) <= s.class_weight(later_cls):
            assert s.overtake_window(lower) <= window


@FAST
@given(st.floats(0.01, 3.0), st.integers(1, 14), st.integers(10, 2000),
       st.sampled_from(list(PriorityClass)))
def test_configurable_bound_is_stated_and_holds(
    coef: float, days: int, unit: int, later_cls: PriorityClass
) -> None:
    w = Settings().priority_weights
    fair = min(20000, min(w["urgent"] - w["approved"], w["approved"] - w["normal"]) * unit - 1)
    s = make_settings(aging_coefficient=coef, max_aging_time=days * 86400.0,
                      priority_class_unit=unit, fairness_points=fair,
                      fairness_levels=min(50, fair))
    window = s.overtake_window(later_cls)
    if math.isinf(window):
        if later_cls is PriorityClass.URGENT:
            assert "by urgent work at any time" in s.starvation_bound(str) or (
                s.starvation_bound(str).startswith("none")
            )
        else:
            assert s.warnings()
        return
    assert f"{later_cls.value} work arriving within {window}" in s.starvation_bound(str)
    n_wait = window + s.aging_step
    if n_wait >= s.max_aging_time:
        return
    top_x = score(later_cls, s.fairness_points, n_wait - window, s)
    assert score(PriorityClass.NORMAL, 0, n_wait, s) > top_x


@FAST
@given(usage_st, st.randoms(use_true_random=False))
def test_deterministic_and_order_independent(
    usage: dict[str, tuple[int, int, int]], rnd: random.Random
) -> None:
    pend = [wl(f"p{i}", TEAMS[i % 4], wait=i * 977.0,
               annotations=CLASS_ANN[list(PriorityClass)[i % 3]]) for i in range(9)]
    items = admitted(usage) + pend
    snap = snapshot(items, gpus=16, teams=TEAMS)
    p1 = compute_plan(snap, Settings(), NOW)
    p2 = compute_plan(snap, Settings(), NOW)
    assert p1 == p2
    rnd.shuffle(items)
    p3 = compute_plan(snapshot(items, gpus=16, teams=TEAMS), Settings(), NOW)
    assert p3.decisions == p1.decisions


@FAST
@given(usage_st, st.integers(0, 1000), st.floats(0, 1.0))
def test_quantized_unchanged_cycle_changes_nothing(
    usage: dict[str, tuple[int, int, int]], steps: int, frac: float
) -> None:
    """Re-running the same snapshot a little later (no AGING_STEP boundary crossed) changes no
    target value."""
    s = Settings()
    wait = steps * s.aging_step + 1.0
    pend = [wl(f"p{i}", TEAMS[i % 4], wait=wait) for i in range(4)]
    snap = snapshot(admitted(usage) + pend, gpus=16, teams=TEAMS)
    later = NOW + timedelta(seconds=frac * (s.aging_step - 2.0))
    p1, p2 = compute_plan(snap, s, NOW), compute_plan(snap, s, later)
    assert [(d.key, d.target_boost, d.target_priority) for d in p1.decisions] == [
        (d.key, d.target_boost, d.target_priority) for d in p2.decisions
    ]


@FAST
@given(st.integers(-(2**31), 2**31 - 1), st.sampled_from(list(PriorityClass)),
       st.floats(0, 100 * 86400))
def test_values_fit_int32_with_room_for_base(
    base: int, cls: PriorityClass, wait: float
) -> None:
    s = Settings()
    assert s.max_score() <= MAX_BOOST < INT32_MAX // 2
    assert score(cls, s.fairness_points, wait, s) <= s.max_score()
    plan = compute_plan(snapshot([wl("p", wait=wait, priority=base,
                                     annotations=CLASS_ANN[cls])]), s, NOW)
    d = plan.decisions[0]
    assert -(2**31) <= d.target_priority <= 2**31 - 1
    assert -(2**31) <= d.target_boost <= 2**31 - 1
    if abs(base) < 2**30:
        assert d.target_priority == base + d.target_boost


def test_class_terms_are_ordered_with_gaps_above_fairness() -> None:
    s = Settings()
    u, a, n = (class_term(c, s) for c in PriorityClass)
    assert u - a > s.fairness_points and a - n > s.fairness_points


@FAST
@given(usage_st, st.lists(st.floats(1, 4 * 3600), min_size=1, max_size=5),
       st.floats(60, 86400))
def test_with_history_priority_never_decreases_for_an_unchanged_cluster(
    usage: dict[str, tuple[int, int, int]], gaps: list[float], half_life: float
) -> None:
    """Same cluster, clock moving on, decayed history carried along: no pending workload's
    priority goes down (history only decays towards current usage)."""
    s = make_settings(usage_half_life=half_life)
    pend = [wl("p", t, wait=60) for t in TEAMS]
    # An earlier, busier cluster seeds the history.
    busy = admitted({t: (4, 4, 16) for t in TEAMS})
    start = compute_plan(snapshot(busy + pend, gpus=16, teams=TEAMS), s, NOW)
    snap = snapshot(admitted(usage) + pend, gpus=16, teams=TEAMS)
    history, now = start.history, NOW
    last: dict[str, int] | None = None
    for gap in gaps:
        now = now + timedelta(seconds=gap)
        plan = compute_plan(snap, s, now, history=history)
        history = plan.history
        cur = {d.key: d.target_priority for d in plan.decisions}
        if last is not None:
            assert all(cur[k] >= last[k] for k in cur)
        last = cur
