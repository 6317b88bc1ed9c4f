"""/metrics over HTTPS with Kubernetes authentication and authorization; health on a separate
plain-HTTP port (docs/security.md, S8).

What Kubernetes components do (and controller-runtime's `WithAuthenticationAndAuthorization`,
kube-rbac-proxy): every /metrics request must carry `Authorization: Bearer <token>`; the token
is checked with a TokenReview (401 when it is missing or not valid), and the user it names must
be allowed `get` on the non-resource URL `/metrics` by a SubjectAccessReview (403 otherwise).
Grant scrapers the ClusterRole `wdrf-metrics-reader` (manifests/metrics-reader.yaml). Answers
are cached for `cache_ttl` seconds per token, so a scrape every 15-30 s costs the API server
nothing after the first; a failed review (API server unreachable) is not cached: 503.

`/healthz`, `/livez` and `/readyz` are served on `health_port` without TLS or auth, for the
kubelet's probes only: they reveal nothing but "ok" or why not.

The identity serving this needs `create` on `tokenreviews.authentication.k8s.io` and
`subjectaccessreviews.authorization.k8s.io` (controller/live/rbac.py: `auth_delegation`).
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controller.live.api import ApiError, Transport
from controller.live.metrics import Health, Metrics

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
METRICS_PATH = "/metrics"
HEALTH_PATHS = ("/healthz", "/livez", "/readyz")


@dataclass(frozen=True, slots=True)
class Decision:
    code: int  # 200 allowed, 401 not authenticated, 403 not authorized, 503 review failed
    why: str
    user: str = ""


class TokenAuthorizer:
    """TokenReview + SubjectAccessReview for one non-resource path, cached per token."""

    def __init__(
        self,
        transport: Transport,
        path: str = METRICS_PATH,
        verb: str = "get",
        cache_ttl: float = 60.0,
        audiences: tuple[str, ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._t = transport
        self._path = path
        self._verb = verb
        self._ttl = cache_ttl
        self._audiences = audiences
        self._clock = clock
        self._cache: dict[str, tuple[float, Decision]] = {}
        self._lock = threading.Lock()

    def decide(self, authorization: str | None) -> Decision:
        token = _bearer(authorization)
        if not token:
            return Decision(401, "no bearer token")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit and hit[0] > now:
                return hit[1]
        try:
            decision = self._review(token)
        except ApiError as e:
            log.warning("metrics authorization: review failed: %s", e)
            return Decision(503, "could not check the token with the API server")
        with self._lock:
            if len(self._cache) > 1000:  # bounded: drop expired entries, then everything
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) > 1000:
                    self._cache.clear()
            self._cache[key] = (now + self._ttl, decision)
        return decision

    def _review(self, token: str) -> Decision:
        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = list(self._audiences)
        tr = self._t.request("POST", TOKEN_REVIEWS, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})
        status = (tr or {}).get("status") or {}
        if not status.get("authenticated"):
            return Decision(401, "token not valid: " + str(status.get("error") or "rejected"))
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        sar_spec: dict[str, Any] = {
            "user": username,
            "groups": list(user.get("groups") or []),
            "nonResourceAttributes": {"path": self._path, "verb": self._verb},
        }
        if user.get("uid"):
            sar_spec["uid"] = user["uid"]
        if user.get("extra"):
            sar_spec["extra"] = user["extra"]
        sar = self._t.request("POST", SUBJECT_ACCESS_REVIEWS, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": sar_spec})
        sar_status = (sar or {}).get("status") or {}
        if sar_status.get("allowed") and not sar_status.get("denied"):
            return Decision(200, "allowed", username)
        return Decision(403, f"user {username} may not {self._verb} {self._path}", username)


def _bearer(authorization: str | None) -> str:
    if not authorization:
        return ""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _send(handler: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    if code == 401:
        handler.send_header("WWW-Authenticate", 'Bearer realm="wdrf-controller"')
    handler.end_headers()
    handler.wfile.write(body)


def _metrics_handler(metrics: Metrics, auth: TokenAuthorizer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10

        def do_GET(self) -> None:
            if self.path.split("?")[0] != METRICS_PATH:
                _send(self, 404, b"not found\n", "text/plain")
                return
            d = auth.decide(self.headers.get("Authorization"))
            if d.code != 200:
                _send(self, d.code, (d.why + "\n").encode(), "text/plain")
                return
            _send(self, 200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("https: " + format, *args)

    return Handler


def _health_handler(health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in ("/healthz", "/livez"):
                ok, why = health.alive()
            elif path == "/readyz":
                ok, why = health.ready()
            else:
                _send(self, 404, b"not found\n", "text/plain")
                return
            _send(self, 200 if ok else 503, (why + "\n").encode(), "text/plain")

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

    return Handler


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """Server TLS (1.2 or newer) from PEM files, e.g. a mounted kubernetes.io/tls Secret."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


class SecureMetricsServer:
    """HTTPS /metrics (authenticated, authorized) on `port`, plain /healthz, /livez, /readyz on
    `health_port`, each in a daemon thread. Port 0 picks a free port (tests)."""

    def __init__(
        self,
        metrics: Metrics,
        health: Health,
        authorizer: TokenAuthorizer,
        tls: ssl.SSLContext,
        port: int,
        health_port: int,
        host: str = "",
    ) -> None:
        self._https = ThreadingHTTPServer((host, port), _metrics_handler(metrics, authorizer))
        # The handshake happens in the request's own thread (on its first read), so a client
        # that never completes one cannot block accept(); handlers time out after 10 s.
        self._https.socket = tls.wrap_socket(self._https.socket, server_side=True,
                                             do_handshake_on_connect=False)
        self._https.daemon_threads = True
        self._health = ThreadingHTTPServer((host, health_port), _health_handler(health))
        self._health.daemon_threads = True
        self._threads = [
            threading.Thread(target=s.serve_forever, name=name, daemon=True)
            for s, name in ((self._https, "wdrf-https-metrics"), (self._health, "wdrf-health"))
        ]

    @property
    def port(self) -> int:
        return int(self._https.server_address[1])

    @property
    def health_port(self) -> int:
        return int(self._health.server_address[1])

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        for s in (self._https, self._health):
            s.shutdown()
            s.server_close()
