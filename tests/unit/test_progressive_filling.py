"""DRF's progressive filling on the real `compute_plan`: a burst of freed quota, admitted in the
plan's order as Kueue's BestEffortFIFO would, gives each team the weighted DRF allocation; and
admitting one of a team's Workloads leaves its other pending Workloads' values as they were."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.domain import Admission, ClusterQueue, KueueApiVersion, ResourceQuota
from controller.plan import Plan
from controller.policy import compute_plan
from tests.support.builders import NOW, snapshot, wl
from tests.support.builders import settings as make_settings

GI = 1 << 30


def drf_allocation(tasks: dict[str, dict[str, float]], cap: dict[str, float],
                   weights: dict[str, float], limit: int) -> dict[str, int]:
    """Weighted DRF by progressive filling (Ghodsi et al., NSDI 2011): repeatedly give the next
    task to the team with the lowest weighted dominant share whose task still fits."""
    used = dict.fromkeys(cap, 0.0)
    count = dict.fromkeys(tasks, 0)
    share = dict.fromkeys(tasks, 0.0)
    saturated: set[str] = set()
    while len(saturated) < len(tasks):
        team = min((t for t in tasks if t not in saturated), key=lambda t: (share[t], t))
        need = tasks[team]
        if count[team] >= limit or any(used[r] + q > cap[r] + 1e-9 for r, q in need.items()):
            saturated.add(team)
            continue
        for r, q in need.items():
            used[r] += q
        count[team] += 1
        share[team] = max(count[team] * q / cap[r] for r, q in need.items()) / weights[team]
    return count


def admit_in_plan_order(plan: Plan, demands: dict[str, dict[str, float]],
                        cap: dict[str, float]) -> dict[str, int]:
    """Kueue's BestEffortFIFO on freed quota: in priority order, admit what fits."""
    used = dict.fromkeys(cap, 0.0)
    out: dict[str, int] = {}
    for d in plan.pending:
        need = {r: q for r, q in demands[d.key].items() if r in cap}
        if all(used[r] + q <= cap[r] + 1e-9 for r, q in need.items()):
            for r, q in need.items():
                used[r] += q
            out[d.team] = out.get(d.team, 0) + 1
    return out


def _burst(tasks: dict[str, dict[str, str]], cap: dict[str, str], first: str,
           weights: dict[str, float]) -> tuple[dict[str, int], dict[str, int]]:
    """Six one-pod Workloads per team pending (`first`'s created first), the quota held by a
    third team; returns (the plan's admissions once the quota frees, DRF's allocation)."""
    order = [first, *sorted(t for t in tasks if t != first)]
    items = []
    demands: dict[str, dict[str, float]] = {}
    age = 600.0
    for team in order:
        for i in range(6):
            age -= 1
            w = wl(f"{team}-{i}", team, wait=age, gpu=None, resources=tasks[team])
            items.append(w)
            demands[w.key] = {r: float(Decimal(q)) for r, q in tasks[team].items()
                              if r in cap}
    holder = wl("holder", "team-c", gpu=None, resources=cap, admitted=True)
    items.append(replace(holder, admission=Admission("cq", holder.pod_sets[0].per_pod())))
    cq = ClusterQueue("cq", KueueApiVersion.V1BETA2, quotas=tuple(
        ResourceQuota("default", r, Decimal(q)) for r, q in cap.items()))
    plan = compute_plan(snapshot(items, cq=cq, teams=(*tasks, "team-c")),
                        make_settings(team_weights=weights), NOW)
    cap_f = {r: float(Decimal(q)) for r, q in cap.items()}
    task_f = {t: {r: float(Decimal(q)) for r, q in v.items()} for t, v in tasks.items()}
    return (admit_in_plan_order(plan, demands, cap_f),
            drf_allocation(task_f, cap_f, {t: weights.get(t, 1.0) for t in tasks}, 6))


PAPER = {"team-a": {"cpu": "1", "memory": str(4 * GI)}, "team-b": {"cpu": "3", "memory": str(GI)}}
PAPER_CAP = {"cpu": "9", "memory": str(18 * GI)}


@pytest.mark.parametrize("first", ["team-a", "team-b"])
def test_the_drf_papers_example_either_team_first(first: str) -> None:
    got, drf = _burst(PAPER, PAPER_CAP, first, {})
    assert drf == {"team-a": 3, "team-b": 2}  # the paper's answer (section 4)
    assert got == drf


@pytest.mark.parametrize("first", ["team-a", "team-b"])
@pytest.mark.parametrize(("weights", "answer"), [
    ({"team-a": 3.0}, {"team-a": 4, "team-b": 1}),
    ({"team-a": 1.5}, {"team-a": 3, "team-b": 2}),  # ranking a task by the share *after* it
    ({"team-b": 3.0}, {"team-a": 3, "team-b": 2}),  # would give team-a 4 here
])
def test_the_drf_papers_example_weighted(first: str, weights: dict[str, float],
                                         answer: dict[str, int]) -> None:
    got, drf = _burst(PAPER, PAPER_CAP, first, weights)
    assert drf == answer  # weighted progressive filling, worked by hand
    assert got == drf


# --------------------------------------------------------------------------------------------

team_st = st.sampled_from(["team-a", "team-b", "team-c"])
pending_st = st.lists(st.tuples(team_st, st.integers(1, 4), st.floats(0, 7200)),
                      min_size=2, max_size=12)
usage_st = st.dictionaries(team_st, st.integers(0, 6))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pending_st, usage_st)
def test_admitting_one_workload_leaves_its_teams_other_values(
    spec: list[tuple[str, int, float]], usage: dict[str, int],
) -> None:
    items = [wl(f"u-{t}", t, gpu=str(n), admitted=True) for t, n in usage.items() if n]
    items += [wl(f"p{i}", t, gpu=str(g), wait=age) for i, (t, g, age) in enumerate(spec)]
    s = make_settings()
    plan = compute_plan(snapshot(items, gpus=16), s, NOW)
    head = plan.pending[0]
    team = [d for d in plan.pending if d.team == head.team and d.key != head.key]
    after = [replace(w, quota_reserved=True, admitted=True,
                     admission=Admission("cq", w.pod_sets[0].per_pod()))
             if w.key == head.key else w for w in items]
    replan = compute_plan(snapshot(after, gpus=16), s, NOW + timedelta(seconds=5))
    values = {d.key: d.target_priority for d in replan.pending}
    assert {d.key: values[d.key] for d in team} == {d.key: d.target_priority for d in team}


@settings(max_examples=100, deadline=None)
@given(pending_st)
def test_a_teams_later_workload_never_gets_a_better_level(
    spec: list[tuple[str, int, float]],
) -> None:
    items = [wl(f"p{i}", t, gpu=str(g), wait=age) for i, (t, g, age) in enumerate(spec)]
    plan = compute_plan(snapshot(items, gpus=16), make_settings(), NOW)
    by_team: dict[str, list[tuple[float, str, int]]] = {}
    for d in plan.pending:
        assert d.breakdown is not None
        by_team.setdefault(d.team, []).append((d.breakdown.queued_since.timestamp(), d.uid,
                                               d.breakdown.fairness_level))
    for rows in by_team.values():
        rows.sort()  # the team's own order: wait, then UID
        levels = [lvl for _since, _uid, lvl in rows]
        assert levels == sorted(levels, reverse=True)
