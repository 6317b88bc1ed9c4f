"""Proof on the real plane: real Kueue admits pending work in the order the controller plans.

Three teams share one ClusterQueue with 3 cpu; two teams already run work (different usage).
Seven 1-cpu Jobs wait, mixed classes, an urgent one submitted last. Then one cpu is freed at a
time: each time, the Workload Kueue admits must be the head of the controller's current plan.
A Workload waits meanwhile in a second, quiet ClusterQueue (another pool): the controller's
incremental planner reuses that pool's part, and every plan equals the full plan of the same
snapshot (`live_helpers.CheckedPlanner`).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client as k8s

from controller.domain import APPROVED_ANNOTATION, URGENT_ANNOTATION
from tests.plane import live_helpers as h
from tests.support import kube

pytestmark = pytest.mark.plane


@pytest.mark.parametrize("mode", ["boost", "spec"])
def test_admission_order_matches_plan_urgent_last_admitted_first(
    api: k8s.ApiClient, kubeconfig: Path, mode: str
) -> None:
    teams = [kube.create_namespace(api) for _ in range(3)]
    cq = kube.unique_name("cq-order")
    quiet_ns, quiet_cq = kube.create_namespace(api), kube.unique_name("cq-quiet")
    kube.create_cluster_queue(api, cq, {"cpu": 3}, namespace_selector={})
    kube.create_cluster_queue(api, quiet_cq, {"cpu": 0}, namespace_selector={})
    try:
        kube.create_local_queue(api, quiet_ns, "lq", quiet_cq)
        h.create_job(api, quiet_ns, "waits", "lq")
        h.wait_pending(api, quiet_ns, h.job_workload(api, quiet_ns, "waits"))
        for ns in teams:
            kube.create_local_queue(api, ns, "lq", cq)
        running: list[tuple[str, str]] = []
        for ns, job in ((teams[0], "run-0"), (teams[0], "run-1"), (teams[1], "run-2")):
            h.create_job(api, ns, job, "lq")
            wl = h.job_workload(api, ns, job)
            kube.wait_for_workload_condition(api, ns, wl, "QuotaReserved")
            running.append((ns, wl))
        jobs = [
            (teams[0], "a-normal-1", {}), (teams[1], "b-normal-1", {}),
            (teams[2], "c-normal-1", {}), (teams[0], "a-approved", {APPROVED_ANNOTATION: "true"}),
            (teams[2], "c-normal-2", {}), (teams[1], "b-normal-2", {}),
            (teams[0], "a-urgent", {URGENT_ANNOTATION: "true"}),  # submitted last
        ]
        pending: dict[str, str] = {}
        names: dict[str, str] = {}
        for i, (ns, job, ann) in enumerate(jobs):
            if i:
                time.sleep(1.1)  # distinct creation timestamps: FIFO among equals is unambiguous
            h.create_job(api, ns, job, "lq", annotations=ann)
            wl = h.job_workload(api, ns, job)
            h.wait_pending(api, ns, wl)
            pending[f"{ns}/{wl}"] = ns
            names[f"{ns}/{wl}"] = job

        c = h.new_controller(kubeconfig, h.live_settings(PRIORITY_MODE=mode))
        with h.started(c):
            first = h.converge(c)
            planned = h.planned_in(first, cq)
            assert {d.key for d in planned} == set(pending)
            # The plan itself: urgent first, approved second, and normal work in DRF's
            # progressive-filling order: each Workload's share counts its team's running cpus
            # and the team's Workloads ahead of it (urgent and approved first, then by
            # creation); equal shares by creation.
            order = [names[d.key] for d in planned]
            assert order[:2] == ["a-urgent", "a-approved"], order
            normal = [job for _, job, ann in jobs if not ann]
            running_cpus = {"a": 2, "b": 1, "c": 0}
            ahead = {"a": 2, "b": 0, "c": 0}  # a-urgent and a-approved come first in a's queue
            share: dict[str, float] = {}
            for job in normal:
                ahead[job[0]] += 1
                share[job] = (running_cpus[job[0]] + ahead[job[0]]) / 3
            expected = sorted(normal, key=lambda j: (share[j], normal.index(j)))
            assert expected[:4] == ["c-normal-1", "b-normal-1", "c-normal-2", "b-normal-2"]
            fair = {names[d.key]: d.breakdown.fairness_term for d in planned
                    if d.breakdown is not None}
            assert order[2:] == expected, (order, fair)

            admitted: list[str] = []
            heads: list[str] = []
            releasable = list(running)
            while pending:
                report = h.converge(c)
                heads.append(h.head_of(report, cq).key)
                time.sleep(1.0)  # Kueue's cache has seen our last write
                ns, wl = releasable.pop(0)
                h.release(api, ns, wl)
                got = h.next_admitted(api, pending)
                admitted.append(got)
                releasable.append((pending.pop(got), got.split("/", 1)[1]))
            assert [names[k] for k in admitted] == [names[k] for k in heads]
            assert names[admitted[0]] == "a-urgent"
            if mode == "spec":
                assert c.mode is not None and c.mode.mode.value == "spec"
            planner = c.planner
            assert isinstance(planner, h.CheckedPlanner)
            assert planner.checked >= len(admitted) and planner.reused > 0, (
                planner.checked, planner.reused)
    finally:
        h.cleanup(api, [*teams, quiet_ns], [cq, quiet_cq])
