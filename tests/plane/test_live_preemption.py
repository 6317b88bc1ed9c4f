"""Proof on the real plane: priority model v2 is safe under Kueue's preemption.

Three teams, one ClusterQueue each, in one cohort; every ClusterQueue has
`withinClusterQueue: LowerPriority` and `reclaimWithinCohort: Any` (what clusters that use
priority classes run). 31 one-cpu Jobs over the three teams, mixed classes, created over time,
with aging ON (AGING_COEFFICIENT 1, the default) and the controller's loop running throughout.

The witness is Kueue itself: every `Preempted` Event Kueue records on a Workload names the
preemptor's UID and the reason. The controller cannot write those. The test checks:
* no Workload is preempted "due to prioritization" by a Workload of the same class (aging and
  fairness never evict), and none by an approved one unless it is normal and approved may;
* urgent work did preempt normal work (the class still means something);
* no Workload is preempted twice by priority (no ping-pong);
* afterwards, freeing one slot: Kueue admits the head of the controller's plan.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from controller.domain import (
    APPROVED_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    URGENT_ANNOTATION,
)
from controller.workload import (
    annotations_of,
    condition,
    condition_true,
    effective_priority,
    terms_of,
)
from tests.plane import live_helpers as h
from tests.support import kube

pytestmark = pytest.mark.plane

_MESSAGE = re.compile(r"Preempted to accommodate a workload \(UID: ([^,]+), JobUID: [^)]*\) "
                      r"due to (.+?); preemptor path")
CLASSES = {"normal": {}, "approved": {APPROVED_ANNOTATION: "true"},
           "urgent": {URGENT_ANNOTATION: "true"}}


def _kueue_preemptions(api: k8s.ApiClient, namespaces: list[str]) -> list[tuple[str, str, str]]:
    """(victim namespace/name, preemptor UID, reason text) from Kueue's own Events."""
    out = []
    for ns in namespaces:
        items = kube.request(api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
        for e in items:
            if e.get("reason") != "Preempted" or e["involvedObject"].get("kind") != "Workload":
                continue
            m = _MESSAGE.search(e.get("message", ""))
            assert m, e.get("message")
            for _ in range(int(e.get("count") or 1)):
                out.append((f"{ns}/{e['involvedObject']['name']}", m.group(1), m.group(2)))
    return out


def _queue_view(api: k8s.ApiClient, keys: dict[str, str]) -> list[tuple[Any, ...]]:
    """What Kueue orders pending Workloads by, per Workload: effective priority, creation time,
    last eviction time and message, whether it holds quota, and the controller's terms."""
    out = []
    for key, ns in sorted(keys.items()):
        wl = kube.get_workload(api, ns, key.split("/", 1)[1])
        evicted = condition(wl, "Evicted") if condition_true(wl, "Evicted") else None
        out.append((key, effective_priority(wl), wl["metadata"]["creationTimestamp"],
                    evicted and (evicted.get("lastTransitionTime"),
                                 str(evicted.get("message", ""))[:90]),
                    kube.has_condition(wl, "QuotaReserved"),
                    annotations_of(wl).get(PRIORITY_TERMS_ANNOTATION)))
    return out


def test_no_same_class_preemption_urgent_preempts_and_no_ping_pong(
    api: k8s.ApiClient, kubeconfig: Path
) -> None:
    teams = [kube.create_namespace(api) for _ in range(3)]
    cohort = kube.unique_name("pre")
    cqs = []
    preemption = {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    for ns in teams:
        cq = kube.unique_name("cq-pre")
        kube.create_cluster_queue(api, cq, {"cpu": 2}, preemption=preemption, cohort=cohort,
                                  namespace_selector={})
        kube.create_local_queue(api, ns, "lq", cq)
        cqs.append(cq)
    cls_of: dict[str, str] = {}  # Workload UID -> class
    key_of: dict[str, str] = {}  # Workload UID -> namespace/name

    def submit(team: int, job: str, cls: str) -> None:
        ns = teams[team]
        h.create_job(api, ns, job, "lq", annotations=CLASSES[cls])
        wl = kube.get_workload(api, ns, h.job_workload(api, ns, job))
        cls_of[wl["metadata"]["uid"]] = cls
        key_of[wl["metadata"]["uid"]] = f"{ns}/{wl['metadata']['name']}"

    try:
        # Team 0 fills the whole cohort (2 nominal + 4 borrowed) before the controller runs.
        for i in range(6):
            submit(0, f"a-run-{i}", "normal")
        kube.wait_for(lambda: sum(kube.has_condition(kube.get_workload(api, *k.split("/")),
                                                    "QuotaReserved")
                                  for k in key_of.values()) == 6 or None, 60, "6 admitted")

        settings = h.live_settings(AGING_COEFFICIENT="1", RESOURCE_WEIGHTS="{cpu: 1}")
        c = h.new_controller(kubeconfig, settings)
        with h.started(c, loop=True):
            waves = [
                [(0, f"a-wait-{i}", "normal") for i in range(8)],
                [(1, f"b-norm-{i}", "normal") for i in range(6)],  # reclaims b's nominal
                [(2, "c-appr-0", "approved"), (2, "c-appr-1", "approved")]
                + [(2, f"c-norm-{i}", "normal") for i in range(5)],  # reclaims c's nominal
                [(0, "a-urgent-0", "urgent"), (0, "a-urgent-1", "urgent"),
                 (1, "b-urgent-0", "urgent")],  # preempt normal work inside their queues
            ]
            for wave in waves:
                for team, job, cls in wave:
                    submit(team, job, cls)
                    time.sleep(0.3)  # distinct creation times: ages differ
                time.sleep(6)  # several controller cycles and Kueue scheduling passes
            assert len(cls_of) >= 30
            time.sleep(10)  # aging keeps running: nothing more may be evicted by it

            preemptions = _kueue_preemptions(api, teams)
            by_priority = [(v, p, r) for v, p, r in preemptions
                           if r == "prioritization in the ClusterQueue"]
            victims_cls = {v: cls for uid, cls in cls_of.items() for v in [key_of[uid]]}
            same_class = [(v, cls_of.get(p), key_of.get(p, p)) for v, p, _ in by_priority
                          if cls_of.get(p) == victims_cls.get(v)]
            assert not same_class, f"same-class preemptions by priority: {same_class}"
            approved_over_normal = [(v, key_of.get(p, p)) for v, p, _ in by_priority
                                    if cls_of.get(p) == "approved"]
            assert not approved_over_normal, (
                f"preempted by approved work: {approved_over_normal}; every preemption "
                f"(victim, preemptor, reason): "
                f"{[(v, key_of.get(p, p), r) for v, p, r in preemptions]}")
            urgent_over_normal = [(v, p) for v, p, _ in by_priority
                                  if cls_of.get(p) == "urgent" and victims_cls.get(v) == "normal"]
            assert len(urgent_over_normal) >= 2, (preemptions, urgent_over_normal)
            twice = [v for v, n in Counter(v for v, _, _ in by_priority).items() if n > 1]
            assert not twice, f"preempted twice by priority: {twice}"
            print(f"\nKueue preemptions: {len(preemptions)} "
                  f"({Counter(r for _, _, r in preemptions)}); by priority: "
                  f"{Counter((cls_of.get(p), victims_cls.get(v)) for v, p, _ in by_priority)}")

            # Kueue's admission order is still the plan's: free one slot in team 1's queue.
            report = h.converge(c)
            head = h.head_of(report, cqs[1])
            running = [k for k in key_of.values() if k.startswith(teams[1] + "/")
                       and kube.has_condition(kube.get_workload(api, *k.split("/")),
                                              "QuotaReserved")]
            candidates = {k: k.split("/")[0] for k in key_of.values()
                          if k.startswith(teams[1] + "/") and k not in running}
            assert head.key in candidates and running, (head.key, running)
            before = _queue_view(api, candidates)
            h.release(api, *running[0].split("/"))
            got = h.next_admitted(api, candidates)
            assert got == head.key, (
                f"Kueue admitted {got}, the plan's head is {head.key}; the plan: "
                f"{[(d.key, d.rank, d.target_priority) for d in h.planned_in(report, cqs[1])]}; "
                f"Kueue's view before the release: {before}; after: "
                f"{_queue_view(api, candidates)}")
    finally:
        h.cleanup(api, teams, cqs)


def test_urgent_preempts_guarded_normal_work_before_guarded_approved_work(
    api: k8s.ApiClient, kubeconfig: Path
) -> None:
    """Team x runs a normal Job, then (admitted later) an approved one; team y's approved Job
    waits and reaches both, so both get their class guards. An urgent Job arrives: Kueue takes
    the lowest priority first (at equal priority, the most recently admitted), so the approved
    guard one above the normal guard makes it take the normal Job - Kueue's own Preempted
    condition says which."""
    x, y = kube.create_namespace(api), kube.create_namespace(api)
    cq = kube.unique_name("cq-guard")
    kube.create_cluster_queue(api, cq, {"cpu": 2},
                              preemption={"withinClusterQueue": "LowerPriority"})
    for ns in (x, y):
        kube.create_local_queue(api, ns, "lq", cq)
    try:
        def admitted(ns: str, job: str) -> dict[str, Any]:
            return kube.wait_for_workload_condition(api, ns, h.job_workload(api, ns, job),
                                                    "QuotaReserved", timeout=60)

        h.create_job(api, x, "normal", "lq")
        normal = admitted(x, "normal")
        time.sleep(1.5)  # a later admission second: at equal priority Kueue would take this one
        h.create_job(api, x, "approved", "lq", annotations=CLASSES["approved"])
        approved = admitted(x, "approved")
        h.create_job(api, y, "waiting", "lq", annotations=CLASSES["approved"])

        c = h.new_controller(kubeconfig, h.live_settings())
        with h.started(c, loop=True):
            def guards() -> tuple[int, int] | None:
                n = kube.get_workload(api, x, normal["metadata"]["name"])
                a = kube.get_workload(api, x, approved["metadata"]["name"])
                guarded = all(terms_of(w).get("state") == "admitted" for w in (n, a))
                return (effective_priority(n), effective_priority(a)) if guarded else None

            normal_guard, approved_guard = kube.wait_for(guards, 60, "both guards written")

            h.create_job(api, y, "urgent", "lq", annotations=CLASSES["urgent"])
            taken = kube.wait_for(
                lambda: [n for n in (normal, approved) if kube.has_condition(
                    kube.get_workload(api, x, n["metadata"]["name"]), "Preempted")] or None,
                60, "a preemption")
            assert [w["metadata"]["name"] for w in taken] == [normal["metadata"]["name"]], (
                normal_guard, approved_guard)
            assert approved_guard > normal_guard, (normal_guard, approved_guard)
            time.sleep(3)  # nothing else goes
            assert not kube.has_condition(
                kube.get_workload(api, x, approved["metadata"]["name"]), "Preempted")
    finally:
        h.cleanup(api, [x, y], [cq])
