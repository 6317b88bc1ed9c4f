"""Accounting: teams, GPU-equivalents, capacity sources, shares."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from itertools import pairwise

import pytest

from controller.accounting import (
    card_memory,
    container_gpu,
    fairness_level,
    fairness_term,
    gpu_inventory,
    pool_capacities,
    team_of,
)
from controller.config import Settings
from controller.domain import (
    GPU,
    CapacitySource,
    ClusterQueue,
    Container,
    GpuDevice,
    KueueApiVersion,
    NodeInventory,
    ResourceQuota,
    TeamSource,
    frozen_resources,
)
from controller.policy import compute_plan
from tests.support.builders import NOW, snapshot, wl
from tests.support.builders import settings as make_settings


def c(res: dict[str, str]) -> Container:
    return Container("c", frozen_resources({k: Decimal(v) for k, v in res.items()}))


G, CORES, MEM, PCT = GPU, "nvidia.com/gpucores", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage"


@pytest.mark.parametrize(
    ("res", "card", "expected"),
    [
        ({G: "1"}, None, (1.0, 1.0, 1.0)),
        ({G: "2"}, None, (2.0, 2.0, 2.0)),
        ({G: "1", CORES: "25", PCT: "25"}, None, (0.25, 0.25, 0.25)),
        ({G: "2", CORES: "50", PCT: "10"}, None, (1.0, 1.0, 0.2)),
        # memory only: cores unthrottled (0) -> memory decides
        ({G: "1", PCT: "30"}, None, (0.3, 0.0, 0.3)),
        # cores only: memory is the whole card -> one GPU
        ({G: "1", CORES: "25"}, None, (1.0, 0.25, 1.0)),
        # gpumem MiB over card memory
        ({G: "1", MEM: "20480"}, 81920.0, (0.25, 0.0, 0.25)),
        # gpumem with unknown card: counted as the whole card
        ({G: "1", MEM: "20480"}, None, (1.0, 1.0, 1.0)),
        ({"cpu": "4"}, None, (0.0, 0.0, 0.0)),
    ],
)
def test_gpu_equivalents(res: dict[str, str], card: float | None,
                         expected: tuple[float, float, float]) -> None:
    assert container_gpu(c(res), card) == pytest.approx(expected)


def test_four_quarter_jobs_weigh_one_gpu() -> None:
    q = {"nvidia.com/gpucores": "25", "nvidia.com/gpumem-percentage": "25"}
    plan = compute_plan(snapshot([wl(f"q{i}", admitted=True, resources=q) for i in range(4)]
                                 + [wl("p")]), Settings(), NOW)
    assert plan.teams["team-a"].usage[GPU] == 1


@pytest.mark.parametrize(
    ("source", "expected"),
    [(TeamSource.NAMESPACE, "team-a"), (TeamSource.LABEL, "vision"),
     (TeamSource.LOCAL_QUEUE, "team-a/default")],
)
def test_team_sources(source: TeamSource, expected: str) -> None:
    s = make_settings(team_source=source)
    w = replace(wl("p"), labels={"wdrf.x-k8s.io/team": "vision"})
    assert team_of(w, s) == expected


def test_team_label_from_job_then_namespace() -> None:
    s = make_settings(team_source=TeamSource.LABEL)
    assert team_of(wl("p"), s, {"wdrf.x-k8s.io/team": "speech"}) == "speech"
    assert team_of(wl("p"), s) == "team-a"


def _node(name: str, source: CapacitySource, n: int, healthy: int, mem: int = 81920,
          age: float | None = 10) -> NodeInventory:
    gpus = tuple(GpuDevice(f"GPU-{name}-{i}", i, "H100", mem, healthy=i < healthy)
                 for i in range(n))
    return NodeInventory(name, source, gpus,
                         None if age is None else NOW - timedelta(seconds=age))


def test_capacity_from_inventory_counts_healthy_physical_gpus() -> None:
    nodes = (_node("a", CapacitySource.HAMI, 8, 8, age=None),
             _node("b", CapacitySource.HAMI, 8, 7, age=None),
             _node("b", CapacitySource.AGENT, 8, 6))
    inv, src = gpu_inventory(nodes, Settings(), NOW)
    assert src is CapacitySource.AGENT  # fresh agent data wins on node b
    pools, source = pool_capacities(snapshot([]).cluster_queues, inv)
    cap = pools["cq/cq"]
    assert cap["default:" + GPU] == 14 and cap["default:nvidia.com/gpucores"] == 14
    assert cap[GPU] == 14  # the unflavored total (usage without a flavor) follows
    assert source is CapacitySource.AGENT
    assert card_memory(inv, Settings()) == 81920


def test_stale_agent_inventory_falls_back_to_hami() -> None:
    nodes = (_node("b", CapacitySource.HAMI, 8, 7, age=None),
             _node("b", CapacitySource.AGENT, 8, 6, age=3600))
    inv, src = gpu_inventory(nodes, Settings(), NOW)
    assert src is CapacitySource.HAMI and inv[0].healthy_gpus == 7


def test_quota_capacity_source_ignores_nodes() -> None:
    s = make_settings(capacity_source="quota")
    assert gpu_inventory((_node("a", CapacitySource.HAMI, 8, 8),), s, NOW) == ([], None)
    pools, source = pool_capacities(snapshot([], gpus=8).cluster_queues, [])
    assert pools["cq/cq"]["default:" + GPU] == 8 and source is CapacitySource.QUOTA


def test_card_memory_falls_back_to_setting() -> None:
    assert card_memory([], Settings()) is None
    assert card_memory([], make_settings(gpu_memory_mib=40960)) == 40960


def test_fairness_term_is_monotone_and_bounded() -> None:
    s = Settings()
    vals = [fairness_term(x / 100, 4, s) for x in range(0, 300)]
    assert vals[0] == s.fairness_points
    assert all(a >= b for a, b in pairwise(vals))
    step = s.fairness_points // s.fairness_levels
    assert all(0 <= v <= s.fairness_points and v % step == 0 for v in vals)


GIB = 1 << 30
DRF_PAPER_CQ = ClusterQueue("cq", KueueApiVersion.V1BETA2, quotas=(
    ResourceQuota("default", "cpu", Decimal(9)),
    ResourceQuota("default", "memory", Decimal(18 * GIB))))


@pytest.mark.parametrize(("weights", "a_share", "b_share"), [
    ({}, 2 / 3, 2 / 3),  # the paper: both at a dominant share of 2/3
    ({"team-a": 2.0, "team-b": 0.5}, 1 / 3, 4 / 3),
    ({"team-a": 1.5}, 4 / 9, 2 / 3),
])
def test_weighted_dominant_share_is_the_largest_share_over_the_weight(
    weights: dict[str, float], a_share: float, b_share: float,
) -> None:
    """Weighted DRF (Ghodsi et al., NSDI 2011; fairness-anchors.md): s = max_r u_r / (w x C_r).
    The paper's allocation on 9 CPUs and 18 GB: A runs 3 tasks of <1 CPU, 4 GB> (<1/3, 2/3>:
    memory dominates), B 2 of <3 CPUs, 1 GB> (<2/3, 1/9>: CPU dominates)."""
    items = [wl(f"a{i}", "team-a", gpu=None, admitted=True,
                resources={"cpu": "1", "memory": str(4 * GIB)}) for i in range(3)]
    items += [wl(f"b{i}", "team-b", gpu=None, admitted=True,
                 resources={"cpu": "3", "memory": str(GIB)}) for i in range(2)]
    s = make_settings(team_weights=weights, resource_weights={"cpu": 1.0, "memory": 1.0})
    teams = compute_plan(snapshot(items, cq=DRF_PAPER_CQ, teams=("team-a", "team-b")), s,
                         NOW).teams
    assert teams["team-a"].dominant_share == pytest.approx(a_share)
    assert teams["team-b"].dominant_share == pytest.approx(b_share)
    assert teams["team-a"].dominant_resource == "memory"
    assert teams["team-b"].dominant_resource == "cpu"


def test_classic_fair_share_factor_is_one_half_at_the_entitlement() -> None:
    """Slurm's classic fair share (fairness-anchors.md): F = 2^(-U/S) is 1 with no usage, 0.5
    at exactly the team's share and 0.25 at twice it, whatever the weights; level = floor(F x
    FAIRNESS_LEVELS). 8 GPUs, W = 4: team-a (weight 2) is entitled to 4 and uses 4, team-b
    (weight 1) to 2 and uses 2, team-c uses none. Then W = 2: team-a (weight 1) uses all 8,
    twice its 4."""
    s = make_settings(team_weights={"team-a": 2.0})
    items = [wl("a-run", admitted=True, gpu="4"), wl("b-run", "team-b", admitted=True, gpu="2"),
             wl("a"), wl("b", "team-b"), wl("c", "team-c")]
    plan = compute_plan(snapshot(items), s, NOW)
    levels = {d.team: d.breakdown.fairness_level for d in plan.pending if d.breakdown}
    points = {d.team: d.breakdown.fairness_term for d in plan.pending if d.breakdown}
    assert {t: plan.teams[t].usage_over_entitlement for t in levels} == pytest.approx(
        {"team-a": 1.0, "team-b": 1.0, "team-c": 0.0})
    assert levels == {"team-a": 25, "team-b": 25, "team-c": 50}  # F = 0.5, 0.5, 1
    assert points == {"team-a": 50_000, "team-b": 50_000, "team-c": 100_000}
    twice = compute_plan(snapshot([wl("a-run", admitted=True, gpu="8"), wl("a"),
                                   wl("b", "team-b")], teams=("team-a", "team-b")),
                         make_settings(), NOW)
    assert twice.teams["team-a"].usage_over_entitlement == pytest.approx(2.0)
    assert {d.team: d.breakdown.fairness_level for d in twice.pending if d.breakdown} == {
        "team-a": 12, "team-b": 50}  # F = 0.25: floor(12.5)


def test_resource_weight_zero_ignores_resource() -> None:
    s = make_settings(resource_weights={"cpu": 1.0, GPU: 0.0})
    plan = compute_plan(snapshot([wl("r", admitted=True, resources={"cpu": "8"}), wl("p")]),
                        s, NOW)
    t = plan.teams["team-a"]
    assert t.dominant_resource == "cpu" and GPU not in t.shares


def test_fairness_level_hysteresis_holds_near_a_boundary_and_moves_past_it() -> None:
    s = Settings(fairness_hysteresis=0.5)  # 50 levels, hysteresis 0.5 level
    # exact position 2^(-s*W) * 50 with W = 1: pick shares around level 25 (factor 0.5)
    def share_for(position: float) -> float:
        import math

        return -math.log2(position / 50)

    assert fairness_level(share_for(25.2), 1, s) == 25
    assert fairness_level(share_for(24.8), 1, s, previous=25) == 25  # within half a level
    assert fairness_level(share_for(24.4), 1, s, previous=25) == 24  # past it
    assert fairness_level(share_for(26.4), 1, s, previous=25) == 25  # up to 26.5 holds
    assert fairness_level(share_for(26.6), 1, s, previous=25) == 26
    assert fairness_level(0.0, 1, s, previous=25) == 50  # no usage: always the top level


def test_fairness_never_nan_for_huge_weights() -> None:
    s = Settings()
    assert fairness_term(1e300, 1e300, s) == 0
    assert fairness_term(0.0, 1e-300, s) == s.fairness_points
