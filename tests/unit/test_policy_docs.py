"""The worked example in docs/policy.md, computed by the real code (keeps the doc honest)."""

from __future__ import annotations

import math
from datetime import timedelta

from controller.config import Settings
from controller.domain import APPROVED_ANNOTATION, URGENT_ANNOTATION, PriorityClass
from controller.encoding import formula_value, reference
from controller.policy import compute_plan
from tests.support.builders import NOW, snapshot, wl

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
    s = Settings()
    assert reference(NOW, s.rebase_period).isoformat() == "2025-11-17T00:00:00+00:00"
    snap = snapshot(items, gpus=16, teams=("a", "b", "c"))
    plan = compute_plan(snap, s, NOW)
    got = {d.key: d.target_priority for d in plan.decisions}
    assert got == {
        "a/pretrain": 1861000, "b/finetune": 545600, "c/eval": 414700, "a/sweep": 366700
    }
    assert [d.key for d in plan.decisions] == ["a/pretrain", "b/finetune", "c/eval", "a/sweep"]
    fair = {t: (plan.teams[t].dominant_share, plan.teams[t].level) for t in "abc"}
    assert fair == {"a": (0.25, 29), "b": (0.0625, 43), "c": (0.0, 50)}
    prospective = {d.key: (d.breakdown.dominant_share, d.breakdown.fairness_level)
                   for d in plan.decisions if d.breakdown}
    assert prospective == {"a/pretrain": (0.25, 29), "b/finetune": (0.0625, 43),
                           "c/eval": (0.0, 50), "a/sweep": (0.3125, 26)}
    # unchanged until the rebase (Monday 00:00 UTC), then every value rises by 604,800
    before = compute_plan(snap, s, NOW + timedelta(days=3, hours=11, minutes=59))
    assert {d.key: d.target_priority for d in before.decisions} == got
    after = compute_plan(snap, s, NOW + timedelta(days=3, hours=12))
    assert {d.key: d.target_priority - got[d.key] for d in after.decisions} == {
        k: 604800 for k in got}


def test_worked_example_bound_and_guards() -> None:
    s = Settings()
    n = PriorityClass.NORMAL
    assert formula_value(n, 0, 52000, 10800 + 40 * 3600, s) == 208300
    assert formula_value(PriorityClass.APPROVED, 0, 100000, 0, s) == 250000
    assert formula_value(n, 0, 100000, 30 * 86400, s) == 1500 + 100000 + 604800
    assert formula_value(PriorityClass.URGENT, 0, 0, 0, s) > 1500 + 100000 + 604800
    assert s.overtake_window(n) == 100001  # 27 h 47 min
    assert s.overtake_window(PriorityClass.APPROVED) == 248501  # 2 d 21 h 2 min
    assert math.isinf(s.overtake_window(PriorityClass.URGENT))
    assert s.guard(n) == s.guard(PriorityClass.APPROVED) - 1 == 1459601
    assert s.guard(PriorityClass.URGENT) == s.max_score() == 2809601
    assert s.class_term(PriorityClass.URGENT) == 1500000 > s.guard(PriorityClass.APPROVED)
