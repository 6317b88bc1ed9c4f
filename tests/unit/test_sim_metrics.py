"""Metric definitions (fairness-anchors.md): Jain's index, water-filling, quantiles."""

from __future__ import annotations

import math

import pytest

from evaluation.metrics import demand_capped_jain, jain, quantile, quantiles, water_fill


def test_jain_equal_shares_is_one() -> None:
    assert jain([0.25, 0.25, 0.25, 0.25]) == pytest.approx(1.0)


def test_jain_one_team_has_everything_is_one_over_n() -> None:
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_jain_textbook_example() -> None:
    # (1 + 2)^2 / (2 * (1 + 4)) = 0.9
    assert jain([1.0, 2.0]) == pytest.approx(0.9)
    assert jain([1.0, 1.0, 2.0]) == pytest.approx(16 / 18)


def test_jain_hides_one_starved_team_of_fifteen() -> None:
    # fairness-anchors.md: "Jain stays ≈ 0.93 with one of 15 teams fully starved": 14²/(15·14)
    assert jain([1.0] * 14 + [0.0]) == pytest.approx(14 / 15)
    assert round(jain([1.0] * 14 + [0.0]), 2) == 0.93


def test_jain_empty_and_zero() -> None:
    assert jain([]) == 1.0
    assert jain([0.0, 0.0]) == 1.0


def test_water_fill_caps_by_demand_and_weight() -> None:
    assert water_fill(10, [2, 10, 10], [1, 1, 1]) == pytest.approx([2, 4, 4])
    assert water_fill(9, [10, 10], [2, 1]) == pytest.approx([6, 3])
    assert water_fill(100, [1, 2], [1, 1]) == pytest.approx([1, 2])  # everyone satisfied
    assert water_fill(5, [0, 10], [1, 1]) == pytest.approx([0, 5])


def test_demand_capped_jain() -> None:
    # A team that asked for little and got it is not "under-served".
    assert demand_capped_jain([1, 4.5, 4.5], [1, 10, 10], [1, 1, 1]) == pytest.approx(1.0)
    # Same total, split unfairly between two equally hungry teams.
    j = demand_capped_jain([1, 8, 1], [1, 10, 10], [1, 1, 1])
    fair = [1, 4.5, 4.5]
    xs = [a / f for a, f in zip([1, 8, 1], fair, strict=True)]
    assert j == pytest.approx(jain(xs))
    assert j < 0.9
    # Weights: a team of weight 2 getting twice as much is fair.
    assert demand_capped_jain([6, 3], [10, 10], [2, 1]) == pytest.approx(1.0)
    # Teams without demand are ignored; one team alone is trivially fair.
    assert demand_capped_jain([5, 0], [10, 0], [1, 1]) == 1.0


def test_quantiles_linear_interpolation() -> None:
    v = [0.0, 10.0, 20.0, 30.0, 40.0]
    assert quantile(v, 0.5) == 20.0
    assert quantile(v, 0.95) == pytest.approx(38.0)
    assert quantile([], 0.5) != quantile([], 0.5)  # NaN
    q = quantiles([5.0, 1.0, 3.0])
    assert (q.n, q.p50, q.max, q.mean) == (3, 3.0, 5.0, 3.0)
    assert math.isnan(quantiles([]).p99)


def _kueue_run():  # type: ignore[no-untyped-def]
    from controller.domain import PriorityClass
    from evaluation.engine import SimConfig
    from evaluation.kueue import KueueConfig, KueueSim
    from evaluation.policies import StaticClasses
    from evaluation.trace import SimJob

    n, u = PriorityClass.NORMAL, PriorityClass.URGENT
    jobs = [
        SimJob(0, 0.0, 7200.0, "a", n, 1, 8, 100),  # team a fills the node for 2 h
        SimJob(1, 60.0, 300.0, "b", n, 1, 1, 100),  # b waits 2 h for 5 min of work
        SimJob(2, 3600.0, 600.0, "b", u, 1, 8, 100),  # urgent: preempts a after 1 h
    ]
    k = KueueConfig(within_cluster_queue="LowerPriority", checkpoint_interval=1800.0)
    return KueueSim(jobs, SimConfig(nodes=1), k, StaticClasses()).run()


def test_run_metrics_waits_slowdown_preemption_and_loss() -> None:
    from evaluation.metrics import run_metrics
    from evaluation.trace import Period

    r = _kueue_run()
    m = run_metrics(r, Period(0.0, 4 * 3600.0), [1.0, 1.0], 10.0)
    assert m["urgent_p99"] == 0.0  # urgent preempted a at once
    assert m["preemptions_per_hour"] == 1 / 4
    assert m["gpu_hours_lost"] == 0.0  # a ran exactly 2 checkpoints before the preemption
    # a (older) resumes first after the urgent job, with the 3600 s it had left; b then
    # starts at 7800
    assert m["normal_1gpu_max"] == 7800.0 - 60.0
    # slowdowns: a 7800 / 7200, b (7740 + 300) / 600 (the 10-min bound), urgent 1
    assert m["slowdown_mean"] == pytest.approx((7800 / 7200 + 8040 / 600 + 1.0) / 3)
    assert m["writes_per_job_mean"] == 0.0
    assert m["same_class_preemptions"] == 0.0


def test_themis_finish_time_fairness_against_the_teams_weighted_share_alone() -> None:
    """Themis (fairness-anchors.md): rho = T_shared / T_isolated, isolated on the team's share
    of the cluster (1/N, weighted here), a job larger than it time-sliced; the worst team's
    mean. 8 GPUs, weights 1:1 (4 each): a's 8-GPU job isolated takes 2 x 7200 s and finished
    after 7800 s; b's 1-GPU job 300 s after 8040 s, its 8-GPU urgent job 2 x 600 s after 600."""
    from evaluation.metrics import themis_max

    r = _kueue_run()
    assert themis_max(r, r.jobs, [1.0, 1.0]) == pytest.approx((8040 / 300 + 600 / 1200) / 2)
    # weights 3:1: b is entitled to 2 GPUs, so its 8-GPU job takes 4 x 600 s alone
    assert themis_max(r, r.jobs, [3.0, 1.0]) == pytest.approx((8040 / 300 + 600 / 2400) / 2)


def test_urgent_time_to_quota_admission_beside_time_to_start() -> None:
    """Kueue reserves quota for an urgent job at once, but its pod waits for a whole free GPU:
    HAMi fractions on every card leave enough quota and no whole card."""
    from controller.domain import PriorityClass
    from evaluation.engine import SimConfig
    from evaluation.kueue import KueueConfig, KueueSim
    from evaluation.metrics import run_metrics
    from evaluation.policies import StaticClasses
    from evaluation.trace import Period, SimJob

    n, u = PriorityClass.NORMAL, PriorityClass.URGENT
    # eight half-GPU jobs, spread one per card (HAMi's GPU spread), for 200 s
    jobs = [SimJob(i, 0.0, 200.0, "a", n, 1, 1, 50) for i in range(8)]
    jobs.append(SimJob(8, 10.0, 60.0, "b", u, 1, 1, 100))
    k = KueueConfig(within_cluster_queue="LowerPriority")
    r = KueueSim(jobs, SimConfig(nodes=1, check_invariants=True), k, StaticClasses()).run()
    m = run_metrics(r, Period(0.0, 3600.0), [1.0, 1.0], 10.0)
    assert r.first_quota[8] == 10.0 and r.admit[8] == 200.0
    assert m["urgent_quota_p99"] == m["urgent_quota_max"] == 0.0
    assert m["urgent_p99"] == 190.0


def test_normal_time_to_quota_admission_per_size_bucket() -> None:
    """The same for a normal whole-GPU job: quota at once, start when a card is whole again."""
    from controller.domain import PriorityClass
    from evaluation.engine import SimConfig
    from evaluation.kueue import KueueConfig, KueueSim
    from evaluation.metrics import run_metrics
    from evaluation.policies import StaticClasses
    from evaluation.trace import Period, SimJob

    n = PriorityClass.NORMAL
    jobs = [SimJob(i, 0.0, 200.0, "a", n, 1, 1, 50) for i in range(8)]
    jobs.append(SimJob(8, 10.0, 60.0, "b", n, 1, 1, 100))
    r = KueueSim(jobs, SimConfig(nodes=1, check_invariants=True), KueueConfig(),
                 StaticClasses()).run()
    m = run_metrics(r, Period(0.0, 3600.0), [1.0, 1.0], 10.0)
    assert r.first_quota[8] == 10.0 and r.admit[8] == 200.0
    assert m["normal_1gpu_max"] == 190.0 and m["normal_1gpu_quota_max"] == 0.0


def test_team_ratios_against_weighted_entitlement() -> None:
    from evaluation.metrics import team_ratios
    from evaluation.trace import Period

    r = _kueue_run()
    ratios, errors, per_hour = team_ratios(r, Period(0.0, 4 * 3600.0), [1.0, 1.0])
    # first hour: a holds 8 GPUs, b asks 1 -> entitled a 7, b 1: a 8/7, b 0
    assert per_hour[0][0] == pytest.approx(8 / 7, rel=0.02)
    assert per_hour[0][1] == pytest.approx(0.0, abs=0.02)
    assert ratios[1] < 1 < ratios[0]
    assert errors and 0 < errors[0] < 0.2


def test_packing_metrics_stranded_capacity_whole_free_gpus_and_multi_gpu_waits() -> None:
    from controller.domain import PriorityClass
    from evaluation.engine import SimConfig
    from evaluation.kueue import KueueConfig, KueueSim
    from evaluation.metrics import run_metrics
    from evaluation.policies import StaticClasses
    from evaluation.trace import Period, SimJob

    n = PriorityClass.NORMAL
    jobs = [
        SimJob(0, 0.0, 3600.0, "a", n, 1, 1, 25),  # a quarter of one GPU for the hour
        SimJob(1, 0.0, 3600.0, "a", n, 1, 2, 100),  # two whole GPUs for the hour
        SimJob(2, 0.0, 1800.0, "b", n, 1, 8, 100),  # the whole node: waits for both
    ]
    r = KueueSim(jobs, SimConfig(nodes=1), KueueConfig(), StaticClasses()).run()
    m = run_metrics(r, Period(0.0, 3600.0), [1.0, 1.0], 10.0)
    # 8 GPUs: 2.25 GPUs allocated, 5 whole free; of the 5.75 free GPUs, 0.75 is stranded on
    # the quarter-used GPU.
    assert m["whole_free"] == pytest.approx(5.0)
    assert m["stranded"] == pytest.approx(0.75 / 5.75)
    # Both multi-GPU jobs count: the 2-GPU one started at once, the 8-GPU one waited the hour.
    assert (r.admit[1], r.admit[2]) == (0.0, 3600.0)
    assert m["multi_mean"] == pytest.approx(1800.0)
    assert m["multi_never"] == 0.0
