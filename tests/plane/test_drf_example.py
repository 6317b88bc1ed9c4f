"""Proof on the real plane: a burst of freed quota is shared the way DRF's progressive filling
shares it, on the DRF paper's worked example (Ghodsi et al., "Dominant Resource Fairness", NSDI
2011, section 4).

One ClusterQueue of 9 cpu and 18Gi memory, held by a third team's Job. Team A's one-pod Jobs ask
for <1 cpu, 4Gi>, team B's for <3 cpu, 1Gi>; six of each are pending, one team's created before
the other's. The live controller runs until every pending Workload carries its priority (the
priority-terms annotation) and a cycle finds nothing to write; then the holder is deactivated
and Kueue hands the whole quota out at once, in its own order, while the controller keeps
running. The witness is Kueue's QuotaReserved and Admitted conditions: the count per team must
equal the weighted DRF allocation that progressive filling, computed here from the task sizes,
the quota and the weights, gives.

Before the burst Kueue must have seen every priority: a Workload it has not tried since its last
priority change is still in its active heap and takes freed quota ahead of the ones it found
inadmissible, which return to the heap in a batch up to a second later (whatever their
priority). So after the controller's last write the holder's team submits a sentinel that never
fits (10 cpu) at the lowest priority (override 0): Kueue pops its heap in priority order, so once
it has marked the sentinel Pending it has tried every other pending Workload since its last
write. The sentinel also keeps the holder's team in the pool, so the teams' entitlements do not
change during the burst.

What each case rules out: Kueue alone admits in creation order, the first team's Jobs while
they fit (B 3, A 0 with B first; A 4, B 1 with A first); a controller that ignored the weights
would give the equal-weights answer, A 3, B 2.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path

import pytest
from kubernetes import client as k8s

from controller.domain import PRIORITY_OVERRIDE_ANNOTATION, PRIORITY_TERMS_ANNOTATION
from tests.plane import live_helpers as h
from tests.support import drf, kube
from tests.support.drf import Alloc

pytestmark = pytest.mark.plane

CAPACITY = {"cpu": Fraction(9), "memory_gi": Fraction(18)}
TASKS = {"a": {"cpu": Fraction(1), "memory_gi": Fraction(4)},
         "b": {"cpu": Fraction(3), "memory_gi": Fraction(1)}}
PER_TEAM = 6


def progressive_filling(weights: Mapping[str, Fraction]) -> set[Alloc]:
    """Every allocation weighted DRF allows here (tests/support/drf.py: one when ties do not
    matter)."""
    return drf.progressive_filling(
        {t: drf.Team(TASKS[t], PER_TEAM, weights[t]) for t in TASKS}, CAPACITY, CAPACITY)


def creation_order(first: str) -> dict[str, int]:
    """What Kueue admits without the controller: every Job in creation order if it fits."""
    count = dict.fromkeys(TASKS, 0)
    for team in (first, *(t for t in TASKS if t != first)):
        for _ in range(PER_TEAM):
            used = {r: sum(n * TASKS[t][r] for t, n in count.items()) for r in CAPACITY}
            if all(used[r] + q <= CAPACITY[r] for r, q in TASKS[team].items()):
                count[team] += 1
    return count


def fits_nothing_more(admitted: Mapping[str, int]) -> bool:
    """No team with a pending Job has room for its next one: Kueue has nothing left to admit."""
    used = {r: sum(n * TASKS[t][r] for t, n in admitted.items()) for r in CAPACITY}
    return all(n == PER_TEAM or any(used[r] + q > CAPACITY[r] for r, q in TASKS[t].items())
               for t, n in admitted.items())


def test_the_tests_progressive_filling_gives_the_papers_answer() -> None:
    assert progressive_filling({"a": Fraction(1), "b": Fraction(1)}) == {(("a", 3), ("b", 2))}
    assert creation_order("b") == {"a": 0, "b": 3}  # what the issue saw Kueue admit alone


WEIGHTS = {"equal": {}, "a3": {"a": 3.0}, "b0.25": {"b": 0.25}}


@pytest.mark.parametrize("weights", list(WEIGHTS))
@pytest.mark.parametrize("first", ["a", "b"], ids=["a-first", "b-first"])
def test_a_burst_of_freed_quota_goes_as_drf_gives_it(
    api: k8s.ApiClient, kubeconfig: Path, first: str, weights: str,
) -> None:
    team_weight = {t: WEIGHTS[weights].get(t, 1.0) for t in TASKS}
    drf = progressive_filling({t: Fraction(w) for t, w in team_weight.items()})
    assert len(drf) == 1, f"DRF allows {drf}: a tie decides, the case proves nothing"
    expected = dict(drf.pop())
    equal = dict(progressive_filling(dict.fromkeys(TASKS, Fraction(1))).pop())
    assert expected != creation_order(first) or expected != equal  # the case can fail

    ns = {t: kube.create_namespace(api) for t in ("a", "b", "holder")}
    cq = kube.unique_name("cq-drf")
    kube.create_cluster_queue(
        api, cq, {"cpu": "9", "memory": "18Gi"},
        namespace_selector={"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                  "operator": "In", "values": list(ns.values())}]})
    for n in ns.values():
        kube.create_local_queue(api, n, "lq", cq)
    settings = h.live_settings(
        RESOURCE_WEIGHTS="{cpu: 1, memory: 1}",
        TEAM_WEIGHTS="{" + ", ".join(f"{ns[t]}: {w:g}" for t, w in team_weight.items()) + "}")

    def workloads(t: str) -> list[kube.Obj]:
        return kube.list_workloads(api, ns[t])

    def admitted() -> dict[str, int]:
        return {t: sum(kube.has_condition(w, "QuotaReserved") and kube.has_condition(w, "Admitted")
                       for w in workloads(t)) for t in TASKS}

    def saturated() -> dict[str, int] | None:
        now = admitted()
        return now if fits_nothing_more(now) else None

    def all_prioritised() -> bool:
        wls = workloads("a") + workloads("b")
        return len(wls) == 2 * PER_TEAM and all(
            PRIORITY_TERMS_ANNOTATION in (w["metadata"].get("annotations") or {}) for w in wls)

    try:
        h.create_job(api, ns["holder"], "holder", "lq", requests={"cpu": "9", "memory": "18Gi"})
        holder = h.job_workload(api, ns["holder"], "holder")
        kube.wait_for_workload_condition(api, ns["holder"], holder, "QuotaReserved")
        second = "b" if first == "a" else "a"
        for t in (first, second):
            for i in range(PER_TEAM):
                task = TASKS[t]
                h.create_job(api, ns[t], f"{t}-{i}", "lq",
                             requests={"cpu": str(task["cpu"]), "memory": f"{task['memory_gi']}Gi"})
            for i in range(PER_TEAM):
                h.job_workload(api, ns[t], f"{t}-{i}")  # Kueue created its Workload
            if t == first:
                time.sleep(1.1)  # creation times have 1 s resolution: the first team's are earlier

        c = h.new_controller(kubeconfig, settings)
        with h.started(c, loop=True):
            kube.wait_for(all_prioritised, 60, "a priority on every pending Workload")
            h.converge(c)  # a cycle with nothing left to write
            h.create_job(api, ns["holder"], "sentinel", "lq", requests={"cpu": "10"},
                         annotations={PRIORITY_OVERRIDE_ANNOTATION: "0"})
            kube.wait_for_workload_condition(api, ns["holder"],
                                             h.job_workload(api, ns["holder"], "sentinel"),
                                             "QuotaReserved", "False", 60, reason="Pending")
            assert admitted() == {"a": 0, "b": 0}

            h.deactivate(api, ns["holder"], holder)  # the whole quota frees at once
            got = kube.wait_for(saturated, 60, "Kueue to admit what fits",
                                lambda: str(admitted()))
            time.sleep(2)  # the quota is spent: nothing more may be admitted after it
            assert admitted() == got
        assert got == expected, (
            f"Kueue admitted {got}, DRF gives {expected} (weights {team_weight}, {first} first)")
    finally:
        h.cleanup(api, list(ns.values()), [cq])
