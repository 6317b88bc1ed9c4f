"""Head-first writes: the order in which a short write budget is spent, and how far each
ClusterQueue's current order already is the plan's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from controller.domain import PriorityClass
from controller.live.api import WORKLOADS, ReadOnlyTransport
from controller.live.apply import APPLIED, Applier, ApplyReport, Outcome, OutcomeHook
from controller.live.diff import Change, Diff, diff_priority
from controller.live.events import EventRecorder
from controller.live.metrics import Metrics
from controller.live.writer import CycleWriter, landing_order, pending_queue
from controller.plan import (
    Plan,
    PriorityBreakdown,
    PriorityMode,
    WorkloadDecision,
    current_positions,
    head_first,
    pool_of,
    positions_right,
)
from tests.support.fake import FakeApi

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def dec(key: str, cq: str, rank: int, current: int = 0, target: int = 0, pool: str = "",
        admitted: bool = False, since: int = 0) -> WorkloadDecision:
    """A decision of a pending (rank >= 0) or admitted Workload; `since` in minutes."""
    breakdown = PriorityBreakdown(
        priority_class=PriorityClass.NORMAL, class_weight=0, class_term=0, team="t",
        pool=pool or f"cq/{cq}", dominant_resource=None, dominant_share=0.0, fairness_level=0,
        fairness_term=0, queued_since=T0 + timedelta(minutes=since),
        reference=T0, aging_term=0, base=0, base_term=0, override=None, priority=target,
        guard=admitted)
    return WorkloadDecision(
        key=key, uid=f"uid-{key}", cluster_queue=cq, team="t", rank=-1 if admitted else rank,
        base_priority=0, current_priority=current, current_boost=None, target_boost=target,
        target_priority=target, breakdown=breakdown, admitted=admitted)


def keys(writes: list[WorkloadDecision], plan: list[WorkloadDecision]) -> list[str]:
    return [d.key for d in head_first(writes, lambda d: d, plan)]


def queue(cq: str, n: int, pool: str = "", values: list[int] | None = None,
          ) -> list[WorkloadDecision]:
    """`n` pending Workloads planned in key order (a cq0 first), none written yet unless
    `values` gives their current values; created in reverse order, so that with equal current
    values Kueue's order is the reverse of the plan's."""
    return [dec(f"{cq}{i}", cq, i, current=(values or [0] * n)[i], target=1000 - i,
                pool=pool, since=n - i) for i in range(n)]


def test_queues_are_interleaved_head_first() -> None:
    a, b = queue("a", 3), queue("b", 2)
    plan = a + b
    # every Workload is at its planned slot or nearer the head in Kueue's current order: the
    # slots are 0,1,0 for a (a2 is at current position 0) and 0,0 for b
    assert keys(plan, plan) == ["a0", "a2", "b0", "b1", "a1"]


def test_planned_and_current_positions_both_count() -> None:
    # written values put a3 at Kueue's head although the plan puts it last: its demotion is
    # as urgent as a0's raise; a1 and a2 are already where the plan wants them
    plan = queue("a", 4, values=[0, 900, 800, 5000])
    assert current_positions(plan) == {"a3": 0, "a1": 1, "a2": 2, "a0": 3}
    assert keys([plan[0], plan[3]], plan) == ["a0", "a3"]  # both slot 0, queue then input
    assert keys([plan[3], plan[0]], plan) == ["a3", "a0"]


def test_deep_writes_come_after_every_queues_head() -> None:
    plan = queue("a", 50) + queue("b", 50, values=[1000 - i for i in range(50)])
    # b is written already except its position 40; a is not written at all (reverse order)
    writes = [*plan[:50], plan[90]]
    plan[90] = writes[-1] = dec("b40", "b", 40, current=0, target=960, since=10)
    order = keys(writes, plan)
    assert order.index("b40") > order.index("a0")
    assert order.index("b40") > order.index("a49")  # a49 is at a's current head (slot 0)


def test_a_guard_goes_before_the_first_write_of_its_pool() -> None:
    a = queue("a", 3, pool="cohort/x", values=[0, 0, 990])
    b = queue("b", 2, pool="cohort/y")
    guard_x = dec("gx", "a", -1, pool="cohort/x", admitted=True, target=5000)
    guard_y = dec("gy", "b", -1, pool="cohort/y", admitted=True, target=5000)
    guard_z = dec("gz", "c", -1, pool="cohort/z", admitted=True, target=5000)
    plan = [*a, *b, guard_x, guard_y, guard_z]
    order = keys([a[0], b[0], b[1], guard_x, guard_y, guard_z], plan)
    # z has no pending write: its guard goes first (written values may already outrank it)
    assert order[0] == "gz"
    assert order.index("gx") < order.index("a0")
    assert order.index("gy") < order.index("b0")


def test_guard_of_a_pool_whose_first_write_is_deep_waits_for_other_heads() -> None:
    a = queue("a", 10, pool="cohort/x", values=[1000 - i for i in range(10)])
    b = queue("b", 1, pool="cohort/y")
    a[7] = dec("a7", "a", 7, current=0, target=993, pool="cohort/x")
    guard = dec("gx", "a", -1, pool="cohort/x", admitted=True, target=5000)
    plan = [*a, *b, guard]
    assert keys([a[7], b[0], guard], plan) == ["b0", "gx", "a7"]


def test_positions_right_counts_the_leading_positions_in_the_plans_order() -> None:
    plan = queue("a", 4, values=[999, 998, 0, 1])  # a0, a1 right; then a3 before a2
    assert positions_right(plan, current_positions(plan)) == 2
    done = queue("a", 4, values=[999, 998, 997, 996])
    assert positions_right(done, current_positions(done)) == 4
    fresh = queue("a", 4)  # nothing written: Kueue's order is the reverse of the plan's
    assert positions_right(fresh, current_positions(fresh)) == 0


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[WorkloadDecision], list[WorkloadDecision]]:
    """A plan over a few pools and queues, some written; the writes are a random subset."""
    plan: list[WorkloadDecision] = []
    for q in range(draw(st.integers(1, 4))):
        pool = f"cohort/{draw(st.integers(0, 2))}"
        n = draw(st.integers(0, 8))
        values = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
        since = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
        plan += [dec(f"q{q}-{i}", f"q{q}", i, current=values[i], target=100 - i, pool=pool,
                     since=since[i]) for i in range(n)]
        plan += [dec(f"q{q}-g{i}", f"q{q}", -1, pool=pool, admitted=True, target=500)
                 for i in range(draw(st.integers(0, 2)))]
    chosen = draw(st.lists(st.booleans(), min_size=len(plan), max_size=len(plan)))
    return plan, [d for d, c in zip(plan, chosen, strict=True) if c]


@given(plans(), st.integers(0, 40))
def test_every_budget_holds_the_guards_its_raises_need(
    drawn: tuple[list[WorkloadDecision], list[WorkloadDecision]], budget: int
) -> None:
    plan, writes = drawn
    order = head_first(writes, lambda d: d, plan)
    assert sorted(d.key for d in order) == sorted(d.key for d in writes)
    sent = order[:budget]
    pools_raised = {pool_of(d) for d in sent if not d.admitted}
    for d in writes:
        if d.admitted and pool_of(d) in pools_raised:
            assert d in sent, (d.key, [x.key for x in order], budget)
    # every guard precedes every pending write of its pool
    for i, d in enumerate(order):
        if d.admitted:
            assert not any(not e.admitted and pool_of(e) == pool_of(d) for e in order[:i])


@given(plans())
def test_pending_writes_go_by_slot(
    drawn: tuple[list[WorkloadDecision], list[WorkloadDecision]]
) -> None:
    plan, writes = drawn
    current = current_positions(d for d in plan if not d.admitted)
    slots = [min(d.rank, current[d.key])
             for d in head_first(writes, lambda d: d, plan) if not d.admitted]
    assert slots == sorted(slots)


def test_a_queues_pending_writes_share_one_chain_guards_none() -> None:
    """The writer sends a ClusterQueue's pending writes one after another (the applier's
    chain), so they land in the plan's order; admitted Workloads' guards, sent before them
    and waited for, are not chained."""
    plan = [*queue("a", 2), *queue("b", 1), dec("g", "a", 0, admitted=True, target=5)]
    wl = {"metadata": {"name": "x", "namespace": "ns"}, "spec": {"priority": 0}}
    chains = [pending_queue(c) for d in plan
              if (c := diff_priority(d, wl, WORKLOADS, PriorityMode.SPEC)) is not None]
    assert chains == ["a", "a", "b", None]


def _changes(plan: list[WorkloadDecision]) -> list[Change]:
    wl = {"metadata": {"name": "x", "namespace": "ns"}, "spec": {"priority": 0}}
    return [c for d in plan if (c := diff_priority(d, wl, WORKLOADS, PriorityMode.SPEC))]


def test_a_queues_writes_land_in_the_plans_order_not_by_slot() -> None:
    """The budget takes writes by slot, where Kueue's current head (a2 here: the plan's last,
    created first) shares slot 0 with the plan's head; landing in that order, a2 would reach
    Kueue's heap while a1, above it in the plan, was still parked."""
    plan = queue("a", 3) + queue("b", 2)
    by_slot = head_first(_changes(plan), lambda c: c.decision, plan)
    assert [c.decision.key for c in by_slot] == ["a0", "a2", "b0", "b1", "a1"]
    landed = landing_order(by_slot)
    assert [c.decision.key for c in landed if pending_queue(c) == "a"] == ["a0", "a1", "a2"]
    assert [c.decision.key for c in landed if pending_queue(c) == "b"] == ["b0", "b1"]


class _Recording(Applier):
    """Records what each `apply` is given, in order, and whether it chains."""

    def __init__(self) -> None:
        super().__init__(FakeApi(), Metrics())
        self.calls: list[tuple[list[str], bool]] = []

    def apply(self, changes: Sequence[Change], on_outcome: OutcomeHook | None = None,
              chain: Callable[[Change], str | None] | None = None) -> ApplyReport:
        self.calls.append(([c.decision.key for c in changes], chain is not None))
        return ApplyReport([Outcome(c, APPLIED) for c in changes])


def test_the_writer_sends_guards_then_each_queues_writes_chained_in_the_plans_order() -> None:
    plan = [*queue("a", 3, pool="p"), *queue("b", 2, pool="p"),
            dec("g", "a", -1, pool="p", admitted=True, target=5000)]
    applier = _Recording()
    writer = CycleWriter(applier, EventRecorder(ReadOnlyTransport(FakeApi()), Metrics(), 60.0),
                         Metrics(), budget=100, stopping=lambda: False)
    report = writer.write(Plan(now=T0, decisions=tuple(plan)), Diff(tuple(_changes(plan))), {})
    assert report.counts() == {APPLIED: 6}
    # the guard is sent and waited for first (then the HAMi writes: none); the pending writes
    # go in one chained call, each queue's in its plan order (a0 a1 a2, b0 b1)
    assert applier.calls == [(["g"], False), ([], False),
                             (["a0", "b0", "b1", "a1", "a2"], True)]
