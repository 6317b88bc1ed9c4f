"""Proof on the real plane: reclaim inside one ClusterQueue goes through Kueue's own preemption,
after MIN_RUNTIME, only as many as needed, within the budget, each Workload at most once.

One ClusterQueue of 8 GPUs with `withinClusterQueue: LowerPriority`, two teams of equal weight.
The heavy team holds every GPU with long one-GPU Jobs: six started first ("old"), two a few
seconds later ("new"). The live controller runs with RECLAIM_ENABLED, MIN_RUNTIME 20s and
RECLAIM_BUDGET_PER_HOUR 2; the light team (below its entitlement, same class) submits one Job,
later two more. The witness is Kueue: its Preempted/Evicted conditions and its Preempted Events,
which name the preemptor; the controller cannot write those.

* Before the old Jobs have run MIN_RUNTIME nothing is preempted, though the light Job waits.
* Within one cycle after that Kueue preempts exactly one old Job (only one is needed; the new
  ones have not run MIN_RUNTIME yet), for the light Job.
* Once the new Jobs have run MIN_RUNTIME the light team asks for two more: the budget has one
  preemption left this hour, so Kueue preempts exactly one more, a new Job (most recently
  started: the least work lost), and the third light Job keeps waiting.
* No Workload is preempted twice, no preempted Workload takes its GPU back (Kueue reserved
  quota for each victim once), and every victim's Event from the controller names the light
  team as the one it was exposed to.

The plane runs the end-to-end extras (controller-manager, scheduler, kwok): each admitted Job
has a pod (parked: it never schedules), so, as on a real cluster, a preempted Workload keeps its
quota (Evicted=True, QuotaReserved=True) until its pod is deleted. The controller must leave it
alone meanwhile: a guard written then took it out of Kueue's preemption under way and brought
it back pending with the guard's value, above its preemptor, and it took its GPU back (the
budget, reading Kueue's Preempted condition that readmission clears, then exposed another).

A Workload Kueue evicted while it carried its guard comes back pending with that value: the
controller lowers it, and the exposure of the victim it could have taken stays as it is (no
write withdraws it and makes it again); once released, Kueue preempts the victim for the light
Job and the lowered Workload preempts nothing.

Two shorter tests: with reclaim on, an urgent Job preempts through the class guard as it did
without (nothing exposed, the victim not taken twice); and with Kueue's Fair Sharing on
per-team ClusterQueues the controller adds no reclaim to Kueue's (no heavy Workload exposed, no
preemption by priority, each heavy Workload Kueue left running written once at most: audit log).

No Job uses a WorkloadPriorityClass: Kueue v0.19 retries its inadmissible Workloads when an
admitted Workload's effective priority changes only for Workloads with one
(`workload.PriorityChanged`), so the controller writes each Workload that may take a victim one
point higher (`preempts=` in its terms) - its own priority change makes Kueue retry it.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client as k8s

from controller.domain import PRIORITY_TERMS_ANNOTATION, URGENT_ANNOTATION, PriorityClass
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.plane import Plane

pytestmark = [pytest.mark.plane, pytest.mark.e2e]

GPU = "nvidia.com/gpu"
MIN_RUNTIME = 20.0
LOOP = 1.0
BUDGET = 2
PREEMPTED = re.compile(r"Preempted to accommodate a workload \(UID: ([^,]+), JobUID: [^)]*\) "
                       r"due to (.+?); preemptor path")


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def kueue_preemptions(api: k8s.ApiClient, ns: str) -> list[tuple[str, str, str]]:
    """(victim Workload, preemptor UID, reason text) from Kueue's own Preempted Events."""
    out = []
    for e in kube.request(api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]:
        if e.get("reason") != "Preempted" or e["involvedObject"].get("kind") != "Workload":
            continue
        m = PREEMPTED.search(e.get("message", ""))
        assert m, e.get("message")
        out += [(e["involvedObject"]["name"], m.group(1), m.group(2))] * int(e.get("count") or 1)
    return out


def preempted(api: k8s.ApiClient, ns: str) -> dict[str, kube.Obj]:
    """The namespace's Workloads that carry Kueue's Preempted=True condition, by name."""
    return {w["metadata"]["name"]: w for w in kube.list_workloads(api, ns)
            if kube.has_condition(w, "Preempted")}


def reservations(api: k8s.ApiClient, ns: str) -> Counter[str]:
    """How many times Kueue reserved quota for each Workload (its QuotaReserved Events)."""
    out: Counter[str] = Counter()
    for e in kube.request(api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]:
        if e.get("reason") == "QuotaReserved" and e["involvedObject"].get("kind") == "Workload":
            out[e["involvedObject"]["name"]] += int(e.get("count") or 1)
    return out


def since(wl: kube.Obj, cond: str) -> datetime:
    c = kube.condition(wl, cond)
    assert c is not None and c["status"] == "True", kube.describe_workload(wl)
    return ts(c["lastTransitionTime"])


def two_teams_one_queue(api: k8s.ApiClient, prefix: str, gpus: int) -> tuple[str, str, str]:
    """Two fresh team namespaces (heavy, light), each with LocalQueue "lq" on one new
    ClusterQueue of `gpus` GPUs that preempts within itself by priority (LowerPriority)."""
    heavy, light = kube.create_namespace(api), kube.create_namespace(api)
    cq = kube.unique_name(prefix)
    kube.create_cluster_queue(
        api, cq, {GPU: gpus}, preemption={"withinClusterQueue": "LowerPriority"},
        namespace_selector={"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                  "operator": "In", "values": [heavy, light]}]})
    for ns in (heavy, light):
        kube.create_local_queue(api, ns, "lq", cq)
    return heavy, light, cq


def test_reclaim_after_min_runtime_only_as_needed_within_the_budget(
    e2e_plane: Plane, api: k8s.ApiClient, kubeconfig: Path,
) -> None:
    heavy, light, cq = two_teams_one_queue(api, "cq-reclaim", 8)
    wl_of: dict[str, str] = {}  # job name -> Workload name

    def submit(ns: str, job: str) -> str:
        h.create_job(api, ns, job, "lq", requests={GPU: "1"})
        wl_of[job] = h.job_workload(api, ns, job)
        return wl_of[job]

    def admit(jobs: list[str]) -> list[datetime]:
        for j in jobs:
            submit(heavy, j)
        return [since(kube.wait_for_workload_condition(api, heavy, wl_of[j], "QuotaReserved"),
                      "QuotaReserved") for j in jobs]

    try:
        old = [f"old-{i}" for i in range(6)]
        new = ["new-0", "new-1"]
        old_starts = admit(old)
        time.sleep(1.1)  # start times have 1 s resolution
        new_starts = admit(new)
        assert min(new_starts) > max(old_starts)
        first_due = min(old_starts).timestamp() + MIN_RUNTIME

        settings = h.live_settings(
            RESOURCE_WEIGHTS="{nvidia.com/gpu: 1}", RECLAIM_ENABLED="true",
            MIN_RUNTIME=f"{MIN_RUNTIME:g}s", RECLAIM_BUDGET_PER_HOUR=str(BUDGET),
            LOOP_INTERVAL=f"{LOOP:g}")
        c = h.new_controller(kubeconfig, settings)
        with h.started(c, loop=True):
            first = submit(light, "light-0")
            # Waiting, and nothing preempted, until the old Jobs have run MIN_RUNTIME.
            while time.time() < first_due - 1.5:
                assert not preempted(api, heavy), "preempted before MIN_RUNTIME"
                h.wait_pending(api, light, first)
                time.sleep(0.5)

            kube.wait_for(lambda: preempted(api, heavy), 30, "Kueue to preempt a heavy Job",
                          lambda: h.dump_workloads(api, [heavy, light]))
            kube.wait_for_workload_condition(api, light, first, "QuotaReserved", timeout=30)
            time.sleep(3 * LOOP)  # a few more cycles: nothing else may be preempted
            victims = preempted(api, heavy)
            assert len(victims) == 1, sorted(victims)
            (v1, w1), = victims.items()
            assert v1 in {wl_of[j] for j in old}, f"{v1}: the new Jobs had not run MIN_RUNTIME"
            start = dict(zip([wl_of[j] for j in old], old_starts, strict=True))[v1]
            ran = since(w1, "Preempted").timestamp() - start.timestamp()
            # within one cycle of MIN_RUNTIME (times in whole seconds; a cycle is LOOP)
            assert MIN_RUNTIME - 1 <= ran <= MIN_RUNTIME + LOOP + 4, f"preempted after {ran:.0f}s"
            print(f"\nfirst victim preempted {ran:.0f}s after it started "
                  f"(MIN_RUNTIME {MIN_RUNTIME:g}s, LOOP_INTERVAL {LOOP:g}s)")

            # The new Jobs reach MIN_RUNTIME; the light team asks for two more GPUs.
            time.sleep(max(0.0, max(new_starts).timestamp() + MIN_RUNTIME + 1 - time.time()))
            more = [submit(light, "light-1")]
            time.sleep(1.1)  # distinct creation times: one order for the team and for Kueue
            more.append(submit(light, "light-2"))
            kube.wait_for(lambda: len(preempted(api, heavy)) >= 2, 30,
                          "Kueue to preempt a second heavy Job",
                          lambda: h.dump_workloads(api, [heavy, light]))
            kube.wait_for(lambda: any(kube.has_condition(kube.get_workload(api, light, w),
                                                         "QuotaReserved") for w in more),
                          30, "a light Job admitted in the GPU freed for it",
                          lambda: h.dump_workloads(api, [heavy, light]))
            time.sleep(5 * LOOP)  # several cycles: the budget allows no third
            victims = preempted(api, heavy)
            assert len(victims) == BUDGET, sorted(victims)
            v2, = (k for k in victims if k != v1)
            assert v2 in {wl_of[j] for j in new}, f"{v2} is not among the most recently started"
            admitted_more = [w for w in more if kube.has_condition(
                kube.get_workload(api, light, w), "QuotaReserved")]
            assert len(admitted_more) == 1, admitted_more
            still = kube.get_workload(api, light, next(w for w in more if w not in admitted_more))
            assert kube.is_pending(still), kube.describe_workload(still)
            exposed_now = [w["metadata"]["name"] for w in kube.list_workloads(api, heavy)
                           if "state=reclaimable" in (w["metadata"].get("annotations") or {})
                           .get(PRIORITY_TERMS_ANNOTATION, "")]
            assert not exposed_now, f"exposed beyond the budget: {exposed_now}" + "\n".join(
                kube.describe_workload(w) for w in kube.list_workloads(api, heavy))

            # Kueue's own record: each victim preempted once, by a light Workload, by priority.
            light_uids = {w["metadata"]["uid"]: w["metadata"]["name"]
                          for w in kube.list_workloads(api, light)}
            events = kueue_preemptions(api, heavy)
            assert Counter(v for v, _, _ in events) == {v1: 1, v2: 1}, events
            assert all(p in light_uids and r == "prioritization in the ClusterQueue"
                       for _, p, r in events), (events, light_uids)
            uids = {w["metadata"]["uid"]: f"{ns}/{w['metadata']['name']}"
                    for ns in (heavy, light) for w in kube.list_workloads(api, ns)}
            back = [(v, uids.get(p, p)) for v, p, _ in kueue_preemptions(api, light)]
            assert not back, (f"light Workloads preempted: {back}\n"
                              f"{h.dump_workloads(api, [heavy, light])}")
            # Kueue reserved quota for each victim once: none took its GPU back
            again = reservations(api, heavy)
            assert again[v1] == again[v2] == 1, again
            for v in (v1, v2):
                wl = kube.get_workload(api, heavy, v)
                assert kube.has_condition(wl, "Evicted") and kube.is_pending(wl), (
                    kube.describe_workload(wl))
                terms = (wl["metadata"].get("annotations") or {}).get(
                    PRIORITY_TERMS_ANNOTATION, "")
                assert f"reclaimed-for={light}" in terms, terms
                said = [e["message"] for e in h.events_for(api, heavy, v)]
                assert any("reclaimable" in m and light in m for m in said), said
    finally:
        h.cleanup(api, [heavy, light], [cq])


def stop_policy(api: k8s.ApiClient, ns: str, lq: str, policy: str) -> None:
    """A LocalQueue's stopPolicy: `Hold` keeps its pending Workloads out of Kueue's scheduling
    (nothing admitted, nothing preempted for them); `None` lets them in again."""
    kube.request(api, "PATCH", kube.kueue_path("localqueues", lq, ns),
                 {"spec": {"stopPolicy": policy}})


def terms_of(api: k8s.ApiClient, ns: str, name: str) -> str:
    wl = kube.get_workload(api, ns, name)
    return str((wl["metadata"].get("annotations") or {}).get(PRIORITY_TERMS_ANNOTATION, ""))


def test_a_workload_evicted_while_guarded_comes_back_without_unexposing_anything(
    e2e_plane: Plane, api: k8s.ApiClient, kubeconfig: Path,
) -> None:
    """A heavy Workload Kueue evicted while it carried its guard comes back pending with that
    value (its LocalQueue held meanwhile, as a requeue backoff after PodsReadyTimeout keeps it
    from Kueue's scheduler): the controller lowers it, and the victim exposed to the light team
    stays exposed - no write withdraws the exposure, none makes it again (apiserver audit log).
    Released, Kueue preempts that victim for the light Job and the lowered Workload preempts
    nothing (Kueue's own conditions and Preempted Events)."""
    heavy, light, cq = two_teams_one_queue(api, "cq-back", 6)
    stop_policy(api, light, "lq", "Hold")  # the light Job waits, exposure in place
    try:
        held: list[str] = []
        for i in range(6):
            if i >= 4:
                time.sleep(1.1)  # h-4, then h-5 started last (start times: 1 s resolution)
            h.create_job(api, heavy, f"h-{i}", "lq", requests={GPU: "1"})
            held.append(h.job_workload(api, heavy, f"h-{i}"))
            kube.wait_for_workload_condition(api, heavy, held[-1], "QuotaReserved")
        h0, victim, others = held[0], held[5], held[1:5]
        settings = h.live_settings(
            RESOURCE_WEIGHTS="{nvidia.com/gpu: 1}", RECLAIM_ENABLED="true",
            MIN_RUNTIME=f"{MIN_RUNTIME:g}s", RECLAIM_BUDGET_PER_HOUR="10",
            LOOP_INTERVAL=f"{LOOP:g}")
        c = h.new_controller(kubeconfig, settings)
        with h.started(c, loop=True):
            h.create_job(api, light, "l-0", "lq", requests={GPU: "2"})
            l0 = h.job_workload(api, light, "l-0")
            # heavy's own waiting Job: the exposures stay above it (it must not take them)
            h.create_job(api, heavy, "h-wait", "lq", requests={GPU: "1"})
            waiting = h.job_workload(api, heavy, "h-wait")
            # heavy holds 2x its entitlement: h-5 and h-4 exposed, the others guarded
            kube.wait_for(lambda: "state=admitted" in terms_of(api, heavy, h0)
                          and "state=reclaimable" in terms_of(api, heavy, victim), 60,
                          "h-0 guarded and h-5 exposed to the light team",
                          lambda: h.dump_workloads(api, [heavy, light]))
            # Kueue evicts h-0 (guarded); it frees its GPU (held for no one: heavy's queue is
            # on hold), so the light Job needs one victim.
            stop_policy(api, heavy, "lq", "Hold")
            h.release(api, heavy, h0)
            assert "state=admitted" in terms_of(api, heavy, h0)
            time.sleep(4 * LOOP)  # the plan settles: h-5 exposed, h-1 to h-4 guarded
            assert "state=reclaimable" in terms_of(api, heavy, victim), (
                h.dump_workloads(api, [heavy, light]))

            def writes_to(name: str) -> int:
                return sum(1 for e in e2e_plane.audit_events("wdrf-controller")
                           if e.get("verb") == "patch" and e.get("stage") == "ResponseComplete"
                           and (e.get("objectRef") or {}).get("namespace") == heavy
                           and (e.get("objectRef") or {}).get("name") == name)

            before = {w: writes_to(w) for w in held[1:]}
            kube.patch_workload(api, heavy, h0, {"spec": {"active": True}})
            kube.wait_for(lambda: " state=" not in terms_of(api, heavy, h0), 30,
                          "the controller to lower h-0 (pending again with its guard)",
                          lambda: h.dump_workloads(api, [heavy, light]))
            time.sleep(5 * LOOP)  # several cycles: an exposure withdrawn would be made again
            after = {w: writes_to(w) for w in held[1:]}
            assert after == before, (before, after, h.dump_workloads(api, [heavy, light]))
            assert "state=reclaimable" in terms_of(api, heavy, victim), terms_of(
                api, heavy, victim)
            boost = kube.get_workload(api, heavy, h0)["metadata"]["annotations"]
            assert int(boost.get("kueue.x-k8s.io/priority-boost", "0")) < settings.guard(
                PriorityClass.NORMAL), boost

            # Released: the light Job first (it takes the free GPU and h-5's), then h-0.
            stop_policy(api, light, "lq", "None")
            kube.wait_for_workload_condition(api, light, l0, "QuotaReserved", timeout=30)
            stop_policy(api, heavy, "lq", "None")
            time.sleep(4 * LOOP)
            assert set(preempted(api, heavy)) == {victim}, sorted(preempted(api, heavy))
            uid = kube.get_workload(api, light, l0)["metadata"]["uid"]
            assert kueue_preemptions(api, heavy) == [
                (victim, uid, "prioritization in the ClusterQueue")], kueue_preemptions(
                    api, heavy)
            for w in others:
                assert kube.has_condition(kube.get_workload(api, heavy, w), "QuotaReserved"), (
                    kube.describe_workload(kube.get_workload(api, heavy, w)))
            assert kube.is_pending(kube.get_workload(api, heavy, h0))
            assert kube.is_pending(kube.get_workload(api, heavy, waiting))
    finally:
        h.cleanup(api, [heavy, light], [cq])


def test_under_reclaim_urgent_work_preempts_as_before(
    e2e_plane: Plane, api: k8s.ApiClient, kubeconfig: Path,
) -> None:
    """Reclaim on, nothing reclaimable yet (MIN_RUNTIME 1h): a light normal Job waits, an
    urgent one preempts one heavy Job at once, through the class guard as without reclaim,
    and the victim is not exposed, not taken again, and does not take its GPU back."""
    heavy, light, cq = two_teams_one_queue(api, "cq-urgent", 4)
    try:
        held = []
        for i in range(4):
            h.create_job(api, heavy, f"h-{i}", "lq", requests={GPU: "1"})
            held.append(h.job_workload(api, heavy, f"h-{i}"))
        for w in held:
            kube.wait_for_workload_condition(api, heavy, w, "QuotaReserved")
        settings = h.live_settings(
            RESOURCE_WEIGHTS="{nvidia.com/gpu: 1}", RECLAIM_ENABLED="true", MIN_RUNTIME="1h",
            RECLAIM_BUDGET_PER_HOUR="10", LOOP_INTERVAL=f"{LOOP:g}")
        c = h.new_controller(kubeconfig, settings)
        with h.started(c, loop=True):
            h.create_job(api, light, "normal", "lq", requests={GPU: "1"})
            normal = h.job_workload(api, light, "normal")
            kube.wait_for(lambda: "priority-boost" in " ".join(
                kube.get_workload(api, light, normal)["metadata"].get("annotations") or {}),
                30, "the controller to write the light normal Job's priority")
            time.sleep(3 * LOOP)
            assert not preempted(api, heavy), "reclaimed before MIN_RUNTIME"

            h.create_job(api, light, "urgent", "lq", requests={GPU: "1"},
                         annotations={URGENT_ANNOTATION: "true"})
            urgent = h.job_workload(api, light, "urgent")
            kube.wait_for_workload_condition(api, light, urgent, "QuotaReserved", timeout=30)
            time.sleep(3 * LOOP)  # a few more cycles: nothing else may be preempted

            victims = preempted(api, heavy)
            assert len(victims) == 1, sorted(victims)
            (victim, wl), = victims.items()
            uid = kube.get_workload(api, light, urgent)["metadata"]["uid"]
            assert kueue_preemptions(api, heavy) == [
                (victim, uid, "prioritization in the ClusterQueue")]
            assert not kueue_preemptions(api, light)
            assert kube.is_pending(kube.get_workload(api, light, normal))
            terms = (wl["metadata"].get("annotations") or {}).get(PRIORITY_TERMS_ANNOTATION, "")
            assert "reclaim" not in terms, terms
            assert not any("reclaimable" in e["message"]
                           for w in held for e in h.events_for(api, heavy, w))
            assert reservations(api, heavy)[victim] == 1, reservations(api, heavy)
            assert kube.is_pending(kube.get_workload(api, heavy, victim))
    finally:
        h.cleanup(api, [heavy, light], [cq])


def test_with_fair_sharing_on_per_team_queues_no_second_reclaim(
    e2e_plane: Plane, api: k8s.ApiClient, kubeconfig: Path,
) -> None:
    """Kueue Fair Sharing, one ClusterQueue per team in a cohort, reclaim on: the heavy team
    borrowed the light team's 2 GPUs; the light team asks for 3. Kueue's Fair Sharing takes
    back the 2 borrowed, and the controller adds nothing: no third preemption, no heavy
    Workload exposed, each one it wrote written once (its guard; apiserver audit log)."""
    heavy, light = kube.create_namespace(api), kube.create_namespace(api)
    cohort = kube.unique_name("co")
    cqs = {ns: kube.unique_name("cq-fs") for ns in (heavy, light)}
    preemption = {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    fair = {"fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare",
                                                     "LessThanInitialShare"]}}
    with e2e_plane.kueue_configured(extra={**e2e_plane.kueue_settings.extra, **fair}):
        try:
            for ns, cq in cqs.items():
                kube.create_cluster_queue(
                    api, cq, {GPU: 2}, preemption=preemption, cohort=cohort,
                    namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": ns}})
                kube.create_local_queue(api, ns, "lq", cq)
            held = []
            for i in range(4):
                h.create_job(api, heavy, f"h-{i}", "lq", requests={GPU: "1"})
                held.append(h.job_workload(api, heavy, f"h-{i}"))
            for w in held:
                kube.wait_for_workload_condition(api, heavy, w, "QuotaReserved", timeout=60)
            settings = h.live_settings(
                RESOURCE_WEIGHTS="{nvidia.com/gpu: 1}", RECLAIM_ENABLED="true",
                MIN_RUNTIME="1s", RECLAIM_BUDGET_PER_HOUR="10", LOOP_INTERVAL=f"{LOOP:g}")
            c = h.new_controller(kubeconfig, settings)
            with h.started(c, loop=True):
                mine = []
                for i in range(3):
                    h.create_job(api, light, f"l-{i}", "lq", requests={GPU: "1"})
                    mine.append(h.job_workload(api, light, f"l-{i}"))

                def admitted() -> list[str]:
                    return [w for w in mine if kube.has_condition(
                        kube.get_workload(api, light, w), "QuotaReserved")]

                kube.wait_for(lambda: len(admitted()) >= 2, 60,
                              "Kueue's Fair Sharing to give the light team its 2 GPUs back",
                              lambda: h.dump_workloads(api, [heavy, light]))
                time.sleep(5 * LOOP)  # several cycles: nothing more may be preempted
                assert len(admitted()) == 2, admitted()

            victims = preempted(api, heavy)
            assert len(victims) == 2, sorted(victims)
            events = kueue_preemptions(api, heavy)
            assert Counter(v for v, _, _ in events) == {v: 1 for v in victims}, events
            # Kueue's own reclaim across the cohort's queues, never by priority in a queue
            assert {r for _, _, r in events} <= {"Fair Sharing within the cohort",
                                                 "reclamation within the cohort"}, events
            assert not kueue_preemptions(api, light)
            for w in kube.list_workloads(api, heavy):
                terms = (w["metadata"].get("annotations") or {}).get(
                    PRIORITY_TERMS_ANNOTATION, "")
                assert "reclaim" not in terms, terms
            said = [e["message"] for w in held for e in h.events_for(api, heavy, w)]
            assert not any("reclaimable" in m for m in said), said
            writes = Counter(
                (e.get("objectRef") or {}).get("name") for e in e2e_plane.audit_events(
                    "wdrf-controller")
                if e.get("verb") == "patch" and e.get("stage") == "ResponseComplete"
                and (e.get("objectRef") or {}).get("namespace") == heavy
                and (e.get("objectRef") or {}).get("resource") == "workloads")
            kept = [w for w in held if w not in victims]
            assert all(writes[w] <= 1 for w in kept), writes
        finally:
            h.cleanup(api, [heavy, light], list(cqs.values()))
