"""Reclaim inside a ClusterQueue and team-scoped approval, on the real `compute_plan`: which
admitted Workloads the plan exposes to Kueue's preemption, for whom, and what it never does."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from controller.config import Settings
from controller.domain import (
    APPROVED_ANNOTATION,
    GPU,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    URGENT_ANNOTATION,
    ApprovedScope,
    ClusterQueue,
    ClusterSnapshot,
    KueueApiVersion,
    Preemption,
    PriorityClass,
    ResourceQuota,
    Workload,
)
from controller.encoding import guard_terms
from controller.plan import ExposureReason, Plan, WorkloadDecision, lowers_admitted_value
from controller.policy import compute_plan
from tests.support.builders import NOW, evicted_while_admitted, snapshot, wl, written
from tests.support.builders import settings as make_settings

HOUR = 3600.0
RECLAIM = make_settings(reclaim_enabled=True)
TEAM_SCOPE = make_settings(approved_scope=ApprovedScope.TEAM)
CLASS_ANN = {PriorityClass.URGENT: {URGENT_ANNOTATION: "true"},
             PriorityClass.APPROVED: {APPROVED_ANNOTATION: "true"},
             PriorityClass.NORMAL: {}}


def queue(gpus: int = 8, within: str = "LowerPriority", name: str = "cq",
          cohort: str | None = None) -> ClusterQueue:
    return ClusterQueue(name, KueueApiVersion.V1BETA2, cohort=cohort,
                        quotas=(ResourceQuota("default", GPU, Decimal(gpus)),),
                        preemption=Preemption(within_cluster_queue=within))


def running(name: str, team: str, started_ago: float, gpus: int = 1,
            cls: PriorityClass = PriorityClass.NORMAL, cq: str = "cq") -> Workload:
    w = wl(name, team, gpu=str(gpus), admitted=True, wait=started_ago + 60,
           annotations=CLASS_ANN[cls])
    assert w.admission is not None
    return replace(w, reserved_since=NOW - timedelta(seconds=started_ago),
                   admission=replace(w.admission, cluster_queue=cq))


def waiting(name: str, team: str, wait: float = 60.0, gpus: int = 1,
            cls: PriorityClass = PriorityClass.NORMAL) -> Workload:
    return wl(name, team, gpu=str(gpus), wait=wait, annotations=CLASS_ANN[cls])


def plan_of(items: list[Workload], s: Settings, cq: ClusterQueue | None = None,
            teams: tuple[str, ...] = ("team-a", "team-b")) -> tuple[ClusterSnapshot, Plan]:
    snap = snapshot(items, cq=cq or queue(), teams=teams)
    return snap, compute_plan(snap, s, NOW)


def exposed(plan: Plan) -> dict[str, WorkloadDecision]:
    return {d.key: d for d in plan.decisions
            if d.admitted and d.breakdown is not None and d.breakdown.exposure is not None}


def value(plan: Plan, key: str) -> int:
    return next(d.target_priority for d in plan.decisions if d.key == key)


# --------------------------------------------------------------------------------------------
# Reclaim


def _hog(n: int = 8, started: float = 2 * HOUR) -> list[Workload]:
    """team-a holds every GPU; its later Workloads started later."""
    return [running(f"a{i}", "team-a", started - i * 60) for i in range(n)]


def test_reclaim_exposes_the_most_recently_started_just_enough() -> None:
    items = [*_hog(), waiting("b0", "team-b"), waiting("b1", "team-b"),
             waiting("a-next", "team-a", wait=5 * HOUR)]
    _, plan = plan_of(items, RECLAIM)
    victims = exposed(plan)
    assert set(victims) == {"team-a/a7", "team-a/a6"}  # the two started last
    for key, d in victims.items():
        assert d.breakdown is not None and d.breakdown.exposure is not None
        assert d.breakdown.exposure.reason is ExposureReason.RECLAIM
        assert d.breakdown.exposure.for_teams == ("team-b",)
        assert "state=reclaimable for=team-b" in d.terms
        # team-b's Workloads may preempt it; team-a's own waiting one may not (LowerPriority:
        # Kueue preempts only strictly lower priorities, so an equal value is safe)
        assert value(plan, "team-b/b0") > d.target_priority >= value(plan, "team-a/a-next"), key
        assert "preempts=team-a" in next(x.terms for x in plan.decisions if x.key == "team-b/b0")
    assert not any(d.breakdown and d.breakdown.exposure for d in plan.decisions
                   if d.key not in victims)


def test_off_by_default_and_where_the_queue_does_not_preempt() -> None:
    items = [*_hog(), waiting("b0", "team-b")]
    assert not exposed(plan_of(items, Settings())[1])
    assert not exposed(plan_of(items, RECLAIM, cq=queue(within="Never"))[1])


def test_min_runtime_protects_fresh_work() -> None:
    items = [*_hog(started=20 * 60), waiting("b0", "team-b")]  # 20 min < MIN_RUNTIME 30 min
    assert not exposed(plan_of(items, RECLAIM)[1])
    assert exposed(plan_of(items, make_settings(reclaim_enabled=True, min_runtime=600.0))[1])


def test_budget_counts_the_last_hours_preemptions() -> None:
    items = [*_hog(), *(waiting(f"b{i}", "team-b") for i in range(3))]
    s = make_settings(reclaim_enabled=True, reclaim_budget_per_hour=2)
    assert len(exposed(plan_of(items, s)[1])) == 2
    evicted = replace(waiting("b9", "team-b"), preempted_at=NOW - timedelta(minutes=30))
    assert len(exposed(plan_of([*items, evicted], s)[1])) == 1
    old = replace(evicted, preempted_at=NOW - timedelta(minutes=90))
    assert len(exposed(plan_of([*items, old], s)[1])) == 2
    # Admitted again since (Kueue then clears Preempted=True): still counted, from the
    # re-admission, until an hour after it.
    again = replace(running("b9", "team-b", 20 * 60), preemption_cleared_at=NOW - timedelta(
        minutes=20))
    assert len(exposed(plan_of([*items, again], s)[1])) == 1
    again = replace(again, preemption_cleared_at=NOW - timedelta(minutes=61))
    assert len(exposed(plan_of([*items, again], s)[1])) == 2


def test_no_reclaim_while_the_waiting_work_fits() -> None:
    items = [*_hog(6), waiting("b0", "team-b"), waiting("b1", "team-b")]  # 2 GPUs free
    assert not exposed(plan_of(items, RECLAIM)[1])


def test_no_reclaim_below_the_margin() -> None:
    # team-a 5 of 8 GPUs with W = 2: 1.25 x its entitlement, above 1.2; 4 GPUs would be 1.0.
    items = [*_hog(5), running("b-run", "team-b", HOUR, gpus=3), waiting("b0", "team-b")]
    victims = exposed(plan_of(items, RECLAIM)[1])
    assert len(victims) <= 1
    items = [*_hog(4), running("b-run", "team-b", HOUR, gpus=4), waiting("b0", "team-b")]
    assert not exposed(plan_of(items, RECLAIM)[1])


def test_reclaim_is_same_class_only() -> None:
    items = [*_hog(), waiting("b0", "team-b", cls=PriorityClass.APPROVED)]
    assert not exposed(plan_of(items, RECLAIM)[1])


def test_no_second_reclaim_on_per_team_queues() -> None:
    """Kueue's Fair Sharing reclaims across ClusterQueues; each queue has one team: the plan
    adds nothing."""
    qa, qb = queue(name="cq", cohort="all"), queue(name="cq-b", cohort="all")
    items = [*_hog(), waiting("b0", "team-b")]
    snap = snapshot(items, cq=qa, teams=("team-a",))
    from controller.domain import LocalQueue
    snap = replace(snap, cluster_queues=(qa, qb), local_queues=(
        LocalQueue("team-a", "default", "cq"), LocalQueue("team-b", "default", "cq-b")))
    assert not exposed(compute_plan(snap, RECLAIM, NOW))


def test_a_reclaimed_workload_never_preempts_its_reclaimer_back() -> None:
    items = [*_hog(), waiting("b0", "team-b")]
    _, plan = plan_of(items, RECLAIM)
    (victim,) = exposed(plan)
    # Kueue preempts the victim for b0: b0 runs, the victim waits again.
    after = [w for w in items if w.key not in (victim, "team-b/b0")]
    after.append(running("b0", "team-b", 0))
    after.append(replace(waiting(victim.split("/")[1], "team-a", wait=0),
                         preempted_at=NOW, last_eviction=NOW))
    for later in (0.0, 2 * HOUR, 30 * HOUR):
        snap = snapshot([replace(w, reserved_since=w.reserved_since) for w in after],
                        cq=queue(), teams=("team-a", "team-b"))
        replan = compute_plan(snap, RECLAIM, NOW + timedelta(seconds=later))
        assert not exposed(replan) or all(
            "team-a" not in d.breakdown.exposure.for_teams  # type: ignore[union-attr]
            for d in exposed(replan).values())
        back = value(replan, victim)
        reclaimer = next((d for d in replan.decisions if d.key == "team-b/b0"), None)
        if reclaimer is not None:  # guarded (written) or left at a value above the victim
            assert reclaimer.target_priority > back


def test_a_victim_kueue_is_evicting_is_left_alone_and_covers_its_taker() -> None:
    """Kueue evicted the victim and it still holds its quota while its pods stop: no write
    to it (a guard would take it out of the preemption under way and let it come back above
    its taker), not a victim again, and no other victim for the taker it is leaving for."""
    items = [*_hog(), waiting("b0", "team-b")]
    _, plan = plan_of(items, RECLAIM)
    (victim,) = exposed(plan)
    d = next(x for x in plan.decisions if x.key == victim)
    leaving = [replace(w, evicted=True, preempted_at=NOW, priority=d.target_priority,
                       annotations={**w.annotations, PRIORITY_TERMS_ANNOTATION: d.terms})
               if w.key == victim else w for w in items]
    _, during = plan_of(leaving, RECLAIM)
    assert victim not in {x.key for x in during.decisions if x.admitted}
    assert not exposed(during)
    # a second taker still gets a victim of its own, another one
    _, more = plan_of([*leaving, waiting("b1", "team-b")], RECLAIM)
    assert len(exposed(more)) == 1 and victim not in exposed(more)


def boosts(snap: ClusterSnapshot) -> dict[str, int]:
    """The effective priority each admitted Workload carries (boost mode, base 0)."""
    return {w.key: int(w.annotations.get(KUEUE_PRIORITY_BOOST_ANNOTATION, "0"))
            for w in snap.workloads if w.quota_reserved}


def rewritten(snap: ClusterSnapshot, plan: Plan) -> list[str]:
    """The admitted Workloads `plan` writes: a target other than the value they carry."""
    current = boosts(snap)
    return [d.key for d in plan.decisions if d.admitted and d.target_boost != current[d.key]]


def test_a_workload_evicted_while_guarded_threatens_at_its_new_value_only() -> None:
    """A guarded Workload of the victims' team that Kueue evicted (PodsReadyTimeout) is pending
    again with its guard: the plan lowers it and counts it at its new value, so the exposures
    and guards already written stay as they are (no write withdraws them), and only the
    lowering is written."""
    items = [*_hog(), waiting("b0", "team-b"), waiting("b1", "team-b"),
             waiting("a-next", "team-a", wait=5 * HOUR)]
    snap, plan = plan_of(items, RECLAIM)
    assert len(exposed(plan)) == 2
    snap = written(snap, plan, boost=True)  # exposures and guards written
    guard = RECLAIM.guard(N)
    back = evicted_while_admitted(waiting("a-back", "team-a", wait=2 * HOUR), guard,
                                  guard_terms(N, "team-a", "cq", None, guard))
    again = compute_plan(replace(snap, workloads=(*snap.workloads, back)), RECLAIM, NOW)
    lowered = next(d for d in again.decisions if d.key == "team-a/a-back")
    assert lowered.target_priority < guard
    assert lowers_admitted_value(lowered, back.annotations[PRIORITY_TERMS_ANNOTATION])
    # every admitted decision is the value already written: nothing is guarded or unexposed
    assert not rewritten(snap, again)
    current = boosts(snap)
    # the exposures still expose the victims to team-b only, above the lowered Workload
    for key in exposed(plan):
        assert value(again, "team-b/b0") > current[key] > lowered.target_priority


def test_an_exposure_still_carried_by_a_pending_workload_counts_at_its_new_value() -> None:
    """A victim Kueue preempted for another team comes back pending with its exposure's
    value and terms (`state=reclaimable`): counted at its new value, like a guard."""
    items = [*_hog(), waiting("b0", "team-b"), waiting("a-next", "team-a", wait=5 * HOUR)]
    snap, plan = plan_of(items, RECLAIM)
    snap = written(snap, plan, boost=True)
    (victim,) = exposed(plan)
    d = exposed(plan)[victim]
    # a victim of an earlier cycle, preempted, back with its high exposure value
    high = value(plan, "team-b/b0") + 10
    back = evicted_while_admitted(waiting("a-old", "team-a", wait=HOUR), high, d.terms)
    again = compute_plan(replace(snap, workloads=(*snap.workloads, back)), RECLAIM, NOW)
    assert not rewritten(snap, again)  # the exposure stays, and nothing is guarded
    assert value(again, "team-a/a-old") < d.target_priority


# --------------------------------------------------------------------------------------------
# Team-scoped approval


def test_team_approval_ranks_at_its_teams_head_and_no_higher() -> None:
    items = [waiting("old", "team-a", wait=30 * HOUR), waiting("new", "team-a", wait=60),
             waiting("b0", "team-b", wait=20 * HOUR),
             waiting("ok", "team-a", wait=60, cls=PriorityClass.APPROVED)]
    _, plan = plan_of(items, TEAM_SCOPE)
    ok, old = value(plan, "team-a/ok"), value(plan, "team-a/old")
    assert ok > old > value(plan, "team-a/new")
    # without the approval, the team's head (old) would have had exactly ok - 1
    plain = [w for w in items if w.name != "ok"] + [waiting("ok", "team-a", wait=60)]
    _, before = plan_of(plain, TEAM_SCOPE)
    assert ok == value(before, "team-a/old") + 1
    # global scope: the approved band, above every normal Workload that waited up to 2 d 21 h
    glob = plan_of(items, Settings())[1]
    assert value(glob, "team-a/ok") > value(glob, "team-a/old")


def test_team_approval_preempts_the_teams_own_normal_work_only() -> None:
    items = [running(f"a{i}", "team-a", HOUR - i * 60) for i in range(4)]
    items += [running(f"b{i}", "team-b", HOUR - i * 60) for i in range(4)]
    items += [waiting("ok", "team-a", cls=PriorityClass.APPROVED, gpus=2),
              waiting("a-more", "team-a", wait=40 * HOUR), waiting("b-more", "team-b")]
    _, plan = plan_of(items, TEAM_SCOPE)
    victims = exposed(plan)
    assert set(victims) == {"team-a/a3", "team-a/a2"}  # two GPUs, started last
    for d in victims.values():
        assert d.breakdown is not None and d.breakdown.exposure is not None
        assert d.breakdown.exposure.reason is ExposureReason.TEAM_APPROVAL
        assert value(plan, "team-a/ok") > d.target_priority
        assert d.target_priority >= max(value(plan, "team-a/a-more"), value(plan, "team-b/b-more"))
    # team-b's running work is guarded above the approved Workload (or untouched below none)
    for d in plan.decisions:
        if d.admitted and d.team == "team-b":
            assert d.target_priority > value(plan, "team-a/ok")


def test_team_approval_costs_no_write_while_it_fits() -> None:
    items = [running("a0", "team-a", HOUR), waiting("ok", "team-a", cls=PriorityClass.APPROVED)]
    assert not exposed(plan_of(items, TEAM_SCOPE)[1])


# --------------------------------------------------------------------------------------------
# Properties over random clusters (one ClusterQueue that preempts, four teams)

TEAMS = ("team-a", "team-b", "team-c", "team-d")
N, A, U = PriorityClass.NORMAL, PriorityClass.APPROVED, PriorityClass.URGENT
# Running work, mostly team-a's (so that some team is over its entitlement), mostly normal.
held_st = st.lists(st.tuples(st.sampled_from([0, 0, 0, 1, 2]), st.integers(1, 3),
                             st.floats(0, 5 * HOUR), st.sampled_from([N, N, N, A, U])),
                   min_size=1, max_size=10)
wait_st = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.floats(0, 40 * HOUR),
                             st.sampled_from(list(PriorityClass))), min_size=1, max_size=10)
FAST = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _cluster(held: list[tuple[int, int, float, PriorityClass]],
             wants: list[tuple[int, int, float, PriorityClass]]) -> list[Workload]:
    items = [running(f"r{i}", TEAMS[t], ago, g, cls) for i, (t, g, ago, cls) in enumerate(held)]
    items += [waiting(f"w{i}", TEAMS[t], wait, g, cls)
              for i, (t, g, wait, cls) in enumerate(wants)]
    return items


def _after_write(items: list[Workload], plan: Plan) -> dict[str, int]:
    """Each Workload's effective priority once the plan is written (boost mode)."""
    out = {w.key: w.priority or 0 for w in items}
    out.update({d.key: d.target_priority for d in plan.decisions if not d.leave_unchanged})
    return out


@FAST
@given(held_st, wait_st, st.sampled_from([RECLAIM, TEAM_SCOPE,
                                          make_settings(reclaim_enabled=True,
                                                        approved_scope=ApprovedScope.TEAM)]))
def test_only_the_allowed_can_preempt_and_a_reclaim_never_favours_a_richer_team(
    held: list[tuple[int, int, float, PriorityClass]],
    wants: list[tuple[int, int, float, PriorityClass]], s: Settings,
) -> None:
    """After the plan is written, a pending Workload P ranks above an admitted Workload A only
    if P's class is above what A's class protects (urgent), or A is exposed and P is allowed:
    reclaim - same class, another team below its entitlement, whose usage over entitlement
    once P runs is at most A's team's once A is gone; team approval - P approved, A normal,
    the same team."""
    items = _cluster(held, wants)
    total = 16
    used = {t: 0 for t in TEAMS}
    for t, g, _ago, _cls in held:
        used[TEAMS[t]] += g
    assume(sum(used.values()) <= total)
    _, plan = plan_of(items, s, cq=queue(gpus=total), teams=TEAMS)
    after = _after_write(items, plan)
    event(f"exposures: {bool(exposed(plan))}")
    active = {TEAMS[t] for t, *_ in held} | {TEAMS[t] for t, *_ in wants}
    w_total = len(active)
    by_key = {d.key: d for d in plan.decisions}
    for a in (w for w in items if w.quota_reserved):
        a_cls = next(c for c, ann in CLASS_ANN.items()
                     if ann.items() <= a.annotations.items() and (ann or not any(
                         k in a.annotations for k in (URGENT_ANNOTATION, APPROVED_ANNOTATION))))
        d_a = by_key.get(a.key)
        exposure = d_a.breakdown.exposure if d_a and d_a.breakdown else None
        for p in (w for w in items if not w.quota_reserved):
            d_p = by_key[p.key]
            assert d_p.breakdown is not None
            p_cls = d_p.breakdown.priority_class
            if max(after[p.key], p.priority or 0) <= after[a.key]:
                continue  # LowerPriority: Kueue preempts only strictly lower priorities
            if p_cls is PriorityClass.URGENT and a_cls is not PriorityClass.URGENT:
                continue  # urgent preempts lower classes, as always
            assert exposure is not None, (p.key, a.key)
            if exposure.reason is ExposureReason.TEAM_APPROVAL:
                assert p_cls is PriorityClass.APPROVED and a_cls is PriorityClass.NORMAL
                assert p.namespace == a.namespace
                continue
            assert p_cls is a_cls and p.namespace != a.namespace
            gpus_a = float(a.pod_sets[0].per_pod()[GPU])
            us_p_now = used[p.namespace] / total * w_total
            us_p_after = d_p.breakdown.dominant_share * w_total
            us_a_after = (used[a.namespace] - max(gpus_a, float(p.pod_sets[0].per_pod()[GPU]))
                          ) / total * w_total
            assert us_p_now < 1.0
            assert us_p_after <= us_a_after + 1e-9, (p.key, a.key)


@FAST
@given(held_st, wait_st)
@example(  # a later-started, larger Workload rightly passed over (found by hypothesis)
    held=[(0, 1, 0.0, PriorityClass.NORMAL), (0, 2, 0.0, PriorityClass.NORMAL),
          (0, 2, 0.0, PriorityClass.NORMAL), (0, 2, 1801.0, PriorityClass.NORMAL),
          (0, 3, 1800.0, PriorityClass.NORMAL), (1, 2, 0.0, PriorityClass.NORMAL),
          (1, 3, 0.0, PriorityClass.NORMAL), (2, 1, 0.0, PriorityClass.NORMAL)],
    wants=[(1, 1, 0.0, PriorityClass.URGENT), (1, 1, 0.0, PriorityClass.URGENT),
           (1, 1, 0.0, PriorityClass.NORMAL)])
def test_victims_are_the_most_recently_started_of_their_team_and_class(
    held: list[tuple[int, int, float, PriorityClass]],
    wants: list[tuple[int, int, float, PriorityClass]],
) -> None:
    """Within a team and class, the victims are the Workloads that started last among those
    that ran MIN_RUNTIME: a Workload of the same size that started later and ran long enough
    is a victim too. (A larger one may rightly be passed over: losing it could leave the taker
    above the victim's team, which reclaim never does.)"""
    items = _cluster(held, wants)
    _, plan = plan_of(items, RECLAIM, cq=queue(gpus=16), teams=TEAMS)
    victims = exposed(plan)
    assume(victims)
    cls_of = {i: c for i, (_t, _g, _a, c) in enumerate(held)}
    runs = {w.key: (w.reserved_since, cls_of[int(w.name[1:])]) for w in items
            if w.quota_reserved}
    size = {w.key: w.admission.usage for w in items if w.admission is not None}
    limit = NOW - timedelta(seconds=RECLAIM.min_runtime)
    for key in victims:
        started, cls = runs[key]
        assert started is not None and started <= limit
        for other, (s_other, c_other) in runs.items():
            if (other.split("/")[0] == key.split("/")[0] and c_other is cls
                    and size[other] == size[key]
                    and s_other is not None and started < s_other <= limit):
                assert other in victims, (other, key)
        assert "state=reclaimable" in victims[key].terms


def test_the_plan_and_the_requeued_victim_say_it_was_reclaimed_and_for_whom() -> None:
    from controller.domain import PRIORITY_TERMS_ANNOTATION
    from controller.render import reason

    items = [*_hog(), waiting("b0", "team-b")]
    _, plan = plan_of(items, RECLAIM)
    (victim,) = exposed(plan).values()
    assert reason(victim) == ("reclaimable: team team-a holds 2.00x its entitlement; team-b "
                              "(below theirs) may preempt it")
    name = victim.key.split("/")[1]
    requeued = replace(waiting(name, "team-a", wait=0), preempted_at=NOW, last_eviction=NOW,
                       annotations={PRIORITY_TERMS_ANNOTATION: victim.terms})
    rest = [w for w in items if w.key != victim.key]
    _, replan = plan_of([*rest, requeued], RECLAIM)
    terms = next(d.terms for d in replan.decisions if d.key == victim.key)
    assert terms.endswith(" reclaimed-for=team-b")
    # not preempted (only its guard went back up): no such note
    _, plain = plan_of([*rest, replace(requeued, preempted_at=None)], RECLAIM)
    assert "reclaimed-for" not in next(d.terms for d in plain.decisions if d.key == victim.key)


def test_team_scope_bound_and_guards() -> None:
    n, a = PriorityClass.NORMAL, PriorityClass.APPROVED
    assert TEAM_SCOPE.overtake_window(a) == TEAM_SCOPE.overtake_window(n) + 1
    assert TEAM_SCOPE.guard(a) - 1 == TEAM_SCOPE.guard(n) == (
        TEAM_SCOPE.class_term(n) + 1 + TEAM_SCOPE.band_span() + 1)
    assert TEAM_SCOPE.urgent_preempts()
    assert make_settings(approved_scope=ApprovedScope.TEAM, approved_preempts_normal=True,
                         priority_class_unit=14000).warnings()[-1].startswith(
        "APPROVED_PREEMPTS_NORMAL is ignored")


def test_with_global_approval_waiting_approved_work_holds_a_normal_reclaim_back() -> None:
    """The documented limit: approved work must not preempt normal work in global scope, and
    its band is above every normal value, so no normal reclaimer can outrank the victim."""
    items = [*_hog(), waiting("b0", "team-b"),
             waiting("c-ok", "team-c", wait=0, cls=PriorityClass.APPROVED)]  # b0 waited longer
    teams = ("team-a", "team-b", "team-c")
    assert not exposed(plan_of(items, RECLAIM, teams=teams)[1])
    both = make_settings(reclaim_enabled=True, approved_scope=ApprovedScope.TEAM)
    assert exposed(plan_of(items, both, teams=teams)[1])


def test_exposed_value_by_the_queues_preemption_rule() -> None:
    """LowerPriority: a victim may sit exactly at the highest value that must not take it;
    LowerOrNewerEqualPriority: one above it (an equal, newer one could take it there)."""
    items = [*_hog(), waiting("b0", "team-b"), waiting("a-next", "team-a", wait=5 * HOUR)]
    for within, gap in (("LowerPriority", 0), ("LowerOrNewerEqualPriority", 1)):
        _, plan = plan_of(items, RECLAIM, cq=queue(within=within))
        victims = exposed(plan)
        assert victims, within
        for d in victims.values():
            assert d.target_priority == value(plan, "team-a/a-next") + gap, within
            assert value(plan, "team-b/b0") > d.target_priority


def test_a_taker_is_written_one_point_higher_while_it_may_take() -> None:
    """Kueue retries a parked Workload on a change of its own priority, not of the victim's."""
    items = [*_hog(), waiting("b0", "team-b")]
    _, off = plan_of(items, Settings())
    _, on = plan_of(items, RECLAIM)
    assert value(on, "team-b/b0") == value(off, "team-b/b0") + 1
    assert next(d.terms for d in on.decisions if d.key == "team-b/b0").endswith(
        " preempts=team-a")


def _three_teams(a: int, b: int, c: int) -> list[Workload]:
    """30 GPUs, three teams of weight 1 (10 each), every GPU held: team-a holds `a` (started
    2 h ago and later), team-b `b` and team-c `c` (both running an hour)."""
    return [*_hog(a), *(running(f"b-run{i}", "team-b", HOUR) for i in range(b)),
            *(running(f"c-run{i}", "team-c", HOUR) for i in range(c))]


THREE = ("team-a", "team-b", "team-c")


def test_a_taker_counts_while_its_team_with_the_work_ahead_of_it_is_below_entitlement() -> None:
    """Progressive filling: team-b (4 of its 10) waits with ten 1-GPU Workloads; the first six
    would each start while the team is below its entitlement, the seventh would start at it.
    team-a (20, 2.0x) could lose 8 before its margin, but only six are exposed."""
    items = [*_three_teams(20, 4, 6), *(waiting(f"b{i}", "team-b", wait=600 - i)
                                        for i in range(10))]
    _, plan = plan_of(items, RECLAIM, cq=queue(30), teams=THREE)
    assert set(exposed(plan)) == {f"team-a/a{i}" for i in range(14, 20)}
    # With four GPUs running instead of eight, only two more reach its entitlement.
    more = [*_three_teams(20, 8, 2), *(waiting(f"b{i}", "team-b", wait=600 - i)
                                       for i in range(10))]
    _, plan = plan_of(more, RECLAIM, cq=queue(30), teams=THREE)
    assert set(exposed(plan)) == {"team-a/a19", "team-a/a18"}


def test_victims_for_the_same_waiting_work_come_from_the_most_over_team_alone() -> None:
    """team-a (15) and team-c (13) are both above 1.2x; team-b's two waiting Workloads need
    two GPUs, which team-a, the further above its entitlement, yields alone."""
    items = [*_three_teams(15, 2, 13), waiting("b0", "team-b"), waiting("b1", "team-b")]
    _, plan = plan_of(items, RECLAIM, cq=queue(30), teams=THREE)
    assert set(exposed(plan)) == {"team-a/a14", "team-a/a13"}
    # what the most-over team cannot yield before its margin comes from the next one:
    # team-c (14, 1.4x) can lose two, team-a (13, 1.3x) one; team-b's Workload needs three
    items = [*_three_teams(13, 3, 14), waiting("b0", "team-b", gpus=3)]
    _, plan = plan_of(items, RECLAIM, cq=queue(30), teams=THREE)
    victims = sorted(exposed(plan))
    assert [k.split("/")[0] for k in victims] == ["team-a", "team-c", "team-c"], victims
    assert victims[0] == "team-a/a12"


def test_an_exposure_that_still_works_is_not_rewritten_when_its_takers_change() -> None:
    """The exposure's `for=`/`over=` are as of its write: another team starting to wait (or
    the victim team's usage moving) rewrites nothing while the written value still works."""
    items = [*_three_teams(20, 4, 6), waiting("b0", "team-b")]
    snap, plan = plan_of(items, RECLAIM, cq=queue(30), teams=THREE)
    (victim,) = exposed(plan)
    applied = written(snap, plan, boost=True)
    later = [*applied.workloads, waiting("c0", "team-c", wait=30)]
    snap2 = snapshot(later, cq=queue(30), teams=THREE)
    replan = compute_plan(snap2, RECLAIM, NOW)
    carried = next(w for w in snap2.workloads if w.key == victim)
    d = next((x for x in replan.decisions if x.key == victim), None)
    assert d is None or (d.terms == carried.annotations[PRIORITY_TERMS_ANNOTATION]
                         and victim not in rewritten(snap2, replan))
    # the takers did change: unwritten, the same cluster exposes it for both teams
    fresh = [replace(w, annotations={k: v for k, v in w.annotations.items()
                                     if k != PRIORITY_TERMS_ANNOTATION})
             if w.key == victim else w for w in later]
    d = exposed(compute_plan(snapshot(fresh, cq=queue(30), teams=THREE), RECLAIM, NOW))[victim]
    assert d.breakdown is not None and d.breakdown.exposure is not None
    assert set(d.breakdown.exposure.for_teams) == {"team-b", "team-c"}


def test_reclaimed_for_names_the_team_kueue_preempted_it_for() -> None:
    """Kueue's Preempted condition names the preemptor's UID: the requeued victim's terms name
    that Workload's team, not the teams its exposure was written for."""
    items = [*_three_teams(20, 4, 6), waiting("b0", "team-b")]
    _, plan = plan_of(items, RECLAIM, cq=queue(30), teams=THREE)
    (victim,) = exposed(plan).values()
    name = victim.key.split("/")[1]
    taker = running("c-new", "team-c", 0)
    requeued = replace(waiting(name, "team-a", wait=0), preempted_at=NOW, last_eviction=NOW,
                       evicted=True, preempted_for=taker.uid,
                       annotations={PRIORITY_TERMS_ANNOTATION: victim.terms})
    rest = [w for w in items if w.key not in (victim.key, "team-b/b0")]
    _, replan = plan_of([*rest, taker, requeued], RECLAIM, cq=queue(31), teams=THREE)
    terms = next(d.terms for d in replan.decisions if d.key == victim.key)
    assert terms.endswith(" reclaimed-for=team-c"), terms
    # the preemptor gone from the snapshot: the exposure's own list
    _, replan = plan_of([*rest, requeued], RECLAIM, cq=queue(30), teams=THREE)
    terms = next(d.terms for d in replan.decisions if d.key == victim.key)
    assert terms.endswith(" reclaimed-for=team-b"), terms
