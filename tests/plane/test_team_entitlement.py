"""Proof on the real plane: the live controller exports each team's usage over its entitlement,
`wdrf_team_usage_over_entitlement{team,pool}`, right for unequal TEAM_WEIGHTS.

Two teams (namespaces) share one ClusterQueue of 4 cpu; TEAM_WEIGHTS gives the first 3, the
second 1, so their entitlements are 3/4 and 1/4 of the pool. The expected values come from
Kueue's own accounting (each LocalQueue's `status.flavorsReservation`, the ClusterQueue's
quota), not from the controller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.plane import live_helpers as h
from tests.support import kube

pytestmark = pytest.mark.plane

METRIC = "wdrf_team_usage_over_entitlement"


def reserved_cpu(api: k8s.ApiClient, ns: str) -> float:
    """cpu Kueue counts as reserved by the LocalQueue `lq` of `ns`."""
    lq: dict[str, Any] = kube.request(api, "GET", kube.kueue_path("localqueues", "lq", ns))
    return sum(float(r["total"]) for f in lq.get("status", {}).get("flavorsReservation") or []
               for r in f.get("resources") or [] if r["name"] == "cpu")


def test_usage_over_entitlement_for_unequal_weights(api: k8s.ApiClient, kubeconfig: Path) -> None:
    heavy, light = kube.create_namespace(api), kube.create_namespace(api)
    cq = f"cq-{heavy}"
    kube.create_cluster_queue(api, cq, {"cpu": 4}, namespace_selector={"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": [heavy, light]}]})
    for ns in (heavy, light):
        kube.create_local_queue(api, ns, "lq", cq)
    weights = {heavy: 3.0, light: 1.0}
    try:
        for ns, running in ((heavy, 2), (light, 1)):
            for i in range(running):
                h.create_job(api, ns, f"run{i}", "lq")
                kube.wait_for_workload_condition(api, ns, h.job_workload(api, ns, f"run{i}"),
                                                 "QuotaReserved")
        for ns in (heavy, light):  # and work that cannot fit (2 cpu, 1 free) in both teams
            h.create_job(api, ns, "wait", "lq", requests={"cpu": "2"})
            h.wait_pending(api, ns, h.job_workload(api, ns, "wait"))
        kube.wait_for(lambda: (reserved_cpu(api, heavy), reserved_cpu(api, light)) == (2, 1),
                      30, "Kueue's LocalQueue reservations 2 and 1 cpu",
                      lambda: str((reserved_cpu(api, heavy), reserved_cpu(api, light))))

        c = h.new_controller(kubeconfig, h.live_settings(
            TEAM_WEIGHTS="{" + ", ".join(f"{t}: {w:g}" for t, w in weights.items()) + "}"))
        with h.started(c):
            h.converge(c)
        pool = f"cq/{cq}"
        got = {ns: c.metrics.registry.get_sample_value(METRIC, {"team": ns, "pool": pool})
               for ns in (heavy, light)}

        quota = 4.0
        total_weight = sum(weights.values())  # both teams have Workloads in the pool
        expected = {ns: (reserved_cpu(api, ns) / quota) / (weights[ns] / total_weight)
                    for ns in (heavy, light)}
        assert expected == pytest.approx({heavy: 2 / 3, light: 1.0})
        assert got == pytest.approx(expected), got
        # the equal-weights guess the dashboard used before (weighted share x team count)
        share = c.metrics.registry.get_sample_value("wdrf_team_dominant_share", {"team": heavy})
        assert share is not None and share * 2 != pytest.approx(got[heavy])
    finally:
        h.cleanup(api, [heavy, light], [cq])
