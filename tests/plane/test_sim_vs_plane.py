"""The trace simulator checked against the real plane: two small scenarios, replayed both in
the Kueue model (evaluation/kueue.py, WDRF through `evaluation.wdrf.WdrfKueue`, i.e.
the controller's own `compute_plan`) and on the real control plane (kube-apiserver, Kueue's
manager, kube-controller-manager, kube-scheduler, kwok GPU nodes) with the live controller
writing priorities, must give the same admissions in the same order and the same preemptions
(which Workload was preempted, for which).

* `single-cq`: four teams share one ClusterQueue of 6 GPUs; ten Jobs of 1, 2 and 4 GPUs,
  urgent/approved/normal, arrive while the queue is full (the urgent one last): who gets the
  quota as it frees is decided by the priorities WDRF writes (class, then the team's fairness
  level, then age), and BestEffortFIFO skips the 4-GPU head that does not fit.
* `cohort-preemption`: three teams, a ClusterQueue each (2 GPUs nominal) in one cohort with
  `withinClusterQueue: LowerPriority` and `reclaimWithinCohort: Any`; team x borrows the whole
  cohort, y and z reclaim (victims: lowest priority, then most recently admitted), an urgent x
  Job preempts x's normal work, and the victims come back as quota frees, across queues.

How the replay works:
* Same inputs. The same `Settings` configure the simulated and the live controller (1 s loop,
  otherwise config.yaml's priority settings); the simulated epoch is the plane's wall-clock
  second `t0`, the simulated teams are the plane's namespaces; quotas, preemption settings and
  Jobs (GPUs, class annotation, arrival second) are the same.
* Same clock. Job `j` is created at `t0 + submit`; its pod completes through kwok's own
  pod-complete stage at the absolute time `t0 + end` the simulator computed (admission +
  duration there), so the plane's latencies (pod start, Job completion, Kueue's finish) do
  not add up along a chain of Jobs. A Job the plane admits instead of the simulator's frees
  its quota at the simulator's time for *that* Job: a different choice shows, never hides.
* Same controller cycles. The live controller runs its cycles (`run_cycle`, with the
  simulated time as `now`) at the simulated cycle times + CYCLE_OFFSET, and with one writer.
  Two races of the real system are pinned this way, both found by this replay: (1) Kueue
  requeues inadmissible Workloads 1 s after quota is released, and a priority written in that
  second moves a Workload ahead of the others (modelled: `KueueConfig.requeue_batch`), so no
  cycle runs within BLACKOUT s after a release, on either side; (2) the controller's default 8
  concurrent writers can land a raised pending priority before the guard of an admitted
  Workload, and Kueue then preempts within the class (recorded as `guard_races`, not
  modelled: a controller issue).
* Independent witness. The plane's sequence is read from one watch of the Workloads (the
  apiserver's order of writes): an admission is QuotaReserved turning True, a preemption is
  Evicted turning True with reason Preempted, the preemptor named by Kueue's message (its
  Workload UID). Nothing the controller reports is used.

Equivalence ("same order"): the simulator's events are grouped by instant (one scheduling pass:
e.g. the requeue after a Job finished, or a preemption with its preemptor's admission). The
plane's sequence must be those groups, in the same order, each group in any order inside
(Kueue sends the admissions of one pass asynchronously; their order in the apiserver is not
defined); nothing else may differ. First the scenarios are checked (`spacing_problems`):
episodes GAP apart and arrivals ARRIVAL_GAP away from them, so that the plane's latency
(about a second, measured and printed) cannot reorder them.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from controller.config import Settings
from controller.domain import APPROVED_ANNOTATION, URGENT_ANNOTATION, PriorityClass
from controller.live import runner
from evaluation.engine import SimConfig
from evaluation.kueue import (
    ANY,
    COHORT,
    LOWER_PRIORITY,
    PREEMPTED,
    KueueConfig,
    KueueSim,
)
from evaluation.trace import PCT, SimJob
from evaluation.wdrf import WdrfKueue
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.plane import Plane

pytestmark = [pytest.mark.plane, pytest.mark.e2e]

U, A, N = PriorityClass.URGENT, PriorityClass.APPROVED, PriorityClass.NORMAL
BLACKOUT = 2.0  # s after a release of quota without a controller cycle
GAP = 4.0  # s between two episodes (a release and its requeue, a preemption, ...)
ARRIVAL_GAP = 2.0  # s between an arrival and any episode it does not cause itself
CYCLE_OFFSET = 0.8  # s: the plane runs the cycle of simulated second k at t0 + k + this
GPU = "nvidia.com/gpu"
TAINT = "wdrf-test/sim-vs-plane"
KWOK = "stage.kwok.x-k8s.io"
_PREEMPTOR = re.compile(r"\(UID: ([^,)]+)")

Event = tuple[str, ...]  # ("admit", job) | ("preempt", victim job, preemptor job)


# -- scenarios ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class J:
    """One Job: its team (index), arrival and run time (s), whole GPUs and class."""

    name: str
    team: int
    submit: int
    duration: int
    gpus: int
    cls: PriorityClass = N


@dataclass(frozen=True)
class Scenario:
    name: str
    teams: int
    gpus: int  # one kwok node with this many GPUs; the ClusterQueue (or the cohort) quota
    kueue: KueueConfig
    jobs: tuple[J, ...]


KUEUE = KueueConfig(requeue_batch=1.0)  # Kueue v0.19's requeueBatchPeriod
# The live controller's settings, and the simulated controller's: config.yaml's defaults but a
# 1 s loop, quota capacity, boost mode, GPUs the only resource weighed.
SETTINGS = h.live_settings(AGING_COEFFICIENT="1", RESOURCE_WEIGHTS=f"{{{GPU}: 1}}")

SINGLE_CQ = Scenario("single-cq", teams=4, gpus=6, kueue=KUEUE, jobs=(
    J("a0-n4", 0, 0, 20, 4), J("a1-n2", 0, 2, 22, 2),
    J("b0-n2", 1, 4, 19, 2), J("c0-n1", 2, 6, 15, 1), J("a2-n1", 0, 8, 19, 1),
    J("d0-n4", 3, 10, 11, 4), J("b1-a1", 1, 12, 11, 1, A), J("c1-n2", 2, 14, 11, 2),
    J("a3-u2", 0, 16, 7, 2, U), J("d1-n1", 3, 18, 11, 1),
))

COHORT_PREEMPTION = Scenario("cohort-preemption", teams=3, gpus=6, kueue=replace(
    KUEUE, topology=COHORT, within_cluster_queue=LOWER_PRIORITY, reclaim_within_cohort=ANY,
), jobs=(
    J("x0-n1", 0, 0, 21, 1), J("x1-n1", 0, 2, 15, 1), J("x2-n2", 0, 4, 15, 2),
    J("x3-n2", 0, 6, 15, 2), J("y0-n1", 1, 8, 20, 1), J("z0-u2", 2, 12, 20, 2, U),
    J("x4-u2", 0, 16, 20, 2, U), J("y1-n1", 1, 20, 20, 1), J("z1-n1", 2, 24, 15, 1),
))


# -- the simulator side --------------------------------------------------------------------------

class _Recording(WdrfKueue):
    """WDRF in the Kueue model, recording every quota reservation and every preemption in the
    order the model makes them, and the controller cycles it ran. A cycle is skipped within
    BLACKOUT seconds after a release of quota (the plane needs that long to finish a Job and
    requeue its inadmissible Workloads; a cycle in between would race Kueue's requeue).

    Also recorded: cycles that raise a pending Workload and guard an admitted one that the
    raised Workload could preempt while the guard is not written yet (`guard_races`). The
    model applies a cycle's writes at once; the live controller's default 8 concurrent writers
    can land the raise before the guard, and Kueue then preempts within the class (seen on the
    real plane), so the replay runs the controller with one writer (plan order: guards first).
    """

    skip: frozenset[float] = frozenset()  # cycles another scenario on the plane rules out

    def reset(self, sim: Any) -> None:
        super().reset(sim)
        self.log: list[tuple[float, tuple[str, int, int]]] = []
        self.prio_at: dict[tuple[float, int], int] = {}  # (time, job) -> priority when admitted
        self.releases: list[float] = []
        self.cycles: list[float] = []
        self.guard_races: list[tuple[float, int, int]] = []  # (cycle, raised, guarded)

    def on_admit(self, job: SimJob, now: float) -> None:
        self.prio_at[(now, job.job_id)] = self.priority(job)
        super().on_admit(job, now)
        self.log.append((now, ("admit", job.job_id, -1)))

    def on_release(self, job: SimJob, now: float) -> None:
        super().on_release(job, now)
        self.releases.append(now)

    def on_evict(self, job: SimJob, now: float, reason: str) -> None:
        super().on_evict(job, now, reason)
        assert reason == PREEMPTED, reason  # no waitForPodsReady timeouts in these scenarios
        self.log.append((now, ("preempt", job.job_id, self.sim.evictions[-1].by)))

    def tick(self, now: float) -> bool:
        if now in self.skip or (self.releases and now - self.releases[-1] <= BLACKOUT):
            return False
        self.cycles.append(now)
        sim = self.sim
        before = {j: self.prio.get(j, 0) for j in self.wl}
        changed = super().tick(now)
        guarded = {j: p for j, p in before.items()
                   if j not in sim.pending and self.prio.get(j, 0) != p}
        if not (sim.k.preempts and guarded):
            return changed
        written = {j: self.prio.get(j, 0) for j in guarded}
        self.prio.update(guarded)  # the worst order: every raise lands before every guard
        try:
            for p in list(sim.pending):
                job = sim.jobs[p]
                cq = sim.cq_of(job)
                if self.prio.get(p, 0) <= before[p] or sim._fits(job, cq):
                    continue
                targets = (sim._fair_targets(job, cq) if sim.k.fair_sharing
                           and len(sim.cqs) > 1 else sim._classic_targets(job, cq))
                self.guard_races += [(now, p, g) for g, _ in targets or () if g in guarded]
        finally:
            self.prio.update(written)
        return changed


@dataclass
class SimReplay:
    """What the Kueue model did: its events grouped by instant, and more."""

    groups: list[tuple[float, frozenset[Event]]]
    ends: dict[str, float]  # job -> end of its last run (s after t0)
    nominal: dict[int, int]  # team index -> nominal GPUs of its ClusterQueue
    priority: dict[tuple[float, str], int]  # (time, job) -> its priority when admitted
    cycles: list[float]  # when the controller ran its cycles (s after t0)
    guard_races: list[str]  # cycles whose raise could preempt before their guard lands


def simulate(sc: Scenario, teams: Sequence[str], settings: Settings, epoch: datetime,
             skip: frozenset[float] = frozenset()) -> SimReplay:
    """The scenario in the Kueue model with WDRF (the controller's compute_plan, applied as the
    live controller applies it), every admitted Workload reported on its own."""
    jobs = [SimJob(i, float(j.submit), float(j.duration), teams[j.team], j.cls, 1, j.gpus, PCT)
            for i, j in enumerate(sc.jobs)]
    # The plane runs without the shipped class stand-ins (no admission policy installed), so
    # the model gives a new Workload no priority until the controller's first cycle, as there.
    policy = _Recording(settings, epoch, aggregate_admitted=False, stand_ins=False)
    policy.skip = skip
    cfg = SimConfig(nodes=1, node_gpus=sc.gpus, loop_interval=settings.loop_interval,
                    exact_ticks=True, check_invariants=True)
    sim = KueueSim(jobs, cfg, sc.kueue, policy)
    r = sim.run()
    assert all(a == 1 for a in r.admissions), "every Job finishes exactly once"
    name = [j.name for j in sc.jobs]
    groups: list[tuple[float, frozenset[Event]]] = []
    for t, (kind, jid, by) in policy.log:
        ev: Event = (kind, name[jid]) if kind == "admit" else (kind, name[jid], name[by])
        if groups and groups[-1][0] == t:
            groups[-1] = (t, groups[-1][1] | {ev})
        else:
            groups.append((t, frozenset({ev})))
    nominal = {i: sim.cqs[sim.cq_of_team[t]].nominal // PCT for i, t in enumerate(teams)}
    return SimReplay(groups, {name[i]: float(r.end[i]) for i in range(len(jobs))}, nominal,
                     {(t, name[j]): p for (t, j), p in policy.prio_at.items()},
                     list(policy.cycles),
                     [f"the cycle at {t:g} raises {name[p]}, which could preempt {name[g]} "
                      "before its guard lands" for t, p, g in policy.guard_races])


def spacing_problems(sc: Scenario, rep: SimReplay, loop: float) -> list[str]:
    """Why the plane's latencies could reorder the scenario's timeline (empty: they cannot).

    Episodes: every release of quota (a Job's end, a preemption) with Kueue's batched requeue
    of the inadmissible Workloads `requeue_batch` later, and every other group of events but a
    lone admission at the Job's own arrival. Episodes must start GAP apart; no two Jobs end
    together; an arrival must be ARRIVAL_GAP away from every episode it does not cause itself
    (its own admission or its preemptions within two controller cycles); arrivals two seconds
    apart (distinct creation seconds). And no Job may be admitted between a release and the
    requeue after it, other than at its own arrival or as a preemptor: that admission would be
    a Workload the controller rewrote in the meantime, and on the plane the controller's cycle
    and Kueue's requeue come in either order (the BLACKOUT should rule it out; checked).
    """
    batch = sc.kueue.requeue_batch
    submit = {j.name: float(j.submit) for j in sc.jobs}
    ends = list(rep.ends.values())
    problems = [f"two Jobs end at {t:g}" for t in sorted(set(ends)) if ends.count(t) > 1]
    releases = set(ends) | {t for t, evs in rep.groups if any(e[0] == "preempt" for e in evs)}
    episodes: dict[float, float] = {e: e + batch for e in releases}  # start -> stop
    caused: dict[float, set[str]] = {}
    for t, evs in rep.groups:
        preemptors = {e[2] for e in evs if e[0] == "preempt"}
        for e in evs:
            job = e[1] if e[0] == "admit" else e[2]
            if submit[job] <= t <= submit[job] + 2 * loop:
                caused.setdefault(t, set()).add(job)
        if any(r < t <= r + batch + 1e-9 for r in releases) or (
                len(evs) == 1 and all(submit[e[1]] == t for e in evs)):
            continue  # the requeue after a release, or a lone admission on arrival
        episodes.setdefault(t, t)
        problems += [f"{e[1]} admitted at {t:g} before Kueue requeued the inadmissible "
                     "Workloads: the controller's cycle and Kueue's requeue race"
                     for e in evs if e[0] == "admit" and e[1] not in preemptors
                     and submit[e[1]] != t]
    starts = sorted(episodes)
    problems += [f"episodes at {a:g} and {b:g} closer than {GAP:g} s"
                 for a, b in itertools.pairwise(starts) if b - a < GAP]
    for j in sc.jobs:
        for start, stop in episodes.items():
            near = start - ARRIVAL_GAP < j.submit < stop + ARRIVAL_GAP
            if near and j.name not in caused.get(start, set()):
                problems.append(f"{j.name} arrives at {j.submit} near the episode at {start:g}")
    arrivals = sorted(j.submit for j in sc.jobs)
    problems += [f"arrivals {a} and {b} closer than 2 s"
                 for a, b in itertools.pairwise(arrivals) if b - a < 2]
    return problems


def equivalence_problem(groups: Sequence[tuple[float, frozenset[Event]]],
                        plane: Sequence[Event]) -> str | None:
    """None when `plane` is the simulator's groups in order, each group in any order inside;
    else where the two first differ."""
    pos = 0
    for t, evs in groups:
        got = list(plane[pos:pos + len(evs)])
        if set(got) != evs or len(got) != len(evs):
            return (f"at t={t:g} the simulator has {sorted(evs)}; the plane has {got} "
                    f"(plane events {pos}..{pos + len(evs) - 1})")
        pos += len(evs)
    if pos != len(plane):
        return f"the plane has more events after the simulator's last: {list(plane[pos:])}"
    return None


def test_equivalence_is_strict_between_instants_and_free_within_one() -> None:
    groups = [(0.0, frozenset({("admit", "a")})),
              (4.0, frozenset({("admit", "b"), ("admit", "c")})),
              (9.0, frozenset({("preempt", "b", "d"), ("admit", "d")}))]
    ok = [("admit", "a"), ("admit", "c"), ("admit", "b"), ("preempt", "b", "d"), ("admit", "d")]
    assert equivalence_problem(groups, ok) is None
    assert equivalence_problem(groups, [ok[1], ok[0], *ok[2:]])  # across instants
    assert equivalence_problem(groups, ok[:-1])  # an admission missing
    assert equivalence_problem(groups, [*ok, ("admit", "b")])  # one too many
    assert equivalence_problem(groups, [*ok[:3], ("preempt", "c", "d"), ok[4]])  # other victim


def test_the_scenario_check_flags_what_latency_could_reorder() -> None:
    names = [f"team-{i}" for i in range(SINGLE_CQ.teams)]
    epoch = datetime.now(UTC)
    assert not spacing_problems(SINGLE_CQ, simulate(SINGLE_CQ, names, SETTINGS, epoch), 1.0)
    jobs = list(SINGLE_CQ.jobs)
    jobs[1] = replace(jobs[1], duration=18)  # a1 ends with a0, at 20
    sc = replace(SINGLE_CQ, jobs=tuple(jobs))
    problems = spacing_problems(sc, simulate(sc, names, SETTINGS, epoch), 1.0)
    assert "two Jobs end at 20" in problems
    jobs[1] = replace(jobs[1], duration=20)  # a1 ends at 22, 2 s after a0
    sc = replace(SINGLE_CQ, jobs=tuple(jobs))
    problems = spacing_problems(sc, simulate(sc, names, SETTINGS, epoch), 1.0)
    assert any("closer than" in p for p in problems), problems


# -- the plane side ------------------------------------------------------------------------------

def _conditions(wl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}


@dataclass
class Seen:
    """One event of the plane, as the watch saw it."""

    namespace: str
    event: Event
    at: float  # wall clock
    priority: int  # the Workload's effective priority (spec.priority + Kueue's boost) then


class WorkloadWatch:
    """One watch of all Workloads: the admissions and preemptions in `namespaces`, in the
    apiserver's order, and when each Job's Workload finished."""

    def __init__(self, kubeconfig: Path, namespaces: Sequence[str]) -> None:
        self.namespaces = set(namespaces)
        self.api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig))
        self.seen: list[Seen] = []
        self.history: dict[str, list[tuple[float, int]]] = {}  # ns/job -> (at, priority)
        self.finished: dict[str, float] = {}  # ns/job -> wall clock when seen Finished
        self._qr: dict[str, bool] = {}  # uid -> quota reserved
        self._evicted: dict[str, str] = {}  # uid -> lastTransitionTime of Evicted=True
        self._job: dict[str, str] = {}  # Workload uid -> Job name
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        listing = kube.request(self.api, "GET", kube.kueue_path("workloads"))
        self._rv: str = listing["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, name="workload-watch", daemon=True)

    def __enter__(self) -> WorkloadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def finished_jobs(self) -> set[str]:
        with self._lock:
            return set(self.finished)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                w = k8s_watch.Watch()  # type: ignore[no-untyped-call]
                for ev in w.stream(  # type: ignore[no-untyped-call]
                        k8s.CustomObjectsApi(self.api).list_cluster_custom_object,
                        kube.KUEUE_GROUP, kube.KUEUE_VERSION, "workloads",
                        resource_version=self._rv, timeout_seconds=2):
                    obj = ev["object"]
                    self._rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._observe(obj)
                    if self._stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]
                        break
        except BaseException as e:  # reported by the test
            self.error = e

    def _observe(self, wl: dict[str, Any]) -> None:
        md = wl["metadata"]
        ns = md.get("namespace")
        if ns not in self.namespaces:
            return
        uid = md["uid"]
        owners = md.get("ownerReferences") or []
        job = next((o["name"] for o in owners if o.get("kind") == "Job"), md["name"])
        conds = _conditions(wl)
        qr = conds.get("QuotaReserved", {}).get("status") == "True"
        prio = int(wl["spec"].get("priority") or 0) + int(
            (md.get("annotations") or {}).get(kube.PRIORITY_BOOST) or 0)
        ev = conds.get("Evicted", {})
        preempted = ev.get("status") == "True" and ev.get("reason") == "Preempted"
        now = time.time()
        with self._lock:
            self._job[uid] = job
            if preempted and self._evicted.get(uid) != ev.get("lastTransitionTime"):
                self._evicted[uid] = str(ev.get("lastTransitionTime"))
                # Kueue names the preemptor: "Preempted to accommodate a workload (UID: ...".
                msg = str(conds.get("Preempted", {}).get("message") or ev.get("message") or "")
                m = _PREEMPTOR.search(msg)
                by = self._job.get(m.group(1), m.group(1)) if m else f"? ({msg})"
                self.seen.append(Seen(ns, ("preempt", job, by), now, prio))
            if qr and not self._qr.get(uid, False):
                self.seen.append(Seen(ns, ("admit", job), now, prio))
            self._qr[uid] = qr
            if conds.get("Finished", {}).get("status") == "True":
                self.finished.setdefault(f"{ns}/{job}", now)
            hist = self.history.setdefault(f"{ns}/{job}", [])
            if not hist or hist[-1][1] != prio:
                hist.append((now, prio))


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def _sleep_until(ts: float) -> None:
    while (left := ts - time.time()) > 0:
        time.sleep(min(left, 0.2))


@contextlib.contextmanager
def _gpu_node(api: k8s.ApiClient, gpus: int) -> Iterator[str]:
    """A tainted kwok node with `gpus` whole GPUs and a ResourceFlavor (same name) whose pods
    land there and only there; both deleted afterwards."""
    name = kube.unique_name("svp-gpu")
    kube.create_gpu_node(api, name, gpus=gpus, hami=False, labels={"wdrf-test/node": name})
    try:
        kube.request(api, "PATCH", f"/api/v1/nodes/{name}",
                     {"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}})
        kube.wait_node_ready(api, name)
        kube.request(api, "POST", kube.kueue_path("resourceflavors"), {
            "apiVersion": f"{kube.KUEUE_GROUP}/{kube.KUEUE_VERSION}", "kind": "ResourceFlavor",
            "metadata": {"name": name},
            "spec": {"nodeLabels": {"wdrf-test/node": name},
                     "tolerations": [{"key": TAINT, "operator": "Exists",
                                      "effect": "NoSchedule"}]}})
        yield name
    finally:
        with contextlib.suppress(ApiException):
            kube.request(api, "DELETE", kube.kueue_path("resourceflavors", name))
        with contextlib.suppress(ApiException):
            kube.request(api, "DELETE", f"/api/v1/nodes/{name}")


def _queues(api: k8s.ApiClient, sc: Scenario, teams: Sequence[str], flavor: str,
            nominal: dict[int, int]) -> list[str]:
    """The scenario's ClusterQueue (or one per team in a cohort) and a LocalQueue per team."""
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                      "operator": "In", "values": list(teams)}]}
    k = sc.kueue
    preemption = {"withinClusterQueue": k.within_cluster_queue,
                  "reclaimWithinCohort": k.reclaim_within_cohort,
                  "borrowWithinCohort": {"policy": k.borrow_within_cohort}}
    cohort = kube.unique_name("svp") if k.topology == COHORT else None
    cqs: list[str] = []
    for i, ns in enumerate(teams):
        if cohort is not None or not cqs:
            cqs.append(kube.unique_name("svp"))
            kube.create_cluster_queue(
                api, cqs[-1], {GPU: nominal[i] if cohort else sc.gpus}, flavor,
                namespace_selector=selector, preemption=preemption, cohort=cohort,
                queueing_strategy=k.queueing_strategy)
        kube.create_local_queue(api, ns, "lq", cqs[-1])
    return cqs


def _job(ns: str, j: J, end_ts: float) -> dict[str, Any]:
    """The Job: its pod starts at once on kwok and completes at `end_ts` (kwok reads a
    timestamp in the delay annotation as an absolute time); a preempted pod goes at once."""
    ann = {URGENT_ANNOTATION: "true"} if j.cls is U else \
        {APPROVED_ANNOTATION: "true"} if j.cls is A else {}
    end = _rfc3339(end_ts)
    pod_ann = {f"pod-create.{KWOK}/delay": "0s", f"pod-create.{KWOK}/jitter-delay": "0s",
               f"pod-delete.{KWOK}/delay": "0s",
               f"pod-complete.{KWOK}/delay": end, f"pod-complete.{KWOK}/jitter-delay": end}
    return kube.job_manifest(ns, j.name, "lq", requests={GPU: str(j.gpus)}, annotations=ann,
                             pod_annotations=pod_ann)


@dataclass
class Replay:
    """One scenario on both sides."""

    sc: Scenario
    teams: list[str]
    sim: SimReplay
    plane: list[Seen]  # this scenario's events, in the apiserver's order
    t0: float
    finished: dict[str, float]  # job -> when the plane saw it finished (s after t0)
    history: dict[str, list[tuple[float, int]]]  # job -> (s after t0, effective priority)

    @property
    def plane_events(self) -> list[Event]:
        return [s.event for s in self.plane]

    def report(self) -> str:
        lines = [f"{self.sc.name}: simulator (t: events@priority) | plane (seen at t: event)"]
        for t, evs in self.sim.groups:
            lines.append(f"  sim {t:6.1f}: " + ", ".join(
                f"{e}@{self.sim.priority[(t, e[1])]}" if e[0] == "admit" else str(e)
                for e in sorted(evs)))
        for s in self.plane:
            lines.append(f"  plane {s.at - self.t0:6.1f}: {s.event}"
                         + (f"@{s.priority}" if s.event[0] == "admit" else ""))
        lines.append("  plane priorities (s after t0: effective priority):")
        for job, hist in sorted(self.history.items()):
            lines.append(f"    {job}: " + " ".join(f"{s:.1f}:{p}" for s, p in hist))
        return "\n".join(lines)

    def lags(self) -> list[float]:
        """How long after the simulator's instant the plane showed each event (s)."""
        out, pos = [], 0
        for t, evs in self.sim.groups:
            out += [s.at - self.t0 - t for s in self.plane[pos:pos + len(evs)]]
            pos += len(evs)
        return out


def simulate_together(scenarios: Sequence[Scenario], teams: Sequence[Sequence[str]],
                      settings: Settings, epoch: datetime) -> list[SimReplay]:
    """The scenarios share one live controller on the plane, so one cycle schedule: a cycle
    runs only where every scenario allows it. Re-simulated until the schedule is stable."""
    skip: frozenset[float] = frozenset()
    for _ in range(8):
        reps = [simulate(sc, t, settings, epoch, skip) for sc, t in zip(scenarios, teams,
                                                                         strict=True)]
        cycles = [frozenset(r.cycles) for r in reps]
        every = frozenset().union(*cycles)
        common = frozenset.intersection(*cycles)
        if common == every:
            return reps
        skip = skip | (every - common)
    raise AssertionError("the scenarios' controller cycle schedules do not settle")


def replay_on_plane(api: k8s.ApiClient, kubeconfig: Path,
                    scenarios: Sequence[Scenario]) -> list[Replay]:
    """Both scenarios at once on the plane, one live controller (one writer) running its
    cycles at the simulated cycle times; what the watch saw, per scenario."""
    settings = SETTINGS
    teams = [[kube.create_namespace(api) for _ in range(sc.teams)] for sc in scenarios]
    every_ns = [ns for t in teams for ns in t]
    cqs: list[str] = []
    with contextlib.ExitStack() as stack:
        flavors = [stack.enter_context(_gpu_node(api, sc.gpus)) for sc in scenarios]
        stack.callback(h.cleanup, api, every_ns, cqs)
        probe = simulate_together(scenarios, teams, settings, datetime.now(UTC))
        for sc, t, f, rep in zip(scenarios, teams, flavors, probe, strict=True):
            cqs += _queues(api, sc, t, f, rep.nominal)
        c = h.new_controller(kubeconfig, settings)
        with h.started(c), WorkloadWatch(kubeconfig, every_ns) as watch:
            h.converge(c)
            t0 = float(math.ceil(time.time()) + 3)
            epoch = datetime.fromtimestamp(t0, UTC)
            reps = simulate_together(scenarios, teams, settings, epoch)
            assert [r.nominal for r in reps] == [r.nominal for r in probe]
            for sc, rep in zip(scenarios, reps, strict=True):  # with the real team names
                problems = spacing_problems(sc, rep, settings.loop_interval)
                assert not problems, f"{sc.name}: {problems}"
            cycles = _run_cycles(c, epoch, reps[0].cycles)
            arrivals = sorted((j.submit, i, j) for i, sc in enumerate(scenarios)
                              for j in sc.jobs)
            late = 0.0
            for submit, i, j in arrivals:
                _sleep_until(t0 + submit + 0.05)
                late = max(late, time.time() - t0 - submit)
                ns = teams[i][j.team]
                kube.request(api, "POST", f"/apis/batch/v1/namespaces/{ns}/jobs",
                             _job(ns, j, t0 + reps[i].ends[j.name]))
            wanted = {f"{teams[i][j.team]}/{j.name}" for _, i, j in arrivals}
            last = t0 + max(max(r.ends.values()) for r in reps)
            kube.wait_for(lambda: watch.finished_jobs() >= wanted or watch.error,
                          last - time.time() + 60, "every Job finished",
                          lambda: f"finished {sorted(watch.finished_jobs())}")
            cycles.join(30)
            assert watch.error is None, watch.error
            assert cycles.error is None, cycles.error
        print(f"\nJobs created at most {late:.2f} s late; controller cycles at most "
              f"{cycles.late:.2f} s late ({len(reps[0].cycles)} cycles)")
        out = []
        for sc, t, rep in zip(scenarios, teams, reps, strict=True):
            mine = set(t)
            out.append(Replay(
                sc, t, rep, [s for s in watch.seen if s.namespace in mine], t0,
                {k.split("/", 1)[1]: v - t0 for k, v in watch.finished.items()
                 if k.split("/", 1)[0] in mine},
                {k.split("/", 1)[1]: [(s - t0, p) for s, p in v]
                 for k, v in watch.history.items() if k.split("/", 1)[0] in mine}))
        return out


class _Cycles(threading.Thread):
    """Runs the live controller's cycles at the simulated cycle times (plus CYCLE_OFFSET)."""

    def __init__(self, c: Any, epoch: datetime, cycles: Sequence[float]) -> None:
        super().__init__(name="controller-cycles", daemon=True)
        self.c, self.epoch, self.cycles = c, epoch, list(cycles)
        self.late = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        t0 = self.epoch.timestamp()
        try:
            for k in self.cycles:
                _sleep_until(t0 + k + CYCLE_OFFSET)
                self.late = max(self.late, time.time() - (t0 + k + CYCLE_OFFSET))
                self.c.run_cycle(self.epoch + timedelta(seconds=k))
        except BaseException as e:  # reported by the test
            self.error = e


def _run_cycles(c: Any, epoch: datetime, cycles: Sequence[float]) -> _Cycles:
    runner = _Cycles(c, epoch, cycles)
    runner.start()
    return runner


def test_kueue_on_the_plane_admits_and_preempts_in_the_simulators_order(
    e2e_plane: Plane, api: k8s.ApiClient, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One writer: the plan's writes land in plan order (guards before raises), as the model
    # applies a cycle at once. With the default concurrent writers a raise can land first.
    monkeypatch.setattr(runner, "APPLY_WORKERS", 1)
    scenarios = [SINGLE_CQ, COHORT_PREEMPTION]
    # First the scenarios themselves: robust to the plane's latencies, or the comparison
    # below would mean nothing.
    names = [[f"team-{i}" for i in range(sc.teams)] for sc in scenarios]
    for sc, rep in zip(scenarios, simulate_together(scenarios, names, SETTINGS,
                                                    datetime.now(UTC)), strict=True):
        problems = spacing_problems(sc, rep, SETTINGS.loop_interval)
        assert not problems, f"{sc.name}: {problems}"
        if rep.guard_races:
            print(f"{sc.name}, a race with concurrent writers: {rep.guard_races}")
    replays = replay_on_plane(api, kubeconfig, scenarios)
    failures = []
    for r in replays:
        report = r.report()
        print(report)
        problem = equivalence_problem(r.sim.groups, r.plane_events)
        if problem is not None:
            failures.append(f"{r.sc.name}: {problem}\n{report}")
        lags = r.lags()
        if lags:
            print(f"{r.sc.name}: {len(r.plane)} events in {len(r.sim.groups)} instants; the "
                  f"plane showed them {min(lags):.2f}..{max(lags):.2f} s after the simulator")
    assert not failures, "\n\n".join(failures)
