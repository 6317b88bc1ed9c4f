"""TEAM_WEIGHTS: auto takes Kueue's own fairSharing weights; explicit weights that differ from
Kueue's are reported."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from controller.config import AUTO_TEAM_WEIGHTS, load_settings
from controller.domain import GPU, ClusterQueue, KueueApiVersion, LocalQueue, ResourceQuota
from controller.policy import compute_plan
from tests.support.builders import NOW, snapshot, wl
from tests.support.builders import settings as make_settings


def _per_team_queues(weights: dict[str, str]) -> object:
    queues = tuple(
        ClusterQueue(f"cq-{t}", KueueApiVersion.V1BETA2, cohort="all",
                     quotas=(ResourceQuota("default", GPU, Decimal(4)),),
                     fair_sharing_weight=Decimal(w))
        for t, w in weights.items())
    items = []
    for t in weights:
        w = wl(f"x-{t}", t, admitted=True, gpu="2", queue=f"lq-{t}")
        assert w.admission is not None
        items.append(replace(w, admission=replace(w.admission, cluster_queue=f"cq-{t}")))
    items += [wl(f"p-{t}", t, queue=f"lq-{t}") for t in weights]
    base = snapshot(items)
    return replace(base, cluster_queues=queues, local_queues=tuple(
        LocalQueue(t, f"lq-{t}", f"cq-{t}") for t in weights))


def test_auto_is_parsed() -> None:
    s = load_settings(env={"TEAM_WEIGHTS": "auto"})
    assert s.team_weights is AUTO_TEAM_WEIGHTS and s.weights_from_kueue()


def test_auto_takes_the_weight_of_the_queue_a_team_alone_uses() -> None:
    snap = _per_team_queues({"team-a": "4", "team-b": "1"})
    plan = compute_plan(snap, make_settings(team_weights=AUTO_TEAM_WEIGHTS), NOW)  # type: ignore[arg-type]
    shares = {t: ts.dominant_share for (_p, t), ts in plan.pool_shares.items()}
    # 2 of the cohort's 8 GPUs each; team-a's weight 4 divides its share by 4.
    assert shares["team-a"] * 4 == shares["team-b"] == 0.25
    assert not [w for w in plan.warnings if "TEAM_WEIGHTS" in w]


def test_explicit_weights_that_differ_from_kueue_are_reported() -> None:
    snap = _per_team_queues({"team-a": "4", "team-b": "1"})
    plan = compute_plan(snap, make_settings(team_weights={"team-a": 2.0}), NOW)  # type: ignore[arg-type]
    notes = [w for w in plan.warnings if "fairSharing" in w]
    assert notes == ["team team-a: TEAM_WEIGHTS gives 2, Kueue's fairSharing weight is 4 "
                     "(TEAM_WEIGHTS: auto takes Kueue's)"]


def test_a_shared_queue_gives_no_team_its_weight() -> None:
    snap = _per_team_queues({"team-a": "4"})
    shared = replace(snap, local_queues=(*snap.local_queues,  # type: ignore[attr-defined]
                                         LocalQueue("team-b", "lq-team-a", "cq-team-a")))
    plan = compute_plan(shared, make_settings(team_weights=AUTO_TEAM_WEIGHTS), NOW)  # type: ignore[arg-type]
    assert {t: ts.dominant_share for (_p, t), ts in plan.pool_shares.items()}["team-a"] == 0.5
    assert not any("fairSharing" in w for w in plan.warnings)
