"""The live controller: caches -> snapshot -> plan -> minimal writes, every LOOP_INTERVAL.

Layout of one process:

* informer threads keep Workloads, ClusterQueues, LocalQueues, Kueue-managed Jobs and pods
  (and Nodes when capacity comes from inventories) in memory by LIST + WATCH;
* a leader-election thread holds the Lease (not in dry run);
* an HTTP thread serves /metrics, /healthz, /readyz;
* the main thread runs cycles: every LOOP_INTERVAL, and within ~2 s of a watch event that
  `needs_prompt_cycle` (a new urgent/approved workload, a class change).

Writes go through one transport stack:  kubernetes client -> CountingTransport ->
[ReadOnlyTransport in dry run] -> GuardedTransport(leader only) -> applier / Events / history.
A dry run therefore runs the very same code path and every write is refused before it leaves
the process; the refused writes are what the dry run reports.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType

from controller.config import Settings
from controller.domain import (
    GPUCORES,
    GPUMEM_PERCENTAGE,
    ClusterQueue,
    InputProblem,
    KueueApiVersion,
    ObjectRef,
    Workload,
)
from controller.live.api import (
    CLUSTER_QUEUES,
    JOBS,
    LOCAL_QUEUES,
    NODES,
    PODS,
    WORKLOADS,
    CountingTransport,
    GuardedTransport,
    ReadOnlyTransport,
    Resource,
    Transport,
)
from controller.live.apply import (
    APPLIED,
    CONFLICT,
    DEFERRED,
    FAILED,
    REFUSED,
    UNSUPPORTED,
    Applier,
    ApplyReport,
    Outcome,
)
from controller.live.backoff import Backoff
from controller.live.cache import Informer, WatchSpec
from controller.live.diff import (
    GPU_FRACTION,
    PRIORITY,
    Change,
    Diff,
    Notice,
    diff_job_hami,
    diff_pods_hami,
    diff_priority,
    fraction_refused_notice,
)
from controller.live.discovery import (
    ModeChoice,
    QuotaCheck,
    choose_kueue_version,
    kueue_resource,
    read_priority_boost_gate,
    read_quota_check,
    resolve_mode,
    served_versions,
)
from controller.live.events import EventRecorder
from controller.live.history import HistoryStore
from controller.live.leader import LeaderElector, default_identity
from controller.live.metrics import Health, HttpServer, Metrics
from controller.live.snapshot import Built, Parsers, SnapshotBuilder, needs_prompt_cycle
from controller.plan import Plan, WorkloadDecision

log = logging.getLogger(__name__)

JOB_SELECTOR = "kueue.x-k8s.io/queue-name"  # Jobs Kueue manages carry their queue label
POD_SELECTOR = "kueue.x-k8s.io/managed=true"  # pods of Kueue's pod integration
MIN_TRIGGER_GAP = 0.5  # seconds between prompt cycles, so a burst of arrivals is one cycle
SYNC_TIMEOUT = 120.0
APPLY_WORKERS = 8  # concurrent writes (a first cycle on a big cluster writes thousands)


def default_parsers() -> Parsers:
    from controller.parse import (
        parse_cluster_queue,
        parse_job,
        parse_local_queue,
        parse_node,
        parse_workload,
    )

    return Parsers(parse_workload, parse_cluster_queue, parse_local_queue, parse_job, parse_node)


def queue_warnings(queues: Iterable[ClusterQueue]) -> list[str]:
    """Per ClusterQueue: where raised priorities can evict running work, or AFS reorders."""
    out: list[str] = []
    for q in sorted(queues, key=lambda c: c.name):
        p = q.preemption
        if p.can_evict:
            out.append(
                f"ClusterQueue {q.name}: preemption withinClusterQueue={p.within_cluster_queue}"
                f", reclaimWithinCohort={p.reclaim_within_cohort}: raising a pending workload's"
                " priority can preempt running workloads"
            )
        if q.admission_fair_sharing:
            out.append(
                f"ClusterQueue {q.name}: Admission Fair Sharing orders by LocalQueue usage "
                "before priority; the controller's order will not hold there"
            )
    return out


def problem_reason(problem: InputProblem) -> str:
    return "InvalidAnnotation" if "annotations" in problem.field else "InvalidInput"


@dataclass
class CycleReport:
    plan: Plan
    changes: list[Change] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    applied: ApplyReport | None = None
    leader: bool = False
    seconds: float = 0.0

    def refused(self) -> list[Change]:
        return [o.change for o in self.applied.outcomes if o.result == REFUSED] if (
            self.applied) else []


class LiveController:
    """Everything but process concerns (signals, exit codes): usable in-process by tests."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport,
        *,
        dry_run: bool = False,
        identity: str | None = None,
        metrics: Metrics | None = None,
        parsers: Parsers | None = None,
        watch_timeout: float = 300.0,
    ) -> None:
        self.settings = settings
        self.dry_run = dry_run
        self.identity = identity or default_identity()
        self.metrics = metrics or Metrics()
        self._transport = transport
        self.counting = CountingTransport(
            transport, lambda verb, res: self.metrics.api_requests.labels(verb, res).inc()
        )
        base: Transport = ReadOnlyTransport(self.counting) if dry_run else self.counting
        self.reader = base
        self.elector: LeaderElector | None = None
        if settings.leader_election and not dry_run:
            self.elector = LeaderElector(
                base, settings.controller_namespace, settings.lease_name, self.identity,
                self.metrics, settings.lease_duration, settings.renew_deadline,
                settings.retry_period, on_change=self._leadership_changed,
            )
            self.writer: Transport = GuardedTransport(base, self.elector.is_leader,
                                                      "not the leader")
        else:
            self.writer = base
        self.events = EventRecorder(self.writer, self.metrics, settings.event_rate_limit,
                                    instance=self.identity)
        self.applier = Applier(
            self.writer, self.metrics, max_attempts=settings.api_retries,
            retry_budget=min(10.0, max(settings.loop_interval / 2, 1.0)), workers=APPLY_WORKERS,
        )
        self.history_store = HistoryStore(
            self.writer, settings.controller_namespace, settings.history_config_map,
            save_every=max(60.0, settings.loop_interval),
        )
        self.history = None if settings.usage_half_life <= 0 else self.history_store.load()
        self.builder = SnapshotBuilder(parsers or default_parsers())
        self.health = Health(stale_after=max(60.0, 3 * settings.loop_interval))
        self.trigger = threading.Event()
        self.stop_event = threading.Event()
        self._watch_timeout = watch_timeout
        self._threads: list[threading.Thread] = []
        self._warned: set[str] = set()
        self._reload_history = False
        self.mode: ModeChoice | None = None
        self.quota_check = QuotaCheck()
        self.kueue_version: KueueApiVersion | None = None
        self.informers: dict[str, Informer] = {}
        self.http: HttpServer | None = None
        self.cycles = 0

    # -- start-up -------------------------------------------------------------------------

    def discover(self) -> None:
        """Kueue API version and priority mode; retries until the apiserver answers."""
        backoff = Backoff(initial=1.0, cap=30.0)
        while not self.stop_event.is_set():
            try:
                self.kueue_version = choose_kueue_version(
                    served_versions(self.reader, "kueue.x-k8s.io")
                )
                gate, where = read_priority_boost_gate(self.reader, self.settings.kueue_namespace)
                self.mode = resolve_mode(self.settings.priority_mode, gate, where)
                self.quota_check = read_quota_check(self.reader, self.settings.kueue_namespace)
                break
            except Exception as e:
                delay = backoff.next()
                log.warning("start-up discovery failed (%s); retrying in %.1fs", e, delay)
                self.health.set_ready(False, f"discovery: {e}")
                self.stop_event.wait(delay)
        if self.mode is not None and self.kueue_version is not None:
            log.info(
                "Kueue API %s; priority mode %s (%s)%s",
                self.kueue_version.value, self.mode.mode.value, self.mode.reason,
                "; DRY RUN: nothing will be written" if self.dry_run else "",
            )

    def _resource(self, base: Resource) -> Resource:
        assert self.kueue_version is not None
        return kueue_resource(base, self.kueue_version)

    def build_informers(self) -> None:
        specs = {
            "workloads": WatchSpec(self._resource(WORKLOADS)),
            "clusterqueues": WatchSpec(self._resource(CLUSTER_QUEUES)),
            "localqueues": WatchSpec(self._resource(LOCAL_QUEUES)),
            "jobs": WatchSpec(JOBS, label_selector=JOB_SELECTOR),
            "pods": WatchSpec(PODS, label_selector=POD_SELECTOR),
        }
        if self.settings.capacity_source != "quota":
            specs["nodes"] = WatchSpec(NODES)
        self.informers = {
            name: Informer(self.reader, spec, self.metrics, on_event=self._on_event,
                           watch_timeout=self._watch_timeout)
            for name, spec in specs.items()
        }

    def _on_event(self, kind: str, old: object, new: object) -> None:
        jobs = self.informers.get("jobs")
        lookup = jobs.get if jobs is not None else (lambda _key: None)
        if needs_prompt_cycle(kind, old, new, lookup):  # type: ignore[arg-type]
            self.trigger.set()

    def start(self, serve_http: bool = True) -> None:
        """Discover, start watches, leader election and the HTTP server (not blocking)."""
        self.discover()
        if self.stop_event.is_set():
            return
        self.build_informers()
        for name, inf in self.informers.items():
            self._spawn(f"watch-{name}", self._runner_of(inf))
        if self.elector is not None:
            elector = self.elector
            self._spawn("leader-election", lambda: elector.run(self.stop_event))
        if serve_http and self.settings.metrics_port:
            self.http = HttpServer(self.metrics, self.health, self.settings.metrics_port)
            self.http.start()
            log.info("serving /metrics, /healthz, /readyz on :%d", self.http.port)

    def _runner_of(self, informer: Informer) -> Callable[[], None]:
        return lambda: informer.run(self.stop_event)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def wait_synced(self, timeout: float = SYNC_TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        for inf in self.informers.values():
            if not inf.wait_synced(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def sync_once(self) -> None:
        """One LIST per resource, no watches (for --once and live_plan)."""
        for inf in self.informers.values():
            inf.relist()

    def _leadership_changed(self, leading: bool) -> None:
        if leading:
            self._reload_history = True
            self.trigger.set()

    # -- one cycle ------------------------------------------------------------------------

    def may_write(self) -> bool:
        return self.dry_run or self.elector is None or self.elector.is_leader()

    def snapshot(self) -> Built:
        inf = self.informers
        jobs = {f"{o['metadata'].get('namespace')}/{o['metadata'].get('name')}": o
                for o in inf["jobs"].items()}
        nodes = inf["nodes"].items() if "nodes" in inf else []
        return self.builder.build(
            inf["workloads"].items(), inf["clusterqueues"].items(), inf["localqueues"].items(),
            jobs, nodes,
        )

    def plan(self, now: datetime) -> tuple[Plan, Built]:
        from controller.policy import compute_plan

        built = self.snapshot()
        return compute_plan(built.snapshot, self.settings, now, self.history), built

    def run_cycle(self, now: datetime | None = None) -> CycleReport:
        started = time.monotonic()
        now = now or datetime.now(UTC)
        if self._reload_history and self.settings.usage_half_life > 0:
            self._reload_history = False
            self.history = self.history_store.load() or self.history
        plan, built = self.plan(now)
        if plan.history is not None:
            self.history = plan.history
        self._observe(plan, built)
        self._warn_queues(built.snapshot.cluster_queues)
        report = CycleReport(plan, leader=self.may_write())
        if report.leader:
            diff = self.diff(plan, built)
            report.changes, report.notices = list(diff.changes), list(diff.notices)
            # HAMi (Job template) writes first: a template change can make Kueue rebuild a
            # Workload's spec; the priority written after it then sticks.
            hami = [c for c in diff.changes if c.what != PRIORITY]
            prio = [c for c in diff.changes if c.what == PRIORITY]

            def after(outcome: Outcome) -> None:
                self._outcome_events(outcome, built)

            report.applied = ApplyReport(
                self.applier.apply(hami, after).outcomes + self.applier.apply(prio, after).outcomes
            )
            self._emit_events(plan, diff)
            if self.history is not None and not self.dry_run:
                self.history_store.save(self.history)
        report.seconds = time.monotonic() - started
        self.metrics.cycle_duration.observe(report.seconds)
        self.metrics.cycles.labels("leader" if report.leader else "follower").inc()
        self.metrics.last_cycle.set(time.time())
        self.health.beat()
        self.cycles += 1
        self._log_cycle(report)
        return report

    def diff(self, plan: Plan, built: Built) -> Diff:
        assert self.mode is not None
        mode = self.mode.mode
        wl_resource = self._resource(WORKLOADS)
        jobs, workloads = self.informers["jobs"], self.informers["workloads"]
        pods_by_uid = {str(p["metadata"].get("uid")): p for p in self.informers["pods"].items()}
        covered = {cq.name: {q.resource for q in cq.quotas}
                   for cq in built.snapshot.cluster_queues}
        hami: list[Change] = []
        priority: list[Change] = []
        notices: list[Notice] = []
        for d in plan.decisions:
            if d.leave_unchanged:
                continue
            raw = workloads.get(d.key)
            if raw is None:
                continue
            change = diff_priority(d, raw, wl_resource, mode)
            if change is not None:
                priority.append(change)
            wl = built.workloads.get(d.key)
            if d.hami is None or wl is None:
                continue
            if wl.owner is not None and wl.owner.kind == "Job":
                job = jobs.get(f"{wl.namespace}/{wl.owner.name}")
                if job is None:
                    continue
                part = diff_job_hami(d, job, JOBS, self.applier.resources_mutable,
                                     self._fraction_blocked(d, covered))
            else:
                owned = [pods_by_uid[str(o.get("uid"))]
                         for o in raw["metadata"].get("ownerReferences") or []
                         if str(o.get("uid")) in pods_by_uid]
                part = diff_pods_hami(d, owned, PODS)
            hami.extend(part.changes)
            notices.extend(part.notices)
        return Diff(tuple(hami + priority), tuple(notices))

    def _fraction_blocked(self, d: WorkloadDecision, covered: dict[str, set[str]]) -> str:
        """Why writing the GPU fraction would hurt: Kueue would block the Workload because
        its ClusterQueue does not cover the resource (BlockUndeclared, Kueue's default)."""
        if d.hami is None:
            return ""
        wanted = [r for r, v in ((GPUCORES, d.hami.gpucores),
                                 (GPUMEM_PERCENTAGE, d.hami.gpumem_percentage)) if v is not None]
        have = covered.get(d.cluster_queue or "", set())
        missing = [r for r in wanted if not self.quota_check.accepts(r, have)]
        if not missing:
            return ""
        return (f"ClusterQueue {d.cluster_queue} does not cover {', '.join(missing)}; with "
                "Kueue's quotaCheckStrategy BlockUndeclared the Workload could never be "
                "admitted. Cover it in the ClusterQueue, or configure Kueue's resource "
                "transformations or IgnoreUndeclared.")

    # -- observability --------------------------------------------------------------------

    def _observe(self, plan: Plan, built: Built) -> None:
        by_class: dict[str, float] = {c: 0 for c in ("urgent", "approved", "normal")}
        oldest: dict[str, float] = {}
        for d in plan.decisions:
            cls = d.breakdown.priority_class.value if d.breakdown else "unknown"
            by_class[cls] = by_class.get(cls, 0) + 1
            wl = built.workloads.get(d.key)
            if wl is not None:
                wait = max((plan.now - wl.created).total_seconds(), 0.0)
                cq = d.cluster_queue or "-"
                oldest[cq] = max(oldest.get(cq, 0.0), wait)
        m = self.metrics
        m.set_labelled(m.pending, by_class)
        m.set_labelled(m.dominant_share, {t: s.dominant_share for t, s in plan.teams.items()})
        m.set_labelled(m.oldest_wait, oldest)
        problems = sum(len(d.problems) for d in plan.decisions) + len(plan.problems)
        m.input_problems.set(problems)
        synced = all(i.synced for i in self.informers.values())
        self.health.set_ready(synced, "" if synced else "caches not synced")

    def _warn_queues(self, queues: Iterable[ClusterQueue]) -> None:
        for warning in queue_warnings(queues):
            if warning not in self._warned:
                self._warned.add(warning)
                log.warning("%s", warning)

    def _log_cycle(self, report: CycleReport) -> None:
        counts = report.applied.counts() if report.applied else {}
        level = logging.INFO if counts else logging.DEBUG
        log.log(level, "cycle %d: %d pending, %d changes %s, %.3fs%s",
                 self.cycles, len(report.plan.decisions), len(report.changes), counts,
                 report.seconds, "" if report.leader else " (not leader: no writes)",
                 extra={"pending": len(report.plan.decisions), "results": counts,
                        "seconds": round(report.seconds, 4)})

    # -- Events ---------------------------------------------------------------------------

    def _outcome_events(self, outcome: Outcome, built: Built) -> None:
        """Events for one write, right after it (in the applier's worker thread)."""
        from controller.render import reason as why

        c, d = outcome.change, outcome.change.decision
        targets = _workload_and_owner(built.workloads.get(d.key))
        if outcome.result == APPLIED and c.what == PRIORITY:
            text = f"{c.summary}: {why(d)} (rank {d.rank} in ClusterQueue {d.cluster_queue})"
            for ref in targets:
                self.events.emit(ref, "PriorityChanged", text, dedupe="priority")
        elif outcome.result == APPLIED:
            text = f"HAMi settings applied to {c.ref}: {c.summary}"
            for ref in {c.ref, *targets}:
                self.events.emit(ref, "HamiSettingsApplied", text, dedupe=c.what)
        elif outcome.result == UNSUPPORTED and c.what == GPU_FRACTION and d.hami is not None:
            note = fraction_refused_notice(c.ref, d.hami)
            for ref in {c.ref, *targets}:
                self.events.emit(ref, note.reason, note.message, "Warning")
        elif outcome.result in (FAILED, CONFLICT) or (
            outcome.result == DEFERRED and outcome.error is not None
            and outcome.error.status != 0
        ):
            self.events.emit(c.ref, "PatchFailed",
                             f"could not apply {c.summary}: {outcome.error}", "Warning",
                             dedupe=c.what)

    def _emit_events(self, plan: Plan, diff: Diff) -> None:
        """Events that do not come from a write: notices and invalid input."""
        for notice in diff.notices:
            self.events.emit(notice.ref, notice.reason, notice.message, notice.type)
        for problem in _problems(plan):
            if problem.object is None or not problem.object.name:
                continue
            self.events.emit(problem.object, problem_reason(problem), str(problem), "Warning")

    # -- the loop -------------------------------------------------------------------------

    def loop(self) -> None:
        """Cycles until `stop_event`: every LOOP_INTERVAL, or promptly after a trigger."""
        last_end = 0.0
        while not self.stop_event.is_set():
            self.trigger.clear()
            started = time.monotonic()
            try:
                self.run_cycle()
            except Exception:
                log.exception("cycle failed; next cycle in %.0fs", self.settings.loop_interval)
                self.metrics.cycles.labels("error").inc()
            last_end = time.monotonic()
            deadline = started + self.settings.loop_interval
            while not self.stop_event.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if self.trigger.wait(min(remaining, 1.0)):
                    gap = MIN_TRIGGER_GAP - (time.monotonic() - last_end)
                    if gap > 0:
                        self.stop_event.wait(gap)
                    break

    def shutdown(self) -> None:
        self.stop_event.set()
        if self.history is not None and not self.dry_run and self.may_write():
            self.history_store.save(self.history, force=True)
        if self.elector is not None:
            # The election thread releases the Lease when it sees `stop_event`; wait for it,
            # then make sure (it may not have been started).
            for t in self._threads:
                if t.name == "leader-election":
                    t.join(self.elector.retry_period * 1.5 + 10)
            self.elector.release()
        if self.http is not None:
            self.http.stop()
        close = getattr(self._transport, "close", None)
        if callable(close):
            close()  # end open watches now rather than at their server-side timeout


def _workload_and_owner(wl: Workload | None) -> list[ObjectRef]:
    if wl is None:
        return []
    refs = [wl.ref]
    if wl.owner is not None and wl.owner.kind == "Job":
        refs.append(ObjectRef("Job", wl.owner.name, wl.namespace, wl.owner.uid, "batch/v1"))
    return refs


def _problems(plan: Plan) -> list[InputProblem]:
    out: list[InputProblem] = []
    for d in plan.decisions:
        out.extend(d.problems)
    out.extend(plan.problems)
    return out


# -- entry points used by controller.cli ----------------------------------------------------


def _transport(settings: Settings) -> Transport:
    from controller.live.kube import KubeTransport

    return KubeTransport.from_config(settings.kubeconfig_path or None)


def _print_plan(report: CycleReport, output: str, settings: Settings) -> str:
    from controller.render import render

    text = render(report.plan, output, settings)
    if output == "table":
        refused = report.refused()
        lines = [text, "", f"Writes a live run would make ({len(refused)}):"]
        lines += [f"  - {c.ref}: {c.summary}" for c in refused] or ["  (none)"]
        text = "\n".join(lines)
    return text


def run_live(settings: Settings, dry_run: bool, once: bool, output: str) -> int:
    """`python -m controller` without --from-file. Returns the process exit code."""
    from controller.live.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format)
    try:
        transport = _transport(settings)
    except Exception as e:
        log.error("cannot configure the Kubernetes client: %s", e)
        return 1
    controller = LiveController(settings, transport, dry_run=dry_run)
    previous = _install_signal_handlers(controller.stop_event)
    try:
        if once:
            return _run_once(controller, output)
        controller.start()
        if controller.stop_event.is_set():
            return 0
        if not controller.wait_synced():
            log.warning("caches not synced after %.0fs; running anyway", SYNC_TIMEOUT)
        if dry_run:
            _dry_run_loop(controller, output)
        else:
            controller.loop()
        return 0
    finally:
        controller.shutdown()
        _restore_signal_handlers(previous)
        log.info("stopped; %s", dict(controller.counting.snapshot()))


def _run_once(controller: LiveController, output: str) -> int:

    controller.discover()
    if controller.stop_event.is_set():
        return 0
    controller.build_informers()
    controller.sync_once()
    elector: LeaderElector | None = controller.elector
    if elector is not None:
        try:
            if not elector.try_acquire_or_renew():
                log.warning("another replica holds Lease %s/%s: computing only, no writes",
                            elector.namespace, elector.name)
        except Exception as e:
            log.warning("could not take the Lease (%s): computing only, no writes", e)
    report = controller.run_cycle()
    if controller.dry_run:
        print(_print_plan(report, output, controller.settings), flush=True)
    failed = report.applied.by_result(FAILED) if report.applied else []
    return 1 if failed else 0


def _dry_run_loop(controller: LiveController, output: str) -> None:
    last = ""
    while not controller.stop_event.is_set():
        report = controller.run_cycle()
        text = _print_plan(report, output, controller.settings)
        if text != last:
            print(text, flush=True)
            last = text
        controller.stop_event.wait(controller.settings.loop_interval)


def live_plan(settings: Settings, now: datetime) -> Plan:
    """For `explain` without --from-file: one LIST per resource, one plan, no writes."""
    controller = LiveController(settings, ReadOnlyTransport(_transport(settings)),
                                dry_run=True)
    controller.discover()
    controller.build_informers()
    controller.sync_once()
    plan, _ = controller.plan(now)
    return plan


_Handler = Callable[[int, FrameType | None], object] | int | None


def _install_signal_handlers(stop: threading.Event) -> dict[int, _Handler]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down (releasing the Lease)", signum)
        stop.set()

    previous: dict[int, _Handler] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    return previous


def _restore_signal_handlers(previous: dict[int, _Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


__all__ = ["LiveController", "live_plan", "run_live"]
