"""Proof on the real plane: with APPROVED_SCOPE=team a team lead's approval preempts the team's
own normal work through Kueue's `withinClusterQueue: LowerPriority`, and no other team's.

* "alone": a ClusterQueue used by team T only, full with T's normal Jobs.
* "shared": one ClusterQueue shared by T and U, full; U's Jobs started last, so Kueue itself, among
  equal priorities, would take U's first (it prefers the most recently admitted).

T (and U, when present, two seconds later) queue one more normal Job. While the controller runs
nothing is preempted: same class. Then T's lead approves T's waiting Job (annotation on the
Job). The witness is Kueue: it preempts exactly one Workload (Preempted/Evicted conditions, its
Preempted Event naming T's approved Workload as the preemptor), T's most recently started normal
Job, and admits the approved one; U's running Jobs keep their quota and U's waiting Job keeps
waiting.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from kubernetes import client as k8s

from controller.domain import APPROVED_ANNOTATION, PRIORITY_TERMS_ANNOTATION
from tests.plane import live_helpers as h
from tests.support import kube

pytestmark = pytest.mark.plane

PREEMPTOR = re.compile(r"Preempted to accommodate a workload \(UID: ([^,]+),")


def preemptions(api: k8s.ApiClient, ns: str) -> list[tuple[str, str]]:
    """(victim Workload, preemptor UID) from Kueue's own Preempted Events in `ns`."""
    out = []
    for e in kube.request(api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]:
        if e.get("reason") == "Preempted" and e["involvedObject"].get("kind") == "Workload":
            m = PREEMPTOR.search(e.get("message", ""))
            assert m, e.get("message")
            out += [(e["involvedObject"]["name"], m.group(1))] * int(e.get("count") or 1)
    return out



@pytest.mark.parametrize("shared", [False, True], ids=["alone", "shared"])
def test_approval_preempts_the_teams_own_normal_job_only(
    api: k8s.ApiClient, kubeconfig: Path, shared: bool,
) -> None:
    t = kube.create_namespace(api)
    u = kube.create_namespace(api) if shared else None
    teams = [t, u] if u else [t]
    cq = kube.unique_name("cq-approve")
    kube.create_cluster_queue(
        api, cq, {"cpu": 2 * len(teams)}, preemption={"withinClusterQueue": "LowerPriority"},
        namespace_selector={"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                  "operator": "In", "values": teams}]})
    for ns in teams:
        kube.create_local_queue(api, ns, "lq", cq)
    wl: dict[str, str] = {}  # namespace/job -> Workload name

    def run(ns: str, job: str) -> None:
        h.create_job(api, ns, job, "lq")
        wl[f"{ns}/{job}"] = h.job_workload(api, ns, job)
        kube.wait_for_workload_condition(api, ns, wl[f"{ns}/{job}"], "QuotaReserved")
        time.sleep(1.1)  # admission times have 1 s resolution: each Job its own

    try:
        for ns in teams:  # T's first, then U's: U's are the most recently admitted
            run(ns, "run-0")
            run(ns, "run-1")
        c = h.new_controller(kubeconfig, h.live_settings(APPROVED_SCOPE="team",
                                                         AGING_COEFFICIENT="1"))
        with h.started(c, loop=True):
            for ns in teams:  # T's waits longest: its head ranks above U's
                h.create_job(api, ns, "wait", "lq")
                wl[f"{ns}/wait"] = h.job_workload(api, ns, "wait")
                time.sleep(2.1)
            kube.wait_for(lambda: all(PRIORITY_TERMS_ANNOTATION in (kube.get_workload(
                api, ns, wl[f"{ns}/wait"])["metadata"].get("annotations") or {})
                for ns in teams), 30, "the waiting Jobs' priorities")
            time.sleep(3)  # a few cycles and scheduling passes: same class, nothing preempted
            assert not any(preemptions(api, ns) for ns in teams), h.dump_workloads(api, teams)

            kube.request(api, "PATCH", f"/apis/batch/v1/namespaces/{t}/jobs/wait",
                         {"metadata": {"annotations": {APPROVED_ANNOTATION: "true"}}})
            approved = kube.wait_for(
                lambda: (lambda w: w if kube.has_condition(w, "QuotaReserved") else None)(
                    kube.get_workload(api, t, wl[f"{t}/wait"])),
                60, "Kueue to admit the approved Job", lambda: h.dump_workloads(api, teams))
            time.sleep(3)  # a few more cycles: nothing else may be preempted
            got = {ns: preemptions(api, ns) for ns in teams}
            assert got[t] == [(wl[f"{t}/run-1"], approved["metadata"]["uid"])], (
                f"{got}\n{h.dump_workloads(api, teams)}")
            victim = kube.get_workload(api, t, wl[f"{t}/run-1"])
            assert kube.has_condition(victim, "Preempted") and kube.is_pending(victim)
            assert kube.has_condition(kube.get_workload(api, t, wl[f"{t}/run-0"]),
                                      "QuotaReserved")
            if u is not None:
                assert not got[u], f"{got}\n{h.dump_workloads(api, teams)}"
                assert all(kube.has_condition(kube.get_workload(api, u, wl[f"{u}/{j}"]),
                                              "QuotaReserved") for j in ("run-0", "run-1"))
                h.wait_pending(api, u, wl[f"{u}/wait"])
    finally:
        h.cleanup(api, teams, [cq])
