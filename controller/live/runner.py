"""The live controller's composition root: caches -> snapshot -> plan -> minimal writes.

Layout of one process:

* informer threads keep Workloads, ClusterQueues, LocalQueues, Kueue-managed Jobs and pods
  (and Nodes when capacity comes from inventories) in memory by LIST + WATCH; on a MultiKueue
  worker with a `manager` transport, also the manager's Workloads and Jobs (read only: the
  classes of the copies, `controller.multikueue.classes_from_manager`);
* a leader-election thread holds the Lease (not in dry run);
* an HTTP thread serves /metrics, /healthz, /readyz;
* the main thread runs cycles: every LOOP_INTERVAL, and within ~2 s of a watch event that
  `needs_prompt_cycle` (a new urgent/approved workload, a class change).

Request stack (bottom first): kubernetes client -> CountingTransport -> RateLimitedTransport
(client-side QPS; not the Lease) -> [ReadOnlyTransport in dry run] -> GuardedTransport (leader
only, each write with the deadline of the Lease) -> applier / Events / history. A dry run runs
the very same code path and every write is refused before it leaves the process.

What lives elsewhere: the per-object and per-plan diff (`diff`), sending (`apply`), which
Events a write gives (`outcomes`), process entry points and signals (`main`), probes
(`health`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from controller import collector
from controller.accounting import UsageHistory
from controller.config import CapacitySourceSetting, Settings
from controller.domain import (
    JobInfo,
    KueueApiVersion,
    ObjectRef,
    OwnerInfo,
    QuotaCheck,
    Workload,
    api_group,
)
from controller.incremental import IncrementalPlanner
from controller.live.api import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    JOBS,
    LOCAL_QUEUES,
    NODES,
    PODS,
    WORKLOADS,
    ApiError,
    CountingTransport,
    GuardedTransport,
    RateLimitedTransport,
    ReadOnlyTransport,
    Resource,
    TokenBucket,
    Transport,
)
from controller.live.apply import (
    REFUSED,
    Applier,
    ApplyReport,
)
from controller.live.cache import Informer, WatchSpec
from controller.live.diff import Change, Diff, Notice, plan_diff
from controller.live.discovery import (
    MODE_ANNOTATION,
    ModeChoice,
    kueue_resource,
)
from controller.live.events import EventRecorder
from controller.live.health import Probes
from controller.live.history import HistoryStore
from controller.live.leader import LeaderElector, default_identity
from controller.live.metrics import HttpServer, Metrics
from controller.live.owners import served_owner_resources
from controller.live.secure_metrics import SecureMetricsServer, TokenAuthorizer, tls_context
from controller.live.snapshot import (
    Built,
    ParseCache,
    Parsers,
    SnapshotBuilder,
    needs_prompt_cycle,
)
from controller.live.startup import Discovery
from controller.live.writer import CycleWriter
from controller.multikueue import classes_from_manager, guard_plan, hold_unknown
from controller.plan import (
    Plan,
    PriorityMode,
)
from controller.workload import job_key, owner_key

log = logging.getLogger(__name__)

JOB_SELECTOR = "kueue.x-k8s.io/queue-name"  # Jobs Kueue manages carry their queue label
OWNERS_PREFIX = "owners-"  # informer names for Workload owners of other integrated kinds
POD_SELECTOR = "kueue.x-k8s.io/managed=true"  # pods of Kueue's pod integration
MIN_TRIGGER_GAP = 0.5  # seconds between prompt cycles, so a burst of arrivals is one cycle
SYNC_TIMEOUT = 120.0
APPLY_WORKERS = 8  # concurrent writes (a first cycle on a big cluster writes thousands)
FRESHNESS_CRITICAL = ("workloads", "clusterqueues")  # stale -> not ready, writes paused
MANAGER_PREFIX = "manager-"  # informer names for the MultiKueue manager's Workloads and Jobs
SHUTDOWN_GRACE = 25.0  # below the Deployment's terminationGracePeriodSeconds (30)


def default_parsers() -> Parsers:
    from controller.parse import (
        parse_admission_check,
        parse_cluster_queue,
        parse_job,
        parse_local_queue,
        parse_node,
        parse_owner,
        parse_workload,
    )

    return Parsers(parse_workload, parse_cluster_queue, parse_local_queue, parse_job, parse_node,
                   parse_owner, parse_admission_check)


@dataclass
class CycleReport:
    plan: Plan
    changes: list[Change] = field(default_factory=list)
    applied: ApplyReport | None = None
    leader: bool = False
    paused: str = ""  # why writes were paused this cycle (stale cache), "" = not paused
    seconds: float = 0.0
    notices: list[Notice] = field(default_factory=list)

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
        manager: Transport | None = None,
    ) -> None:
        self.settings = settings
        self.dry_run = dry_run
        self.identity = identity or default_identity()
        self.metrics = metrics or Metrics()
        self._transport = transport
        self.counting = CountingTransport(
            transport, lambda verb, res: self.metrics.api_requests.labels(verb, res).inc()
        )
        self.bucket = TokenBucket(settings.client_qps, settings.client_burst)
        limited = RateLimitedTransport(self.counting, self.bucket)
        base: Transport = ReadOnlyTransport(limited) if dry_run else limited
        self.reader = base
        # The MultiKueue manager (MULTIKUEUE_MANAGER_KUBECONFIG): never written to.
        self.manager_reader: Transport | None = None
        if manager is not None:
            self.manager_reader = ReadOnlyTransport(RateLimitedTransport(
                CountingTransport(manager, lambda verb, res: self.metrics.api_requests.labels(
                    verb, MANAGER_PREFIX + res).inc()),
                TokenBucket(settings.client_qps, settings.client_burst)))
        self.stop_event = threading.Event()  # stop planning (SIGTERM, lost leadership)
        self._elector_stop = threading.Event()  # stop renewing (after the last write)
        self.lost_leadership = False
        self.elector: LeaderElector | None = None
        if settings.leader_election and not dry_run:
            # The Lease talks to the apiserver directly: never behind the rate limiter.
            self.elector = LeaderElector(
                self.counting, settings.controller_namespace, settings.lease_name,
                self.identity, self.metrics, settings.lease_duration, settings.renew_deadline,
                settings.retry_period, on_change=self._leadership_changed,
                annotations=self._lease_annotations,
            )
            self.writer: Transport = GuardedTransport(base, self.elector.write_time_left,
                                                      "not the leader")
        else:
            self.writer = base
        self.events = EventRecorder(self.writer, self.metrics, settings.event_rate_limit,
                                    settings.event_qps,
                                    instance=self.identity)
        self.applier = Applier(
            self.writer, self.metrics, max_attempts=settings.api_retries,
            retry_budget=min(10.0, max(settings.loop_interval / 2, 1.0)), workers=APPLY_WORKERS,
            stopping=self.stop_event.is_set,
        )
        self.history_store = HistoryStore(
            self.writer, settings.controller_namespace, settings.history_config_map,
            save_every=max(60.0, settings.loop_interval),
        )
        self.history: UsageHistory | None = (
            None if settings.usage_half_life <= 0 else self.history_store.load())
        self.parsers = parsers or default_parsers()
        self.builder = SnapshotBuilder(self.parsers)
        self._manager_wls = ParseCache(self.parsers.workload)
        self._manager_jobs = ParseCache(self.parsers.job)
        self._manager_owners = ParseCache(self.parsers.owner) if self.parsers.owner else None
        # owner kinds read on the manager: "group/Kind" -> informer name
        self._manager_owner_kinds: dict[str, str] = {}
        # copies whose class is unknown -> why (controller.multikueue.ORIGIN_UNKNOWN, ...)
        self._unknown_copies: Mapping[str, str] = {}
        # Replans only the pools whose inputs changed; equal to compute_plan on the whole.
        self.planner = IncrementalPlanner()
        self.collector = collector.Collector()  # the cyclic GC, between cycles
        self._whole = ""
        self.health = Probes(stale_after=max(60.0, 3 * settings.loop_interval))
        self.max_staleness = settings.cache_max_staleness
        self.cycle_writer = CycleWriter(self.applier, self.events, self.metrics,
                                        settings.write_budget, self.stop_event.is_set)
        self.trigger = threading.Event()
        self._watch_timeout = watch_timeout
        self._threads: list[threading.Thread] = []
        self._warned: set[str] = set()
        self._reload_history = False
        self._redetect = False
        self._cycle_lock = threading.Lock()
        self.discovery = Discovery(
            self.reader, settings, dry_run,
            lambda: self.elector.observed_annotations if self.elector is not None else None)
        self.informers: dict[str, Informer] = {}
        self.http: HttpServer | SecureMetricsServer | None = None
        self.cycles = 0

    # -- start-up -------------------------------------------------------------------------

    def _lease_annotations(self) -> dict[str, str]:
        return {MODE_ANNOTATION: self.mode.mode.value} if self.mode is not None else {}

    def detect_mode(self) -> ModeChoice:
        """`Discovery.detect_mode`."""
        return self.discovery.detect_mode()

    def discover(self, deadline: float | None = None) -> None:
        """`Discovery.discover`, until the apiserver answers (or `stop_event`, or the monotonic
        `deadline`); not ready meanwhile."""
        self.discovery.discover(self.stop_event, deadline,
                                lambda why: self.health.set_ready(False, why))

    @property
    def mode(self) -> ModeChoice | None:
        return self.discovery.mode

    @property
    def kueue_version(self) -> KueueApiVersion | None:
        return self.discovery.kueue_version

    @property
    def owner_resources(self) -> list[Resource]:
        return self.discovery.owner_resources

    @property
    def quota_check(self) -> QuotaCheck:
        return self.discovery.quota_check

    def _resource(self, base: Resource) -> Resource:
        assert self.kueue_version is not None
        return kueue_resource(base, self.kueue_version)

    def build_informers(self) -> None:
        specs = {
            "workloads": WatchSpec(self._resource(WORKLOADS)),
            "clusterqueues": WatchSpec(self._resource(CLUSTER_QUEUES)),
            "localqueues": WatchSpec(self._resource(LOCAL_QUEUES)),
            "admissionchecks": WatchSpec(self._resource(ADMISSION_CHECKS)),
            "jobs": WatchSpec(JOBS, label_selector=JOB_SELECTOR),
            "pods": WatchSpec(PODS, label_selector=POD_SELECTOR),
        }
        if self.settings.capacity_source != CapacitySourceSetting.QUOTA:
            specs["nodes"] = WatchSpec(NODES)
        for res in self.owner_resources:  # JobSets, RayJobs, ...: class annotations
            specs[f"{OWNERS_PREFIX}{res.plural}"] = WatchSpec(res, label_selector=JOB_SELECTOR)
        self.informers = {
            name: Informer(self.reader, spec, self.metrics, on_event=self._on_event,
                           watch_timeout=self._watch_timeout)
            for name, spec in specs.items()
        }
        if self.manager_reader is not None:
            manager_specs = {
                f"{MANAGER_PREFIX}workloads": WatchSpec(self._resource(WORKLOADS)),
                f"{MANAGER_PREFIX}jobs": WatchSpec(JOBS, label_selector=JOB_SELECTOR),
            }
            self._manager_owner_kinds = {}
            for res in self._manager_owner_resources():  # JobSets, ... there: their classes
                name = f"{MANAGER_PREFIX}{OWNERS_PREFIX}{res.plural}"
                manager_specs[name] = WatchSpec(res, label_selector=JOB_SELECTOR)
                self._manager_owner_kinds[f"{res.group}/{res.kind}"] = name
            for name, spec in manager_specs.items():
                inf = Informer(self.manager_reader, spec, self.metrics,
                               on_event=self._on_manager_event,
                               watch_timeout=self._watch_timeout)
                inf.name = name  # its metrics apart from this cluster's
                self.informers[name] = inf

    def _manager_owner_resources(self) -> list[Resource]:
        """The owner kinds (JobSet, RayJob, ...) the manager serves, discovered once at start;
        none while it cannot be reached then (their copies are left unchanged, counted as
        owner-not-read, until a restart)."""
        assert self.manager_reader is not None
        try:
            self.manager_reader.request("GET", "/apis/kueue.x-k8s.io", timeout=10)
        except ApiError as e:
            log.warning("MultiKueue manager not reachable at start-up (%s): class annotations "
                        "of its JobSets, RayJobs, ... are not read until a restart", e)
            return []
        return served_owner_resources(self.manager_reader)

    def _on_event(self, kind: str, old: object, new: object) -> None:
        jobs = self.informers.get("jobs")
        lookup = jobs.get if jobs is not None else (lambda _key: None)
        if needs_prompt_cycle(kind, old, new, lookup):  # type: ignore[arg-type]
            self.trigger.set()

    def _on_manager_event(self, kind: str, old: object, new: object) -> None:
        """A class change on the manager reorders the copies here within a prompt cycle."""
        jobs = self.informers.get(f"{MANAGER_PREFIX}jobs")
        lookup = jobs.get if jobs is not None else (lambda _key: None)
        if needs_prompt_cycle(kind, old, new, lookup):  # type: ignore[arg-type]
            self.trigger.set()

    def _http_server(self) -> HttpServer | SecureMetricsServer:
        """Plain /metrics and health on METRICS_PORT; with METRICS_CERT_FILE, /metrics over
        HTTPS (TokenReview + SubjectAccessReview per scrape) and health on HEALTH_PORT."""
        s = self.settings
        if not s.metrics_cert_file:
            server: HttpServer | SecureMetricsServer = HttpServer(self.metrics, self.health,
                                                                   s.metrics_port)
            log.info("serving /metrics, /healthz, /readyz on :%d", server.port)
            return server
        secure = SecureMetricsServer(
            self.metrics, self.health, TokenAuthorizer(self.counting),
            tls_context(s.metrics_cert_file, s.metrics_key_file), s.metrics_port,
            s.health_port,
        )
        log.info("serving /metrics over HTTPS (token checked) on :%d, /healthz, /readyz on :%d",
                 secure.port, secure.health_port)
        return secure

    def start(self, serve_http: bool = True) -> None:
        """Discover, start watches, leader election and the HTTP server (not blocking)."""
        if serve_http and self.settings.metrics_port:
            # First, so the startupProbe sees "starting" rather than a refused connection.
            self.http = self._http_server()
            self.http.start()
        self.discover()
        if self.stop_event.is_set():
            return
        self.build_informers()
        for name, inf in self.informers.items():
            self._spawn(f"watch-{name}", self._runner_of(inf))
        if self.elector is not None:
            elector = self.elector
            self._spawn("leader-election", lambda: elector.run(self._elector_stop))

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
            self._reload_history = self.settings.usage_half_life > 0
            self._redetect = self.settings.priority_mode is PriorityMode.AUTO
            self.trigger.set()
        elif not self.stop_event.is_set():
            # Lost, not released: stop at once and let the Deployment restart this replica
            # (a clean follower start), as client-go's OnStoppedLeading does.
            log.error("lost leadership of Lease %s/%s; exiting",
                      self.settings.controller_namespace, self.settings.lease_name)
            self.lost_leadership = True
            self.stop_event.set()
            self.trigger.set()

    # -- one cycle ------------------------------------------------------------------------

    def may_write(self) -> bool:
        return self.dry_run or self.elector is None or self.elector.is_leader()

    def snapshot(self) -> Built:
        inf = self.informers
        jobs = {f"{o['metadata'].get('namespace')}/{o['metadata'].get('name')}": o
                for o in inf["jobs"].items()}
        nodes = inf["nodes"].items() if "nodes" in inf else []
        owners = {owner_key(str(o["metadata"].get("namespace")), str(o.get("kind")),
                            str(o["metadata"].get("name"))): o
                  for name, i in inf.items() if name.startswith(OWNERS_PREFIX)
                  for o in i.items()}
        built = self.builder.build(
            inf["workloads"].items(), inf["clusterqueues"].items(), inf["localqueues"].items(),
            jobs, nodes, owners,
            inf["admissionchecks"].items() if "admissionchecks" in inf else None,
        )
        if f"{MANAGER_PREFIX}workloads" not in inf:
            return built
        self._manager_wls.prune(inf[f"{MANAGER_PREFIX}workloads"].items())
        self._manager_jobs.prune(inf[f"{MANAGER_PREFIX}jobs"].items())
        if self._manager_owners is not None:
            self._manager_owners.prune([o for name in self._manager_owner_kinds.values()
                                        for o in inf[name].items()])
        found = classes_from_manager(built.snapshot, self._manager_workload, self._manager_job,
                                     self._manager_owner, frozenset(self._manager_owner_kinds))
        self._unknown_copies = found.unknown
        return dataclasses.replace(built, snapshot=found.snapshot)

    def _manager_workload(self, key: str) -> Workload | None:
        obj = self.informers[f"{MANAGER_PREFIX}workloads"].get(key)
        return self._manager_wls.get(obj)[0] if obj is not None else None

    def _manager_job(self, namespace: str, name: str) -> JobInfo | None:
        obj = self.informers[f"{MANAGER_PREFIX}jobs"].get(job_key(namespace, name))
        return self._manager_jobs.get(obj)[0] if obj is not None else None

    def _manager_owner(self, namespace: str, ref: ObjectRef) -> OwnerInfo | None:
        name = self._manager_owner_kinds.get(f"{api_group(ref.api_version)}/{ref.kind}")
        obj = self.informers[name].get(job_key(namespace, ref.name)) if name else None
        if obj is None or self._manager_owners is None:
            return None
        return self._manager_owners.get(obj)[0]

    def plan(self, now: datetime) -> tuple[Plan, Built]:
        built = self.snapshot()
        snap = dataclasses.replace(built.snapshot, quota_check=self.quota_check,
                                   requeue_timestamp=self.quota_check.requeue_timestamp)
        with collector.paused():  # no collection mid-plan: it makes no cyclic garbage
            plan = self.planner.plan(snap, self.settings, now, self.history)
        planner = self.planner
        if planner.fallback:
            self.metrics.plan_pools.labels("whole").inc()
            if planner.fallback != self._whole:
                log.info("planning the whole cluster each cycle: %s", planner.fallback)
        else:
            self.metrics.plan_pools.labels("replanned").inc(len(planner.replanned))
            self.metrics.plan_pools.labels("reused").inc(planner.pools - len(planner.replanned))
        self._whole = planner.fallback
        if self.mode is None:
            return plan, built
        guarded = guard_plan(plan, snap, self.mode.mode)
        self.metrics.set_labelled(self.metrics.multikueue_skipped, guarded.skipped)
        held = hold_unknown(guarded.plan, self._unknown_copies)
        if self.manager_reader is not None:
            self.metrics.set_labelled(self.metrics.multikueue_held, held.counts)
        return held.plan, built

    def stale_caches(self) -> tuple[str, ...]:
        """Workload/ClusterQueue caches older than CACHE_MAX_STALENESS ("workloads 130s")."""
        out = []
        for name in FRESHNESS_CRITICAL:
            inf = self.informers.get(name)
            if inf is None:
                continue
            age = inf.age()
            if age > self.max_staleness:
                out.append(f"{name} {age:.0f}s" if age != float("inf") else f"{name} never")
        return tuple(out)

    def run_cycle(self, now: datetime | None = None) -> CycleReport:
        with self._cycle_lock:
            return self._run_cycle(now)

    def _run_cycle(self, now: datetime | None) -> CycleReport:
        started = time.monotonic()
        now = now or datetime.now(UTC)
        if self._redetect:
            self._redetect = False
            self.discovery.refresh_mode()
        if self._reload_history and self.settings.usage_half_life > 0:
            self._reload_history = False
            self.history = self.history_store.load() or self.history
        plan, built = self.plan(now)
        if plan.history is not None:
            self.history = plan.history
        stale = self.stale_caches()
        self.health.set_stale(stale)
        self._observe(plan, built)
        self._warn(plan.warnings)
        report = CycleReport(plan, leader=self.may_write())
        if report.leader and stale:
            report.paused = "stale cache: " + ", ".join(stale)
            log.warning("writes paused: %s (CACHE_MAX_STALENESS %.0fs)", report.paused,
                        self.max_staleness)
        elif report.leader and not self.stop_event.is_set():
            self._write(plan, built, report)
        report.seconds = time.monotonic() - started
        self.metrics.cycle_duration.observe(report.seconds)
        self.metrics.cycles.labels("leader" if report.leader else "follower").inc()
        self.metrics.last_cycle.set(time.time())
        self.health.beat()
        self.cycles += 1
        self._log_cycle(report)
        return report

    def _write(self, plan: Plan, built: Built, report: CycleReport) -> None:
        diff = self.diff(plan, built)
        report.changes, report.notices = list(diff.changes), list(diff.notices)
        report.applied = self.cycle_writer.write(plan, diff, built.infos)
        if self.history is not None and not self.dry_run:
            self.history_store.save(self.history)
        self._report_invalid_history()

    def _report_invalid_history(self) -> None:
        """An Event on the history ConfigMap when its content was dropped (sent once, by the
        leader; the ConfigMap is rewritten by the next save)."""
        why = self.history_store.invalid
        if not why:
            return
        store = self.history_store
        ref = ObjectRef("ConfigMap", store.name, store.namespace, "", "v1")
        if self.events.emit(ref, "UsageHistoryReset",
                            f"stored usage history ignored, starting from current usage: {why}",
                            "Warning"):
            store.invalid = ""

    def diff(self, plan: Plan, built: Built) -> Diff:
        assert self.mode is not None
        pods_by_uid = {str(p["metadata"].get("uid")): p for p in self.informers["pods"].items()}
        return plan_diff(
            plan.decisions, self.mode.mode, self._resource(WORKLOADS),
            built.infos, self.informers["jobs"].get, pods_by_uid,
            fraction_refused=self.applier.refused_fraction,
        )

    # -- observability --------------------------------------------------------------------

    def _observe(self, plan: Plan, built: Built) -> None:
        by_class: dict[str, float] = {c: 0 for c in ("urgent", "approved", "normal")}
        oldest: dict[str, float] = {}
        for d in plan.decisions:
            cls = d.breakdown.priority_class.value if d.breakdown else "unknown"
            by_class[cls] = by_class.get(cls, 0) + 1
            info = built.infos.get(d.key)
            if info is not None:
                wait = max((plan.now - info.workload.created).total_seconds(), 0.0)
                cq = d.cluster_queue or "-"
                oldest[cq] = max(oldest.get(cq, 0.0), wait)
        m = self.metrics
        m.set_labelled(m.pending, by_class)
        m.set_labelled(m.dominant_share, {t: s.dominant_share for t, s in plan.teams.items()})
        m.set_pool_teams(m.usage_over_entitlement,
                         {pt: ts.usage_over_entitlement for pt, ts in plan.pool_shares.items()})
        m.set_labelled(m.oldest_wait, oldest)
        problems = sum(len(d.problems) for d in plan.decisions) + len(plan.problems)
        m.input_problems.set(problems)
        synced = all(i.synced for i in self.informers.values())
        self.health.set_ready(synced, "" if synced else "caches not synced")

    def _warn(self, warnings: Iterable[str]) -> None:
        """The plan's warnings (settings, ClusterQueues, unknown LocalQueues), each logged when it
        appears, not every cycle."""
        current = set(warnings)
        for warning in sorted(current - self._warned):
            log.warning("%s", warning)
        self._warned = current

    def _log_cycle(self, report: CycleReport) -> None:
        counts = report.applied.counts() if report.applied else {}
        level = logging.INFO if counts else logging.DEBUG
        note = "" if report.leader else " (not leader: no writes)"
        if report.paused:
            note = f" (writes paused: {report.paused})"
        log.log(level, "cycle %d: %d pending, %d changes %s, %.3fs%s",
                self.cycles, len(report.plan.decisions), len(report.changes), counts,
                report.seconds, note,
                extra={"pending": len(report.plan.decisions), "results": counts,
                       "seconds": round(report.seconds, 4)})

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
            self.collector.after_cycle()
            log.debug("garbage collection after the cycle: %.3fs CPU%s",
                      self.collector.last_seconds,
                      " (whole heap)" if self.collector.last_full else "")
            last_end = time.monotonic()
            # A cycle longer than LOOP_INTERVAL still leaves a pause before the next one.
            deadline = max(started + self.settings.loop_interval, last_end + MIN_TRIGGER_GAP)
            while not self.stop_event.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if self.trigger.wait(min(remaining, 1.0)):
                    gap = MIN_TRIGGER_GAP - (time.monotonic() - last_end)
                    if gap > 0:
                        self.stop_event.wait(gap)
                    break

    def shutdown(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Stop planning, let in-flight writes finish, save the history, then release the
        Lease — in that order, within `grace` seconds (the Deployment's
        terminationGracePeriodSeconds is 30)."""
        deadline = time.monotonic() + grace
        self.stop_event.set()  # no new cycle, no new write (the applier checks it)
        self.trigger.set()
        drained = self._cycle_lock.acquire(timeout=max(0.0, deadline - time.monotonic() - 3))
        try:
            if not drained:
                log.warning("the last cycle did not finish within the grace period")
            if self.history is not None and not self.dry_run and self.may_write():
                self.history_store.save(self.history, force=True)
            if self.elector is not None:
                self._elector_stop.set()
                for t in self._threads:
                    if t.name == "leader-election":
                        t.join(max(0.0, min(self.elector.request_timeout * 2 + 1,
                                            deadline - time.monotonic())))
                self.elector.release()
        finally:
            if drained:
                self._cycle_lock.release()
        if self.http is not None:
            self.http.stop()
        close = getattr(self._transport, "close", None)
        if callable(close):
            close()  # end open watches now rather than at their server-side timeout


__all__ = ["CycleReport", "LiveController"]
