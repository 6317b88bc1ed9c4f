"""Incremental plans equal full plans: random event sequences on a cluster of several pools
(cohorts, a lone ClusterQueue, Workloads whose queue is unknown), compared with `compute_plan`
on the whole snapshot after every event; and which pools each event replans."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.config import AUTO_TEAM_WEIGHTS, Settings
from controller.domain import (
    APPROVED_ANNOTATION,
    GPU,
    GPU_FRACTION_ANNOTATION,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    URGENT_ANNOTATION,
    Admission,
    ApprovedScope,
    ClusterQueue,
    ClusterSnapshot,
    InputProblem,
    JobInfo,
    KueueApiVersion,
    LocalQueue,
    ObjectRef,
    Preemption,
    PriorityClass,
    QuotaCheck,
    ResourceQuota,
    TeamSource,
    Workload,
    frozen_resources,
)
from controller.incremental import IncrementalPlanner
from controller.policy import PlanMemo, compute_plan
from tests.support.builders import NOW, wl
from tests.support.builders import settings as make_settings

NAMESPACES = ("team-0", "team-1", "team-2", "team-3")
QUEUES = ("a1", "a2", "b1", "solo")  # cohorts A (a1, a2) and B (b1); solo has none
LOCAL = ("q0", "q1", "q2")  # + "ghost" (an unknown ClusterQueue) and "none" (no LocalQueue)
SETTINGS = {
    "default": Settings(),
    "reclaim": make_settings(reclaim_enabled=True, min_runtime=600.0, reclaim_margin=0.0,
                             approved_scope=ApprovedScope.TEAM),
    "weights": make_settings(team_weights={"team-0": 2.0, "team-9": 1.0}),
    "auto": make_settings(team_weights=AUTO_TEAM_WEIGHTS),
}
ANNOTATIONS: list[dict[str, str]] = [
    {}, {URGENT_ANNOTATION: "true"}, {APPROVED_ANNOTATION: "true"},
    {PRIORITY_OVERRIDE_ANNOTATION: "5000"}, {URGENT_ANNOTATION: "yes"},
    {GPU_FRACTION_ANNOTATION: "0.5"},  # HAMi: blocked where its ClusterQueue lacks gpucores
]


def cq(name: str, cohort: str | None, gpus: int = 4, within: str = "LowerPriority",
       weight: int | None = None, cores: bool = False) -> ClusterQueue:
    return ClusterQueue(
        name, KueueApiVersion.V1BETA2,
        quotas=(ResourceQuota("default", GPU, Decimal(gpus)),
                ResourceQuota("default", "cpu", Decimal(32)),
                *([ResourceQuota("default", GPUCORES, Decimal(100 * gpus)),
                   ResourceQuota("default", GPUMEM_PERCENTAGE, Decimal(100 * gpus))]
                  if cores else [])),
        cohort=cohort, preemption=Preemption(within_cluster_queue=within),
        fair_sharing_weight=None if weight is None else Decimal(weight))


class World:
    """The objects of a cluster by key, replaced in place as an informer cache does."""

    def __init__(self) -> None:
        self.now = NOW
        self.queues = {"a1": cq("a1", "A"), "a2": cq("a2", "A", within="Never"),
                       "b1": cq("b1", "B", weight=2), "solo": cq("solo", None)}
        self.local: dict[str, LocalQueue] = {}
        for i, ns in enumerate(NAMESPACES):
            for j, name in enumerate(LOCAL):
                self.local[f"{ns}/{name}"] = LocalQueue(ns, name, QUEUES[(i + j) % 4])
            self.local[f"{ns}/ghost"] = LocalQueue(ns, "ghost", "gone")
        self.workloads: dict[str, Workload] = {}
        self.jobs: dict[str, JobInfo] = {}
        self.problems: tuple[InputProblem, ...] = ()
        self.serial = 0

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            workloads=tuple(self.workloads.values()), cluster_queues=tuple(self.queues.values()),
            local_queues=tuple(self.local.values()), jobs=tuple(self.jobs.values()),
            problems=self.problems, quota_check=QuotaCheck())

    def cluster_queue_of(self, w: Workload) -> str | None:
        lq = self.local.get(f"{w.namespace}/{w.queue_name}")
        return lq.cluster_queue if lq else None

    def add(self, ns: str, queue: str, cls: int, wait: float, gpus: int, owned: bool) -> None:
        self.serial += 1
        name = f"w{self.serial}"
        w = wl(name, ns, wait=wait, gpu=str(gpus), queue=queue, annotations=ANNOTATIONS[cls],
               owner=name if owned else None)
        w = replace(w, created=self.now - timedelta(seconds=wait))
        self.workloads[w.key] = w
        if owned:
            self.jobs[w.key] = JobInfo(ns, name, f"job-{ns}-{name}")

    def admit(self, w: Workload) -> None:
        where = self.cluster_queue_of(w) or "gone"
        usage = frozen_resources({GPU: w.pod_sets[0].containers[0].resources[GPU]})
        self.workloads[w.key] = replace(
            w, quota_reserved=True, admitted=True, admission=Admission(where, usage),
            reserved_since=self.now, resource_version=self.version(), preempted_at=None,
            evicted=False, preempted_for="",
            # Kueue clears a Preempted=True condition on re-admission, stamped now
            preemption_cleared_at=self.now if w.preempted_at else w.preemption_cleared_at)

    def version(self) -> str:
        self.serial += 1
        return str(self.serial)


def pick(data: st.DataObject, items: dict[str, Any]) -> Any:
    return items[data.draw(st.sampled_from(sorted(items)))] if items else None


def step(data: st.DataObject, world: World, last: Any) -> str:
    """One random event; returns its name (for failure messages)."""
    event = data.draw(st.sampled_from([
        "add", "add", "add", "admit", "finish", "annotate", "write", "preempt", "evict",
        "deactivate",
        "job", "local", "queue", "clock", "clock", "problem", "stand-in", "nothing"]))
    w = pick(data, world.workloads)
    if event == "add" or w is None:
        world.add(data.draw(st.sampled_from(NAMESPACES)),
                  data.draw(st.sampled_from([*LOCAL, *LOCAL, "ghost", "none"])),
                  data.draw(st.integers(0, len(ANNOTATIONS) - 1)),
                  data.draw(st.floats(0, 10 * 86400)), data.draw(st.integers(1, 3)),
                  data.draw(st.booleans()))
        return "add"
    if event == "admit" and not w.quota_reserved:
        world.admit(w)
    elif event == "finish":
        if data.draw(st.booleans()):
            del world.workloads[w.key]
        else:
            world.workloads[w.key] = replace(w, finished=True, resource_version=world.version())
    elif event == "annotate":
        ann = dict(w.annotations) | ANNOTATIONS[data.draw(st.integers(0, len(ANNOTATIONS) - 1))]
        world.workloads[w.key] = replace(w, annotations=ann, resource_version=world.version())
    elif event == "write" and last is not None:  # the controller's writes, read back
        for d in last.decisions:
            if d.leave_unchanged or not d.terms or data.draw(st.booleans()):
                continue
            cur = world.workloads.get(d.key)
            if cur is not None:
                ann = dict(cur.annotations) | {PRIORITY_TERMS_ANNOTATION: d.terms,
                                               KUEUE_PRIORITY_BOOST_ANNOTATION: str(d.target_boost)}
                world.workloads[d.key] = replace(cur, annotations=ann,
                                                 resource_version=world.version())
    elif event == "preempt" and w.quota_reserved:
        world.workloads[w.key] = replace(
            w, quota_reserved=False, admitted=False, admission=None, preempted_at=world.now,
            last_eviction=world.now, reserved_since=None, resource_version=world.version())
    elif event == "evict" and w.quota_reserved:
        # Kueue evicts it for a pending Workload (named in its Evicted condition), of any
        # pool: its pods are stopping, it still holds its quota
        waiting = {k: p for k, p in world.workloads.items() if not p.quota_reserved}
        p = pick(data, waiting)
        world.workloads[w.key] = replace(
            w, evicted=True, preempted_for=p.uid if p is not None else "",
            preempted_at=world.now, last_eviction=world.now, resource_version=world.version())
    elif event == "deactivate":
        world.workloads[w.key] = replace(w, active=not w.active, resource_version=world.version())
    elif event == "job" and world.jobs:
        j = pick(data, world.jobs)
        ann = ANNOTATIONS[data.draw(st.integers(0, len(ANNOTATIONS) - 1))]
        world.jobs[f"{j.namespace}/{j.name}"] = replace(j, annotations=ann)
    elif event == "local":
        lq = pick(data, world.local)
        world.local[lq.key] = replace(lq, cluster_queue=data.draw(
            st.sampled_from([*QUEUES, "gone"])))
    elif event == "queue":
        q = pick(data, world.queues)
        change = data.draw(st.sampled_from(["gpus", "cohort", "within", "weight", "cores"]))
        if change == "cores":  # covers HAMi's resources or not: a fraction is blocked or not
            q = replace(q, quotas=cq(q.name, q.cohort, cores=not any(
                r.resource == GPUCORES for r in q.quotas)).quotas)
        elif change == "gpus":
            q = cq(q.name, q.cohort, data.draw(st.integers(0, 8)),
                   q.preemption.within_cluster_queue)
        elif change == "cohort":
            q = replace(q, cohort=data.draw(st.sampled_from(["A", "B", None])))
        elif change == "within":
            q = replace(q, preemption=Preemption(within_cluster_queue=data.draw(
                st.sampled_from(["Never", "LowerPriority"]))))
        else:
            q = replace(q, fair_sharing_weight=Decimal(data.draw(st.integers(1, 3))))
        world.queues[q.name] = q
    elif event == "clock":
        world.now += timedelta(seconds=data.draw(st.sampled_from([1.0, 599.0, 601.0, 3601.0,
                                                                  86400.0, 7 * 86400.0])))
    elif event == "stand-in":  # a class stand-in at a value these settings do not need
        world.workloads[w.key] = replace(
            w, priority_class_name="wdrf-normal", workload_priority_class=True,
            priority=data.draw(st.integers(-5, 5)), resource_version=world.version())
    elif event == "problem":
        world.problems = (*world.problems, InputProblem(
            ObjectRef("Workload", w.name, w.namespace), "spec.podSets", "x", "bad"))
    return event


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(["reclaim", *sorted(SETTINGS)]))
def test_incremental_plans_equal_full_plans_after_every_event(
    data: st.DataObject, which: str,
) -> None:
    s = SETTINGS[which]
    world = World()
    # A team over its share (admitted up to 20 minutes ago) and others waiting in the same
    # ClusterQueue (a1 or b1): reclaim (MIN_RUNTIME 10 minutes) has victims as the clock moves.
    (owner, mine), (taker, theirs) = data.draw(st.sampled_from([
        (("team-0", "q0"), ("team-3", "q1")), (("team-1", "q1"), ("team-2", "q0"))]))
    for _ in range(data.draw(st.integers(0, 6))):
        world.add(owner, mine, 0, 0.0, data.draw(st.integers(2, 3)), False)
        w = world.workloads[next(reversed(world.workloads))]
        world.admit(w)
        started = world.now - timedelta(seconds=data.draw(st.integers(0, 1200)))
        world.workloads[w.key] = replace(world.workloads[w.key], reserved_since=started)
    for _ in range(data.draw(st.integers(0, 3))):
        world.add(taker, theirs, 0, 60.0, data.draw(st.integers(1, 3)), False)
    planner = IncrementalPlanner()
    last = None
    for i in range(data.draw(st.integers(5, 25))):
        event = step(data, world, last)
        snap = world.snapshot()
        full = compute_plan(snap, s, world.now)
        incremental = planner.plan(snap, s, world.now)
        assert planner.fallback == ""
        assert incremental == full, (i, event)
        last = full


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_memo_reused_across_cycles_gives_the_plan_without_it(data: st.DataObject) -> None:
    """One `PlanMemo` through a random event sequence, the settings (and with them the card
    memory, classes, weights, team scope) switching between cycles: every plan equals the one
    computed without the memo."""
    world = World()
    memo = PlanMemo()
    last = None
    # (the team source as well: a Member's team depends on it)
    choices = {**SETTINGS, "by-queue": make_settings(team_source=TeamSource.LOCAL_QUEUE)}
    for _ in range(data.draw(st.integers(3, 20))):
        for _ in range(data.draw(st.integers(0, 3))):
            event = step(data, world, last)
        s = choices[data.draw(st.sampled_from(sorted(choices)))]
        if data.draw(st.booleans()):
            s = replace(s, gpu_memory_mib=data.draw(st.sampled_from([0, 16384, 81920])))
        snap = world.snapshot()
        full = compute_plan(snap, s, world.now)
        assert compute_plan(snap, s, world.now, memo=memo) == full, event
        last = full


def test_a_memo_is_dropped_where_a_workload_or_what_it_reads_changes() -> None:
    """The memo keeps what a Workload object gave; a new object, an owner Job changed, or an
    input problem on it is read again."""
    world = World()
    for i, ns in enumerate(NAMESPACES * 2):
        world.add(ns, LOCAL[i % 3], 0, 60.0 * i, 1, owned=True)
    s = Settings()
    memo = PlanMemo()

    def check() -> None:
        snap = world.snapshot()
        assert compute_plan(snap, s, world.now, memo=memo) == compute_plan(snap, s, world.now)

    check()
    check()  # everything from the memo
    j = next(iter(world.jobs.values()))
    world.jobs[f"{j.namespace}/{j.name}"] = replace(j, annotations={URGENT_ANNOTATION: "true"})
    check()
    w = next(iter(world.workloads.values()))
    world.problems = (InputProblem(ObjectRef("Workload", w.name, w.namespace), "spec", "x",
                                   "bad"),)
    check()
    world.workloads[w.key] = replace(w, annotations={APPROVED_ANNOTATION: "true"})
    check()
    world.now += timedelta(days=7)  # a rebase: every score moves
    check()


def test_a_memo_keeps_members_only_while_their_queues_and_owners_are_equal() -> None:
    """A memoised plan reads its Members in bulk while the LocalQueues, ClusterQueues and
    owners are equal; one of those changed (a LocalQueue moved to another ClusterQueue, an
    owner Job's labels read for the team), the plan still equals the one without a memo."""
    world = World()
    for i, ns in enumerate(NAMESPACES * 3):
        world.add(ns, LOCAL[i % 3], i % len(ANNOTATIONS), 60.0 * i, 1 + i % 3, owned=True)
    for w in list(world.workloads.values())[::4]:
        world.admit(w)
    memo = PlanMemo()
    s = make_settings(team_source=TeamSource.LABEL, team_label_key="team")

    def check() -> None:
        snap = world.snapshot()
        assert compute_plan(snap, s, world.now, memo=memo) == compute_plan(snap, s, world.now)

    check()
    check()
    lq = world.local["team-1/q1"]
    world.local[lq.key] = replace(lq, cluster_queue="b1" if lq.cluster_queue != "b1" else "a1")
    check()
    j = next(iter(world.jobs.values()))
    world.jobs[f"{j.namespace}/{j.name}"] = replace(j, labels={"team": "elsewhere"})
    check()
    check()


def test_a_memoised_hami_decision_follows_its_cluster_queue() -> None:
    """A pending Workload's HAMi decision comes from the memo only while its ClusterQueue is
    equal: one that comes to cover gpucores and gpumem-percentage unblocks its fraction."""
    s = Settings()
    world = World()
    world.add("team-0", "q0", 5, 60.0, 1, owned=False)  # a GPU fraction, team-0/q0 -> a1
    w = next(iter(world.workloads.values()))
    memo = PlanMemo()

    def blocked() -> str:
        snap = world.snapshot()
        plan = compute_plan(snap, s, world.now, memo=memo)
        assert plan == compute_plan(snap, s, world.now)
        hami = next(d.hami for d in plan.decisions if d.key == w.key)
        assert hami is not None
        return hami.fraction_blocked

    assert blocked()
    assert blocked()
    world.queues["a1"] = cq("a1", "A", cores=True)
    assert blocked() == ""
    world.queues["a1"] = cq("a1", "A")
    assert blocked()


def test_a_memoised_guard_follows_its_cluster_queue() -> None:
    """An admitted Workload's guard decision comes from the memo only while its ClusterQueue
    is the same: one holding quota without `status.admission` follows its LocalQueue, here to
    another ClusterQueue of the same cohort (same pool, team and guard)."""
    s = Settings()
    world = World()
    world.add("team-0", "q0", 0, 60.0, 1, owned=False)  # team-0/q0 -> a1 (cohort A)
    w = next(iter(world.workloads.values()))
    at_guard = str(s.guard(PriorityClass.NORMAL) - (w.priority or 0))
    world.workloads[w.key] = replace(w, quota_reserved=True, admitted=True, admission=None,
                                     annotations={KUEUE_PRIORITY_BOOST_ANNOTATION: at_guard})
    memo = PlanMemo()

    def queue() -> str | None:
        snap = world.snapshot()
        plan = compute_plan(snap, s, world.now, memo=memo)
        assert plan == compute_plan(snap, s, world.now)
        return next(d.cluster_queue for d in plan.decisions if d.key == w.key)

    assert queue() == "a1"
    assert queue() == "a1"
    world.local["team-0/q0"] = replace(world.local["team-0/q0"], cluster_queue="a2")
    assert queue() == "a2"


def test_only_the_changed_pool_is_planned_again() -> None:
    world = World()
    for i, ns in enumerate(NAMESPACES * 3):
        world.add(ns, LOCAL[i % 3], 0, 60.0 * i, 1, owned=True)
    world.add("team-0", "none", 0, 5.0, 1, owned=False)  # pool "-"
    planner = IncrementalPlanner()
    s = Settings()
    planner.plan(world.snapshot(), s, world.now)
    assert planner.replanned == ("-", "cohort/A", "cohort/B", "cq/solo")

    def check(expected: tuple[str, ...]) -> None:
        snap = world.snapshot()
        assert planner.plan(snap, s, world.now) == compute_plan(snap, s, world.now)
        assert planner.replanned == expected

    world.now += timedelta(hours=1)  # the clock alone moves nothing
    check(())
    w = next(w for w in world.workloads.values() if world.cluster_queue_of(w) == "b1")
    world.workloads[w.key] = replace(w, annotations={URGENT_ANNOTATION: "true"})
    check(("cohort/B",))
    j = next(j for j in world.jobs.values()
             if world.cluster_queue_of(world.workloads[f"{j.namespace}/{j.name}"]) == "solo")
    world.jobs[f"{j.namespace}/{j.name}"] = replace(j, annotations={APPROVED_ANNOTATION: "true"})
    check(("cq/solo",))
    world.queues["a2"] = cq("a2", "A", gpus=16)
    check(("-", "cohort/A"))  # `-` is charged against the whole cluster's capacity
    world.now += timedelta(days=7)  # a rebase: every pending value moves
    check(("-", "cohort/A", "cohort/B", "cq/solo"))


def test_reclaim_replans_a_pool_when_a_workload_reaches_min_runtime() -> None:
    world = World()
    world.add("team-0", "q0", 0, 60.0, 1, owned=False)
    world.admit(next(iter(world.workloads.values())))
    s = SETTINGS["reclaim"]
    planner = IncrementalPlanner()
    planner.plan(world.snapshot(), s, world.now)
    world.now += timedelta(seconds=599)
    planner.plan(world.snapshot(), s, world.now)
    assert planner.replanned == ()
    world.now += timedelta(seconds=2)  # MIN_RUNTIME (600 s) reached
    planner.plan(world.snapshot(), s, world.now)
    assert planner.replanned == ("cohort/A",)


def test_reclaim_replans_a_pool_when_a_readmitted_preemption_leaves_the_budget() -> None:
    world = World()
    world.add("team-0", "q0", 0, 60.0, 1, owned=False)
    w = next(iter(world.workloads.values()))
    world.admit(replace(w, preempted_at=world.now - timedelta(hours=2)))
    s = SETTINGS["reclaim"]
    planner = IncrementalPlanner()
    planner.plan(world.snapshot(), s, world.now)
    world.now += timedelta(seconds=601)  # past MIN_RUNTIME
    planner.plan(world.snapshot(), s, world.now)
    world.now += timedelta(seconds=2998)
    planner.plan(world.snapshot(), s, world.now)
    assert planner.replanned == ()
    world.now += timedelta(seconds=2)  # an hour after the re-admission: out of the budget
    planner.plan(world.snapshot(), s, world.now)
    assert planner.replanned == ("cohort/A",)


def test_what_cannot_be_planned_by_pool_is_planned_whole() -> None:
    world = World()
    world.add("team-0", "q0", 0, 60.0, 1, owned=False)
    world.add("team-1", "q0", 0, 60.0, 1, owned=False)
    planner = IncrementalPlanner()
    history = make_settings(usage_half_life=3600.0)
    snap = world.snapshot()
    assert planner.plan(snap, history, world.now) == compute_plan(snap, history, world.now)
    assert "USAGE_HALF_LIFE" in planner.fallback
    a, b = world.workloads.values()
    snap = replace(snap, workloads=(a, replace(b, uid=a.uid)))
    assert planner.plan(snap, Settings(), world.now) == compute_plan(snap, Settings(), world.now)
    assert "one UID" in planner.fallback
    planner.plan(world.snapshot(), Settings(), world.now)
    assert planner.fallback == "" and planner.replanned == ("cohort/A",)


def test_workloads_added_or_removed_keep_the_others_in_their_pools() -> None:
    """A Workload added at the end or removed from the middle (the others' positions move):
    only its pool is planned again; one that repeats a UID or a name plans the whole; and
    the class stand-ins' warnings follow the moved positions."""
    world = World()
    for i, ns in enumerate(NAMESPACES * 2):
        world.add(ns, LOCAL[i % 3], 0, 60.0 * i, 1, owned=False)
    s = Settings()
    planner = IncrementalPlanner()

    def check(snap: ClusterSnapshot) -> None:
        assert planner.plan(snap, s, world.now) == compute_plan(snap, s, world.now)

    check(world.snapshot())
    first, second, third = list(world.workloads)[:3]
    for key in (second, third):  # class stand-ins at a value these settings do not need
        world.workloads[key] = replace(world.workloads[key], priority_class_name="wdrf-normal",
                                       workload_priority_class=True, priority=3)
    check(world.snapshot())
    assert planner.plan(world.snapshot(), s, world.now).warnings == compute_plan(
        world.snapshot(), s, world.now).warnings
    del world.workloads[first]  # gone from the middle: the others move down
    check(world.snapshot())
    world.workloads[third] = replace(world.workloads[third], priority=4)  # moved, changed
    check(world.snapshot())
    del world.workloads[second]
    check(world.snapshot())
    world.add("team-2", "q1", 0, 5.0, 2, owned=False)  # added at the end
    check(world.snapshot())
    assert planner.fallback == "" and len(planner.replanned) == 1
    same = next(iter(world.workloads.values()))
    for twin in (replace(same, name="twin"), replace(same, uid="uid-twin")):
        snap = world.snapshot()
        snap = replace(snap, workloads=(*snap.workloads, twin))
        check(snap)
        assert "one UID or name" in planner.fallback
        check(world.snapshot())
        assert planner.fallback == ""


def test_a_plan_does_not_move_with_the_clock() -> None:
    """Between rebases (and reclaim instants) the same snapshot gives the same decisions: what
    lets a pool's part be reused."""
    world = World()
    for i, ns in enumerate(NAMESPACES):
        world.add(ns, "q0", i % 3, 3600.0 * i, 1, owned=False)
    world.admit(next(iter(world.workloads.values())))
    snap = world.snapshot()
    first = compute_plan(snap, Settings(), world.now)
    later: datetime = world.now + timedelta(hours=5)
    assert compute_plan(snap, Settings(), later).decisions == first.decisions
