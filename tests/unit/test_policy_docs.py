"""The worked example in docs/policy.md, computed by the real code (keeps the doc honest)."""

from __future__ import annotations

import math

from wdrf_build import NOW, snapshot, wl

from controller.config import Settings
from controller.domain import APPROVED_ANNOTATION, URGENT_ANNOTATION, PriorityClass
from controller.policy import compute_plan, score

QUARTER = {"nvidia.com/gpucores": "25", "nvidia.com/gpumem-percentage": "25"}


def test_worked_example() -> None:
    items = [wl(f"a{i}", "a", admitted=True) for i in range(4)]
    items += [wl(f"b{i}", "b", admitted=True, resources=QUARTER) for i in range(4)]
    items += [
        wl("pretrain", "a", wait=600, annotations={URGENT_ANNOTATION: "true"}),
        wl("finetune", "b", wait=7200, annotations={APPROVED_ANNOTATION: "true"}),
        wl("eval", "c", wait=10800),
        wl("sweep", "a", wait=10800),
    ]
    plan = compute_plan(snapshot(items, gpus=16, teams=("a", "b", "c")), Settings(), NOW)
    got = {d.key: d.target_priority for d in plan.decisions}
    assert got == {
        "a/pretrain": 1078600, "b/finetune": 195200, "c/eval": 111820, "a/sweep": 69820
    }
    assert [d.key for d in plan.decisions] == ["a/pretrain", "b/finetune", "c/eval", "a/sweep"]
    fair = {t: plan.teams[t].dominant_share for t in "abc"}
    assert fair == {"a": 0.25, "b": 0.0625, "c": 0.0}


def test_worked_example_bound() -> None:
    s = Settings()
    assert score(PriorityClass.NORMAL, 58000, 40 * 3600, s) == 203020
    assert score(PriorityClass.APPROVED, 100000, 0, s) == 202000
    assert score(PriorityClass.NORMAL, 58000, 39 * 3600, s) < 202000
    # at the aging cap (and beyond) A/sweep still ranks below a fresh urgent workload
    assert score(PriorityClass.NORMAL, 58000, 7 * 86400, s) == 663820
    assert score(PriorityClass.NORMAL, 58000, 30 * 86400, s) == 663820
    assert score(PriorityClass.URGENT, 100000, 0, s) == 1120000
    assert score(PriorityClass.URGENT, 0, 0, s) > score(PriorityClass.NORMAL, 100000, 30 * 86400, s)
    assert s.overtake_window(PriorityClass.NORMAL) == 100000 + 300  # 27 h 51 min 40 s
    assert s.overtake_window(PriorityClass.APPROVED) == 200980 + 300  # 2 d 7 h 54 min 40 s
    assert math.isinf(s.overtake_window(PriorityClass.URGENT))
    assert math.isinf(s.overtake_window())
    assert s.max_score() == 1724800
