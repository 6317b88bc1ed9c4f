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
    assert got == {"a/pretrain": 262200, "b/finetune": 49400, "c/eval": 31050, "a/sweep": 22650}
    assert [d.key for d in plan.decisions] == ["a/pretrain", "b/finetune", "c/eval", "a/sweep"]
    fair = {t: plan.teams[t].dominant_share for t in "abc"}
    assert fair == {"a": 0.25, "b": 0.0625, "c": 0.0}


def test_worked_example_bound() -> None:
    s = Settings()
    assert score(PriorityClass.NORMAL, 11600, (3 * 24 + 4) * 3600, s) == 285450
    assert score(PriorityClass.URGENT, 20000, 0, s) == 270000
    assert s.overtake_window() == 269750 + 300  # 3 d 3 h 0 min 50 s
    assert s.max_score() == 874800
