"""The worked example in docs/policy.md, computed by the real code (keeps the doc honest)."""

from __future__ import annotations

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
    assert got == {"a/pretrain": 388600, "b/finetune": 313200, "c/eval": 220800, "a/sweep": 178800}
    assert [d.key for d in plan.decisions] == ["a/pretrain", "b/finetune", "c/eval", "a/sweep"]
    fair = {t: plan.teams[t].dominant_share for t in "abc"}
    assert fair == {"a": 0.25, "b": 0.0625, "c": 0.0}


def test_worked_example_bound() -> None:
    s = Settings()
    assert score(PriorityClass.NORMAL, 58000, (3 * 24 + 18) * 3600, s) == 492000
    assert score(PriorityClass.URGENT, 100000, 0, s) == 430000
    assert s.overtake_window() == 320000 + 300  # 3 d 16 h 58 min 20 s
    assert s.max_score() == 1034800
