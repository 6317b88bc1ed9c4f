"""A team's queue in one pool is ordered by class, then queue time, then - within one second,
the grain of Kubernetes' timestamps - by the priority Kueue sees now: a newcomer never passes
a Workload of the same second that already carries its value. (Kueue may already be taking
quota for that one as its ClusterQueue's head; admitted after being passed, it would be
preempted by the one that passed it - a same-class preemption.) On the real `compute_plan`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.plan import Plan
from controller.policy import compute_plan
from tests.support.builders import NOW, snapshot, wl, written
from tests.support.builders import settings as make_settings

S = make_settings()


def targets(plan: Plan) -> dict[str, int]:
    return {d.key: d.target_priority for d in plan.pending}


@settings(max_examples=40, deadline=None)
@given(old=st.sampled_from(["a-old", "m-old", "z-old"]),
       new=st.lists(st.sampled_from(["b-new", "n-new", "y-new", "0-new"]), min_size=1,
                    max_size=3, unique=True),
       running=st.integers(0, 3))
def test_a_newcomer_of_the_same_second_never_passes_a_written_workload(
    old: str, new: list[str], running: int
) -> None:
    # One GPU each of 8: every Workload of the team lowers the next one's fairness level.
    admitted = [wl(f"run-{i}", wait=3600, admitted=True) for i in range(running)]
    first = snapshot([*admitted, wl(old, wait=30.0)])
    carried = written(first, compute_plan(first, S, NOW), boost=True)
    second = snapshot([*carried.workloads, *(wl(n, wait=30.0) for n in new)])
    got = targets(compute_plan(second, S, NOW))
    old_key = f"team-a/{old}"
    assert all(got[old_key] >= got[f"team-a/{n}"] for n in new), got
    # The fairness levels really differ along the queue (the order is not a tie).
    assert all(got[old_key] > got[f"team-a/{n}"] for n in new), got
