"""Each team's usage over its entitlement, per pool: the metric
`wdrf_team_usage_over_entitlement{team,pool}`.

A plan carries every (pool, team) weighted dominant share (`Plan.pool_shares`) but not W, the
sum of the weights of the teams active in each pool, which turns a weighted share into usage
over entitlement (U/S = weighted share x W, see `accounting.fairness_factor`). Which teams are
active depends on which (pool, team) pairs have a Workload: this finds them from the same
snapshot as `controller.policy.account` does, then applies `accounting.usage_over_entitlement`.
Pure; tests/unit/test_entitlement.py checks it against the plan's own fairness levels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.accounting import UNKNOWN_POOL, pool_of, team_of, usage_over_entitlement
from controller.domain import ClusterSnapshot, TeamSource
from controller.plan import Plan

if TYPE_CHECKING:
    from controller.config import Settings

PoolTeam = tuple[str, str]


def present_pairs(snapshot: ClusterSnapshot, settings: Settings) -> set[PoolTeam]:
    """(pool, team) of every unfinished Workload that holds quota or is pending and active."""
    from controller.policy import gather, owner_of

    g = gather(snapshot)
    pool_by_cq = {name: pool_of(cq) for name, cq in g.queues.items()}
    by_label = settings.team_source is TeamSource.LABEL
    out: set[PoolTeam] = set()
    for w in g.workloads:
        if w.quota_reserved:
            cq = w.admission.cluster_queue if w.admission else g.lq_to_cq.get(
                (w.namespace, w.queue_name))
        elif w.active:
            cq = g.lq_to_cq.get((w.namespace, w.queue_name))
        else:
            continue
        pool = pool_by_cq.get(cq, UNKNOWN_POOL) if cq else UNKNOWN_POOL
        job = owner_of(w, g) if by_label else None
        out.add((pool, team_of(w, settings, job.labels if job else None)))
    return out


def team_usage_over_entitlement(
    plan: Plan, snapshot: ClusterSnapshot, settings: Settings
) -> dict[PoolTeam, float]:
    """U/S per (pool, team) of `plan`, which was computed from `snapshot`."""
    return usage_over_entitlement(plan.pool_shares, present_pairs(snapshot, settings), settings)
