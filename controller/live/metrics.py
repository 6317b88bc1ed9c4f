"""Prometheus metrics (prefix `wdrf_`) and the HTTP server for /metrics, /healthz and /readyz.

Labels are bounded: class, team, pool, ClusterQueue, resource kind, result, HTTP code. There
are no per-workload labels.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

log = logging.getLogger(__name__)

CYCLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Team label values are bounded (docs/security.md, S2): configured teams always get a series,
# then the teams with the largest shares, up to MAX_TEAM_SERIES; the rest share one series
# team="other" (the largest of their shares), so no one can blow up Prometheus by making teams.
MAX_TEAM_SERIES = 100
OTHER_TEAM = "other"


def bound_teams(
    values: Mapping[str, float], limit: int = MAX_TEAM_SERIES, known: frozenset[str] = frozenset()
) -> dict[str, float]:
    """At most `limit` series: `known` teams first, then by share (largest first, then name);
    the overflow folded into OTHER_TEAM with the largest share among it."""
    if len(values) <= limit:
        return dict(values)
    ranked = sorted(values, key=lambda t: (t not in known, -values[t], t))
    keep = ranked[: max(limit - 1, 0)]
    rest = ranked[len(keep):]
    out = {t: values[t] for t in keep if t != OTHER_TEAM}
    out[OTHER_TEAM] = max([values[t] for t in rest] + ([values[OTHER_TEAM]]
                                                       if OTHER_TEAM in keep else []))
    return out


class Metrics:
    """All of the controller's metrics, on one registry (a fresh one per instance)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # Bound on wdrf_team_dominant_share series; configured teams (TEAM_WEIGHTS,
        # TEAM_NAMESPACES) always keep their own. See bound_teams.
        self.team_series_limit = MAX_TEAM_SERIES
        self.known_teams: frozenset[str] = frozenset()
        r = self.registry
        self.cycle_duration = Histogram(
            "wdrf_cycle_duration_seconds",
            "Time of one control cycle: snapshot, plan, diff and writes.",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.cycles = Counter(
            "wdrf_cycles", "Control cycles run, by outcome.", ["outcome"], registry=r
        )
        self.plan_pools = Counter(
            "wdrf_plan_pools",
            "Pools per plan: planned again (inputs changed), reused from the last plan, or "
            "the whole snapshot planned at once (counted once; it cannot be planned by pool).",
            ["planned"],
            registry=r,
        )
        self.last_cycle = Gauge(
            "wdrf_last_cycle_timestamp_seconds", "Unix time the last cycle ended.", registry=r
        )
        self.pending = Gauge(
            "wdrf_pending_workloads", "Pending workloads by priority class.", ["class"], registry=r
        )
        self.dominant_share = Gauge(
            "wdrf_team_dominant_share",
            "Weighted dominant resource share per team.",
            ["team"],
            registry=r,
        )
        self.usage_over_entitlement = Gauge(
            "wdrf_team_usage_over_entitlement",
            "Each team's dominant share of a pool (cohort or lone ClusterQueue) over its "
            "entitlement there, weight / sum of the weights of the teams active in the pool: "
            "1 = exactly its entitlement.",
            ["team", "pool"],
            registry=r,
        )
        self.oldest_wait = Gauge(
            "wdrf_oldest_pending_wait_seconds",
            "Wait of the oldest pending workload per ClusterQueue.",
            ["cluster_queue"],
            registry=r,
        )
        self.positions_right = Gauge(
            "wdrf_cluster_queue_positions_right",
            "Leading positions of Kueue's current order of a ClusterQueue's pending Workloads "
            "that are the plan's (as observed before the cycle's writes).",
            ["cluster_queue"],
            registry=r,
        )
        self.order_converged = Gauge(
            "wdrf_cluster_queue_order_converged",
            "1 when all of a ClusterQueue's pending Workloads are in the plan's order.",
            ["cluster_queue"],
            registry=r,
        )
        self.head_unconverged = Gauge(
            "wdrf_cluster_queues_head_unconverged",
            "ClusterQueues whose first 10 pending positions are not yet the plan's.",
            registry=r,
        )
        self.patches = Counter(
            "wdrf_patches",
            "Patches by target kind and result (applied, conflict, failed, refused, unsupported).",
            ["kind", "result"],
            registry=r,
        )
        self.api_requests = Counter(
            "wdrf_api_requests",
            "API requests sent, by verb (GET, WATCH, PATCH, POST, PUT) and resource.",
            ["verb", "resource"],
            registry=r,
        )
        self.api_errors = Counter(
            "wdrf_api_errors", "Failed API requests by HTTP code.", ["code"], registry=r
        )
        self.watch_restarts = Counter(
            "wdrf_watch_restarts",
            "Watch restarts by resource and reason (closed, gone, error).",
            ["resource", "reason"],
            registry=r,
        )
        self.relists = Counter(
            "wdrf_relists", "Full LISTs by resource.", ["resource"], registry=r
        )
        self.events = Counter(
            "wdrf_events", "Kubernetes Events by reason and result.", ["reason", "result"],
            registry=r,
        )
        self.is_leader = Gauge(
            "wdrf_is_leader", "1 while this replica holds the leader Lease.", registry=r
        )
        self.input_problems = Gauge(
            "wdrf_input_problems", "Bad inputs found in the last cycle.", registry=r
        )
        self.multikueue_skipped = Gauge(
            "wdrf_multikueue_skipped_workloads",
            "Workloads left unchanged in the last cycle because MultiKueue would delete or "
            "overwrite their remote copies (spec mode).", ["cluster_queue"], registry=r,
        )
        self.multikueue_held = Gauge(
            "wdrf_multikueue_held_copies",
            "MultiKueue copies on this worker left unchanged in the last cycle because their "
            "class is unknown: origin-unknown (manager Workload or its owner not found), "
            "owner-not-read (owned on the manager by a kind not read there).", ["reason"],
            registry=r,
        )

    def set_labelled(self, gauge: Gauge, values: Mapping[str, float]) -> None:
        """Replace all series of a one-label gauge, so stale teams/queues disappear. Team
        shares are bounded (bound_teams)."""
        if gauge is self.dominant_share:
            values = bound_teams(values, self.team_series_limit, self.known_teams)
        gauge.clear()
        for label, value in values.items():
            gauge.labels(label).set(value)

    def set_pool_teams(self, gauge: Gauge, values: Mapping[tuple[str, str], float]) -> None:
        """Replace all series of a (team, pool) gauge from {(pool, team): value}. Teams are
        bounded as for wdrf_team_dominant_share (bound_teams, by each team's largest value):
        the overflow shares team="other", per pool, with the largest value among it."""
        per_team: dict[str, float] = {}
        for (_, team), value in values.items():
            per_team[team] = max(per_team.get(team, value), value)
        kept = bound_teams(per_team, self.team_series_limit, self.known_teams)
        series: dict[tuple[str, str], float] = {}
        for (pool, team), value in values.items():
            key = (team if team in kept else OTHER_TEAM, pool)
            series[key] = max(series.get(key, value), value)
        gauge.clear()
        for (team, pool), value in series.items():
            gauge.labels(team, pool).set(value)


class Health:
    """Liveness: the loop made progress recently. Readiness: caches synced, start-up done."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after = stale_after
        self._clock = clock
        self._beat = clock()
        self._ready = False
        self._why_not_ready = "starting"

    def beat(self) -> None:
        self._beat = self._clock()

    def set_ready(self, ready: bool, why: str = "") -> None:
        self._ready = ready
        self._why_not_ready = why

    def alive(self) -> tuple[bool, str]:
        age = self._clock() - self._beat
        if age > self._stale_after:
            return False, f"control loop silent for {age:.0f}s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        return (True, "ok") if self._ready else (False, self._why_not_ready or "not ready")


def _handler(metrics: Metrics, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                self._send(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez"):
                self._probe(health.alive())
            elif path == "/readyz":
                self._probe(health.ready())
            else:
                self._send(404, b"not found\n", "text/plain")

        def _probe(self, result: tuple[bool, str]) -> None:
            ok, why = result
            self._send(200 if ok else 503, (why + "\n").encode(), "text/plain")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

    return Handler


class HttpServer:
    """Serves /metrics, /healthz and /readyz on one port in a daemon thread."""

    def __init__(self, metrics: Metrics, health: Health, port: int, host: str = "") -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(metrics, health))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="wdrf-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
