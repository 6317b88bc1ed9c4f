"""A real Kubernetes control plane for tests and development: etcd + kube-apiserver + Kueue's
manager (with its webhooks), optionally kube-controller-manager, kube-scheduler and kwok, and
HAMi's scheduler as its chart runs it (``start_hami``, see :mod:`tests.support.hami`).

Binaries come from ``tools/bin`` (built by ``make tools``). Usage outside pytest::

    from tests.support.plane import Plane
    with Plane.temporary() as plane:          # starts etcd, kube-apiserver, Kueue
        plane.start_e2e()                      # optional: controller-manager, scheduler, kwok
        api = plane.api_client()               # admin kubernetes.client.ApiClient
        print(plane.kubeconfig)

Everything is stopped by ``stop()``, on context exit, at interpreter exit and on SIGTERM/SIGHUP.

Kueue's visibility API (``visibility.kueue.x-k8s.io`` v1beta2 and v1beta1, ``pendingworkloads``
of ClusterQueues and LocalQueues) is served through the apiserver's aggregation layer, as on a
cluster: Kueue's visibility server listens on this machine's first non-loopback IPv4 address
(EndpointSlice validation rejects 127.0.0.0/8), a selector-less Service with an EndpointSlice
points there, and the APIServices trust its certificate (``/visibility``, where Kueue reads it;
shared by every plane on the machine, see :func:`tests.support.certs.shared_serving_cert`).
Without such an address the plane starts without it and ``visibility_missing`` says why.

The apiserver writes an audit log (``plane.audit_log``, JSON lines; policy ``AUDIT_POLICY``):
every write request (create, update, patch, delete) with user, user agent, verb, object,
response code and timestamps, plus watch requests for Workloads. Tests read it as an
independent witness of what a controller sent (``audit_events``).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.support import hami
from tests.support.certs import FRONT_PROXY_CLIENT, Pki, make_pki, shared_serving_cert
from tests.support.procs import PlaneError, Proc, free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
CORE_BINARIES = ("etcd", "kube-apiserver", "kueue")
E2E_BINARIES = ("kube-controller-manager", "kube-scheduler", "kwok")
HAMI_BINARIES = ("hami-scheduler", "kube-scheduler")
KUEUE_NAMESPACE = "kueue-system"
KUEUE_CONFIGMAP = "kueue-manager-config"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
# Kueue v0.19 reads its visibility server's certificate from this fixed folder (tls.crt,
# tls.key; pkg/visibility/server.go) when internal cert management is off.
VISIBILITY_CERT_DIR = Path("/visibility")
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")
# The Service of Kueue's config/components/visibility (with its kustomization's name prefix).
VISIBILITY_SERVICE = "kueue-visibility-server"
VISIBILITY_DNS = f"{VISIBILITY_SERVICE}.{KUEUE_NAMESPACE}.svc"
ADMIN_USER = "wdrf-admin"
FIELD_MANAGER = "wdrf-test-plane"
# CRDs whose conversion webhook Kueue's kustomization enables.
CONVERTED_CRDS = {
    "localqueues.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "cohorts.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io", "multikueueclusters.kueue.x-k8s.io",
}
KWOK_STAGES = ("kustomize/stage/node/fast", "kustomize/stage/node/heartbeat-with-lease",
               "kustomize/stage/pod/general")
KCM_CONTROLLERS = ("job-controller,replicaset-controller,deployment-controller,"
                   "namespace-controller,garbage-collector-controller,"
                   "serviceaccount-controller,ttl-after-finished-controller,statefulset-controller,"
                   "clusterrole-aggregation-controller,node-lifecycle-controller,"
                   "pod-garbage-collector-controller")


# What the apiserver's audit log records: every write (all users, all resources), and watches
# of Workloads (to count re-watches); at Metadata level (no bodies), one event per request at
# ResponseComplete (watches also at ResponseStarted).
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete"]},
        {"level": "Metadata", "verbs": ["watch"],
         "resources": [{"group": "kueue.x-k8s.io", "resources": ["workloads"]}]},
        {"level": "None"},
    ],
}


def read_audit_log(path: Path) -> list[dict[str, Any]]:
    """The audit events in ``path`` (JSON lines; a torn last line is skipped)."""
    out: list[dict[str, Any]] = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


def bin_dir() -> Path:
    """Where the built binaries live (``$WDRF_TOOLS_BIN`` or ``tools/bin``)."""
    return Path(os.environ.get("WDRF_TOOLS_BIN", TOOLS / "bin"))


def require_binaries(names: tuple[str, ...] = CORE_BINARIES) -> dict[str, Path]:
    """Return the binaries' paths or raise :class:`PlaneError` naming what is missing."""
    paths = {n: bin_dir() / n for n in names}
    missing = [n for n, p in paths.items() if not os.access(p, os.X_OK)]
    if not missing:
        return paths
    go = shutil.which("go")
    hint = ("run `make tools` (or `bash tools/build.sh`) to build them from the pinned Go "
            "modules" if go else "the `go` command (Go >= 1.26) is not installed either, so "
            "they cannot be built; install Go 1.26 and run `make tools`")
    raise PlaneError(f"what is missing: {', '.join(missing)} in {bin_dir()}; {hint}")


def go_module_dir(tools_module: str, module: str) -> Path:
    """Directory of ``module`` as pinned by ``tools/<tools_module>/go.mod`` (module cache)."""
    go = shutil.which("go")
    if go is None:
        raise PlaneError(f"what is missing: the `go` command, needed to locate {module}'s "
                         "manifests in the Go module cache")
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
    r = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", module], cwd=TOOLS / tools_module,
                       capture_output=True, text=True, env=env, check=False)
    d = Path(r.stdout.strip())
    if r.returncode != 0 or not r.stdout.strip() or not d.is_dir():
        raise PlaneError(f"what is missing: {module} in the Go module cache "
                         f"(go list in tools/{tools_module} said: {r.stderr.strip()}); "
                         "run `make tools` with access to the Go module proxy")
    return d


# Kueue manager ``resources`` section of Kueue's "Using HAMi" guide: per-GPU HAMi resources are
# multiplied by nvidia.com/gpu into total-* resources a ClusterQueue can give quota for.
# Without it Kueue (v0.19.2 default BlockUndeclared) leaves Workloads requesting
# nvidia.com/gpucores or gpumem pending ("resource ... unavailable in ClusterQueue").
HAMI_KUEUE_RESOURCES: dict[str, Any] = {"transformations": [
    {"input": f"nvidia.com/{r}", "strategy": "Replace", "multiplyBy": "nvidia.com/gpu",
     "outputs": {f"nvidia.com/total-{r}": "1"}} for r in ("gpucores", "gpumem")]}


@dataclass(frozen=True)
class KueueSettings:
    """How Kueue's manager is configured.

    ``priority_boost`` sets the ``PriorityBoost`` feature gate; ``feature_gates`` adds more;
    ``extra`` is merged into the top level of the manager configuration.
    """

    priority_boost: bool = True
    frameworks: tuple[str, ...] = ("batch/job", "pod")
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)


def load_yaml_docs(path: Path) -> list[Any]:
    """All YAML documents of ``path``; cached as JSON in ``.cache/plane`` (the Workload CRD is
    1.4 MB and takes seconds to parse with pure-Python PyYAML)."""
    key = hashlib.sha256(f"{path}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    cache = REPO / ".cache" / "plane" / f"{path.stem}-{key}.json"
    with contextlib.suppress(OSError, ValueError):
        docs: list[Any] = json.loads(cache.read_text())
        return docs
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = [d for d in yaml.load_all(path.read_text(), Loader=loader) if d]
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(docs))
        tmp.replace(cache)
    return docs


def host_ip() -> str | None:
    """This machine's first IPv4 address that an EndpointSlice accepts (not loopback,
    link-local, multicast or unspecified), or None. ``$WDRF_PLANE_HOST_IP`` overrides."""
    if os.environ.get("WDRF_PLANE_HOST_IP"):
        return os.environ["WDRF_PLANE_HOST_IP"]
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr,
                                     struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on this interface
                continue
            ip = ipaddress.IPv4Address(packed[20:24])
            if not (ip.is_loopback or ip.is_link_local or ip.is_multicast
                    or ip.is_unspecified):
                return str(ip)
    return None


def _tls_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def _http_ok(url: str, ctx: ssl.SSLContext | None = None, token: str | None = None) -> bool:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
        return 200 <= int(r.status) < 300


def _tls_dial(port: int, ca: Path) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s, \
            _tls_context(ca).wrap_socket(s, server_hostname="127.0.0.1"):
        return True


class Plane:
    """One control plane in ``workdir`` (logs in ``workdir/logs``)."""

    def __init__(self, workdir: Path, kueue: KueueSettings | None = None, *,
                 visibility: bool = True) -> None:
        self.workdir = workdir.resolve()
        self.logs = self.workdir / "logs"
        self.kueue_settings = kueue or KueueSettings()
        self.token = base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")
        self.ports = {n: free_port() for n in (
            "etcd", "etcd-peer", "apiserver", "kueue-webhook", "kueue-health", "kcm",
            "scheduler", "kwok", "kueue-visibility", "hami", "hami-metrics", "hami-kube-scheduler")}
        self.host_ip = host_ip()
        # why the visibility API is not served ("" when it is)
        self.visibility_missing = "" if self.host_ip else (
            "this machine has no non-loopback IPv4 address for the EndpointSlice of Kueue's "
            "visibility server (validation rejects 127.0.0.0/8); set WDRF_PLANE_HOST_IP")
        if not visibility:
            self.visibility_missing = "not asked for (Plane(visibility=False))"
        # user -> (token, groups): more bearer-token users the apiserver knows (set before
        # start(); e.g. the identity a MultiKueue manager uses on a worker)
        self.extra_tokens: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.server = f"https://127.0.0.1:{self.ports['apiserver']}"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.audit_log = self.workdir / "logs" / "audit.jsonl"
        self.procs: dict[str, Proc] = {}
        self.timings: dict[str, float] = {}
        self._pki: Pki | None = None
        self._bins: dict[str, Path] = {}
        self._kueue_starts = 0
        self._kueue_module: Path | None = None
        self._visibility_ca = VISIBILITY_CERT_DIR / "ca.crt"
        self._visibility_cert_ok = False
        self.hami_plugin: hami.DevicePluginStandIn | None = None

    # ----- construction helpers -------------------------------------------------------------
    @classmethod
    @contextlib.contextmanager
    def temporary(cls, kueue: KueueSettings | None = None, e2e: bool = False,
                  keep: bool = False) -> Iterator[Plane]:
        """Start a plane in a fresh temp dir; stop it (and delete the dir unless ``keep``)."""
        d = Path(tempfile.mkdtemp(prefix="wdrf-plane-"))
        plane = cls(d, kueue)
        try:
            plane.start()
            if e2e:
                plane.start_e2e()
            yield plane
        finally:
            plane.stop()
            if not keep:
                shutil.rmtree(d, ignore_errors=True)

    @property
    def pki(self) -> Pki:
        if self._pki is None:
            raise PlaneError("plane not started")
        return self._pki

    def api_client(self) -> k8s.ApiClient:
        """A new admin (``system:masters``) ApiClient."""
        c: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig))
        return c

    def kueue_module_dir(self) -> Path:
        """Directory of the pinned Kueue module (CRDs, webhook manifests)."""
        if self._kueue_module is None:
            self._kueue_module = go_module_dir("kueue", "sigs.k8s.io/kueue")
        return self._kueue_module

    # ----- whole plane ----------------------------------------------------------------------
    def start(self) -> None:
        """Start etcd, kube-apiserver and Kueue (gate per ``kueue_settings``); bootstrap."""
        t0 = time.monotonic()
        self._bins.update(require_binaries(CORE_BINARIES))
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_etcd(wait=False)  # etcd comes up while the rest is prepared
            self.kueue_module_dir()
            self._pki = make_pki(self.workdir / "pki")
            self._write_kubeconfig()
            (self.workdir / "tokens.csv").write_text(
                f"{self.token},{ADMIN_USER},{ADMIN_USER},system:masters\n" + "".join(
                    f'{tok},{user},{user}' + (f',"{",".join(groups)}"' if groups else "") + "\n"
                    for user, (tok, groups) in self.extra_tokens.items()))
            self._write_metrics_cert()
            if not self.visibility_missing:
                self._visibility_cert()
            self._wait_etcd()
            self.start_apiserver()
            self._bootstrap_kueue_objects()
            self.start_kueue()
            if not self.visibility_missing:
                self._register_visibility_api()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0

    def stop(self) -> None:
        """Stop every process of this plane (reverse start order)."""
        if self.hami_plugin is not None:
            self.hami_plugin.stop()
            self.hami_plugin = None
        for name in reversed(list(self.procs)):
            self.procs[name].stop()

    def __enter__(self) -> Plane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs_tail(self, lines: int = 30) -> str:
        """The log tails of all processes, for failure reports."""
        return "\n".join(
            f"----- {n} ({'running' if p.alive() else 'stopped'}; {p.log_path}) -----\n"
            f"{p.tail(lines)}" for n, p in self.procs.items())

    def peak_rss_kb(self) -> dict[str, int]:
        """Peak resident memory (VmHWM, KiB) per process seen so far."""
        return {n: p.sample_rss() for n, p in self.procs.items()}

    def check_alive(self) -> None:
        """Raise :class:`PlaneError` if a started process has died unexpectedly."""
        for p in self.procs.values():
            p.check()

    # ----- etcd / apiserver -----------------------------------------------------------------
    def start_etcd(self, wait: bool = True) -> None:
        """Start etcd (data kept across restarts); with ``wait`` until it is healthy."""
        c, peer = self.ports["etcd"], self.ports["etcd-peer"]
        argv = [
            str(self._bins["etcd"]), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{c}",
            f"--advertise-client-urls=http://127.0.0.1:{c}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level=warn",
        ]
        self._spawn("etcd", argv)
        if wait:
            self._wait_etcd()

    def _wait_etcd(self) -> None:
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{self.ports['etcd']}/health"
        wait_until("etcd /health", lambda: _http_ok(url), 30, [self.procs["etcd"]])
        self.timings["etcd"] = time.monotonic() - t0

    def start_apiserver(self) -> None:
        """Start kube-apiserver and wait for ``/readyz``."""
        pki = self.pki
        argv = [
            str(self._bins["kube-apiserver"]),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--cert-dir={self.workdir / 'apiserver'}",
            f"--tls-cert-file={pki.serving_crt}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_crt}",
            f"--secure-port={self.ports['apiserver']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_key}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--authorization-mode=RBAC",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            # The aggregation layer (Kueue's visibility API): the client certificate it shows
            # extension servers, the CA and name they trust it by (published in ConfigMap
            # kube-system/extension-apiserver-authentication), and routing to the Service's
            # EndpointSlice instead of its ClusterIP (nothing here routes ClusterIPs).
            f"--proxy-client-cert-file={pki.front_proxy_crt}",
            f"--proxy-client-key-file={pki.front_proxy_key}",
            f"--requestheader-client-ca-file={pki.front_proxy_ca_crt}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-uid-headers=X-Remote-Uid",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--enable-aggregator-routing=true",
            "--allow-privileged=true",
            # Like envtest: pods need no ServiceAccount object (no controller-manager here).
            "--disable-admission-plugins=ServiceAccount",
            # 127.0.0.1 is not a valid Endpoints address; nothing in-cluster needs the service.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            f"--audit-policy-file={self._audit_policy()}",
            f"--audit-log-path={self.audit_log}", "--audit-log-format=json",
            "--audit-log-mode=blocking", "--audit-log-maxsize=1000",
        ]
        p = self._spawn("kube-apiserver", argv)
        t0 = time.monotonic()
        ctx = _tls_context(pki.ca_crt)
        wait_until("kube-apiserver /readyz",
                   lambda: _http_ok(f"{self.server}/readyz", ctx, self.token), 90,
                   [p, self.procs["etcd"]], interval=0.2)
        self.timings["apiserver"] = time.monotonic() - t0

    def _audit_policy(self) -> Path:
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        return path

    def audit_events(self, user_agent_prefix: str = "") -> list[dict[str, Any]]:
        """Audit events so far (optionally only those whose userAgent starts with the
        prefix), in the order the apiserver logged them."""
        return [e for e in read_audit_log(self.audit_log)
                if str(e.get("userAgent", "")).startswith(user_agent_prefix)]

    def stop_apiserver(self, grace: float = 3.0) -> None:
        """Stop kube-apiserver (SIGTERM, SIGKILL after ``grace`` s); etcd and Kueue keep running.
        Start it again (same port, same data) with :meth:`start_apiserver`."""
        self.procs["kube-apiserver"].stop(grace=grace)

    # ----- Kueue ----------------------------------------------------------------------------
    def kueue_config(self, settings: KueueSettings | None = None) -> dict[str, Any]:
        """The Kueue manager configuration (as stored in the ConfigMap) for ``settings``."""
        s = settings or self.kueue_settings
        gates = {"PriorityBoost": s.priority_boost,
                 "VisibilityOnDemand": not self.visibility_missing}
        gates.update(s.feature_gates)
        cfg: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['kueue-health']}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": self.ports["kueue-webhook"],
                        "certDir": str(self.workdir / "kueue-certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", KUEUE_NAMESPACE]}]},
            "clientConnection": {"qps": 300, "burst": 500},
            "integrations": {"frameworks": list(s.frameworks)},
            "featureGates": gates,
        }
        if gates["VisibilityOnDemand"] and self.host_ip:
            cfg["visibilityServer"] = {"bindAddress": self.host_ip,
                                       "bindPort": self.ports["kueue-visibility"]}
        cfg.update(copy.deepcopy(dict(s.extra)))
        return cfg

    def start_kueue(self, settings: KueueSettings | None = None) -> None:
        """Start Kueue's manager (with ``settings`` if given); update the ConfigMap; wait ready."""
        if settings is not None:
            self.kueue_settings = settings
        if "kueue" in self.procs and self.procs["kueue"].alive():
            raise PlaneError("Kueue is already running; call stop_kueue() first")
        cfg = self.kueue_config()
        self._kueue_starts += 1
        path = self.workdir / f"kueue-config-{self._kueue_starts}.yaml"
        text = yaml.safe_dump(cfg, sort_keys=False)
        path.write_text(text)
        self._apply(self._configmap(text))
        certs = self.workdir / "kueue-certs"
        certs.mkdir(exist_ok=True)
        shutil.copy(self.pki.serving_crt, certs / "tls.crt")
        shutil.copy(self.pki.serving_key, certs / "tls.key")
        if cfg["featureGates"]["VisibilityOnDemand"]:
            self._visibility_cert()
        # --kubeconfig, not only $KUBECONFIG: the visibility server's delegated authentication
        # and authorization read the file named by that flag (else the in-cluster config).
        argv = [str(self._bins["kueue"]), f"--config={path}", f"--kubeconfig={self.kubeconfig}"]
        p = self._spawn("kueue", argv, env={"KUBECONFIG": str(self.kubeconfig)})
        t0 = time.monotonic()
        health = f"http://127.0.0.1:{self.ports['kueue-health']}/readyz"
        wait_until("Kueue health endpoint", lambda: _http_ok(health), 60, [p], interval=0.2)
        wait_until("Kueue webhook TLS port",
                   lambda: _tls_dial(self.ports["kueue-webhook"], self.pki.ca_crt), 30, [p])
        self.timings["kueue"] = time.monotonic() - t0
        if cfg["featureGates"]["VisibilityOnDemand"] and self.host_ip:
            t0 = time.monotonic()
            url = f"https://{self.host_ip}:{self.ports['kueue-visibility']}/readyz"
            ctx = _tls_context(self._visibility_ca)
            ctx.check_hostname = False  # verified by the CA; the name is the Service's
            wait_until("Kueue visibility server /readyz", lambda: _http_ok(url, ctx), 60, [p],
                       interval=0.1)
            self.timings["kueue-visibility"] = time.monotonic() - t0

    def stop_kueue(self) -> None:
        """Stop Kueue's manager (its webhooks then fail closed, as on a real cluster)."""
        if "kueue" in self.procs:
            self.procs["kueue"].stop()

    def restart_kueue(self, settings: KueueSettings | None = None, **changes: Any) -> None:
        """Stop Kueue and start it again, e.g. ``restart_kueue(priority_boost=False)``."""
        s = settings or self.kueue_settings
        if changes:
            s = replace(s, **changes)
        self.stop_kueue()
        self.start_kueue(s)

    @contextlib.contextmanager
    def kueue_configured(self, **changes: Any) -> Iterator[None]:
        """Run a block with Kueue restarted under changed settings, then restore the old ones."""
        old = self.kueue_settings
        self.restart_kueue(**changes)
        try:
            yield
        finally:
            self.restart_kueue(old)

    # ----- Kueue's visibility API ------------------------------------------------------------
    def _visibility_cert(self) -> None:
        """Make sure Kueue's visibility certificate is in place (once per plane)."""
        if self._visibility_cert_ok:
            return
        try:
            self._visibility_ca = shared_serving_cert(VISIBILITY_CERT_DIR, (VISIBILITY_DNS,))
        except OSError as e:
            raise PlaneError(f"what is missing: write access to {VISIBILITY_CERT_DIR} (Kueue "
                             f"reads its visibility server's certificate from there when "
                             f"internal cert management is off): {e}") from e
        self._visibility_cert_ok = True

    def _register_visibility_api(self) -> None:
        """Service + EndpointSlice to Kueue's visibility server, and Kueue's APIServices
        (from its module, with the CA instead of insecureSkipTLSVerify); wait until served."""
        t0 = time.monotonic()
        assert self.host_ip is not None
        self._apply({"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": VISIBILITY_SERVICE, "namespace": KUEUE_NAMESPACE}, "spec": {
            "ports": [{"name": "https", "port": 443, "protocol": "TCP",
                       "targetPort": self.ports["kueue-visibility"]}]}})
        self._apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {
            "name": VISIBILITY_SERVICE, "namespace": KUEUE_NAMESPACE, "labels": {
                "kubernetes.io/service-name": VISIBILITY_SERVICE,
                "endpointslice.kubernetes.io/managed-by": FIELD_MANAGER}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.host_ip], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.ports["kueue-visibility"],
                       "protocol": "TCP"}]})
        ca = base64.b64encode(self._visibility_ca.read_bytes()).decode()
        mod = self.kueue_module_dir() / "config" / "components" / "visibility"
        for version in VISIBILITY_VERSIONS:
            svc = load_yaml_docs(mod / f"apiservice_{version}.yaml")[0]
            svc = copy.deepcopy(svc)
            svc["spec"].pop("insecureSkipTLSVerify", None)
            svc["spec"]["caBundle"] = ca
            svc["spec"]["service"] = {"name": VISIBILITY_SERVICE, "namespace": KUEUE_NAMESPACE,
                                      "port": 443}
            self._apply(svc)
        self.wait_visibility()
        self.timings["visibility-api"] = time.monotonic() - t0

    def wait_visibility(self, timeout: float = 60) -> None:
        """Wait until the apiserver serves every visibility version (its APIServices are
        Available), e.g. after a Kueue restart; PlaneError when the plane cannot serve it."""
        if self.visibility_missing:
            raise PlaneError(f"Kueue's visibility API is not served: {self.visibility_missing}")

        def served() -> bool:
            for v in VISIBILITY_VERSIONS:
                try:
                    self.request("GET", f"/apis/{VISIBILITY_GROUP}/{v}")
                except PlaneError:
                    return False
            return True

        wait_until("visibility.kueue.x-k8s.io served by kube-apiserver", served, timeout,
                   [self.procs["kube-apiserver"], self.procs["kueue"]], interval=0.1)

    # ----- end-to-end extras ----------------------------------------------------------------
    def start_e2e(self) -> None:
        """Start kube-controller-manager, kube-scheduler and kwok (idempotent)."""
        self._bins.update(require_binaries(E2E_BINARIES))
        t0 = time.monotonic()
        kc = f"--kubeconfig={self.kubeconfig}"
        common = [kc, "--leader-elect=false", "--bind-address=127.0.0.1"]
        if not self._running("kube-controller-manager"):
            self._spawn("kube-controller-manager", [
                str(self._bins["kube-controller-manager"]), *common,
                f"--secure-port={self.ports['kcm']}", f"--controllers={KCM_CONTROLLERS}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_crt}", "--use-service-account-credentials=false",
            ])
        if not self._running("kube-scheduler"):
            self._spawn("kube-scheduler", [
                str(self._bins["kube-scheduler"]), *common,
                f"--secure-port={self.ports['scheduler']}"])
        if not self._running("kwok"):
            self._spawn("kwok", [str(self._bins["kwok"]), *self._kwok_args()])
        procs = [self.procs[n] for n in E2E_BINARIES]
        ctx = ssl._create_unverified_context()  # their self-signed serving certs
        for name, port in (("kube-controller-manager", "kcm"), ("kube-scheduler", "scheduler")):
            wait_until(f"{name} /healthz",
                       lambda port=port: _http_ok(  # type: ignore[misc]
                           f"https://127.0.0.1:{self.ports[port]}/healthz", ctx), 60, procs)
        wait_until("kwok /healthz",
                   lambda: _http_ok(f"http://127.0.0.1:{self.ports['kwok']}/healthz"), 60, procs)
        self.timings["e2e"] = time.monotonic() - t0

    def start_hami(self) -> None:
        """Start HAMi as its chart runs it, on top of :meth:`start_e2e` (idempotent):
        hami-scheduler (extender + webhook), its MutatingWebhookConfiguration, a kube-scheduler
        with the ``hami-scheduler`` profile, and the device plugin's stand-in
        (:mod:`tests.support.hami`)."""
        self.start_e2e()
        self._bins.update(require_binaries(HAMI_BINARIES))
        t0 = time.monotonic()
        d = self.workdir / "hami"
        d.mkdir(exist_ok=True)
        if not self._running("hami-scheduler"):
            dev = d / "device-config.yaml"
            dev.write_text(yaml.safe_dump(hami.DEVICE_CONFIG, sort_keys=False))
            self._spawn("hami-scheduler", [
                str(self._bins["hami-scheduler"]), *hami.scheduler_args(self, str(dev))],
                env={"KUBECONFIG": str(self.kubeconfig), "POD_NAME": "hami-scheduler",
                     "POD_NAMESPACE": "kube-system"})
        ctx = _tls_context(self.pki.ca_crt)
        wait_until("hami-scheduler /healthz", lambda: _http_ok(
            f"https://127.0.0.1:{self.ports['hami']}/healthz", ctx), 60,
            [self.procs["hami-scheduler"]])
        self.request("PATCH", "/apis/admissionregistration.k8s.io/v1/"
                     "mutatingwebhookconfigurations/hami-webhook",
                     hami.webhook_configuration(self), "application/apply-patch+yaml",
                     {"fieldManager": FIELD_MANAGER, "force": "true"})
        if not self._running("hami-kube-scheduler"):
            cfg = d / "kube-scheduler.yaml"
            cfg.write_text(yaml.safe_dump(hami.kube_scheduler_config(self), sort_keys=False))
            self._spawn("hami-kube-scheduler", [
                str(self._bins["kube-scheduler"]), f"--config={cfg}",
                "--bind-address=127.0.0.1", f"--secure-port={self.ports['hami-kube-scheduler']}"])
        unverified = ssl._create_unverified_context()  # its self-signed serving cert
        wait_until("kube-scheduler (hami-scheduler profile) /healthz", lambda: _http_ok(
            f"https://127.0.0.1:{self.ports['hami-kube-scheduler']}/healthz", unverified), 60,
            [self.procs["hami-kube-scheduler"]])
        if self.hami_plugin is None:
            self.hami_plugin = hami.DevicePluginStandIn(self)
            self.hami_plugin.start()
        self.timings["hami"] = time.monotonic() - t0

    def _kwok_args(self) -> list[str]:
        kwok_dir = go_module_dir("kwok", "sigs.k8s.io/kwok")
        args = [f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds=40", "--cidr=10.244.0.1/16",
                "--node-ip=127.0.0.1", f"--server-address=127.0.0.1:{self.ports['kwok']}"]
        for stage_dir in KWOK_STAGES:
            for f in sorted((kwok_dir / stage_dir).glob("*.yaml")):
                if f.name != "kustomization.yaml":
                    args.append(f"--config={f}")
        return args

    # ----- internals ------------------------------------------------------------------------
    def _running(self, name: str) -> bool:
        return name in self.procs and self.procs[name].alive()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(name, argv, self.logs / f"{name}.log", env)
        self.procs.pop(name, None)
        self.procs[name] = p
        p.start()
        return p

    def _write_kubeconfig(self) -> None:
        kc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "wdrf-test",
            "clusters": [{"name": "wdrf-test", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki.ca_crt)}}],
            "users": [{"name": ADMIN_USER, "user": {"token": self.token}}],
            "contexts": [{"name": "wdrf-test", "context": {
                "cluster": "wdrf-test", "user": ADMIN_USER}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(kc, sort_keys=False))

    def _write_metrics_cert(self) -> None:
        try:
            METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.pki.serving_crt, METRICS_CERT_DIR / "tls.crt")
            shutil.copy(self.pki.serving_key, METRICS_CERT_DIR / "tls.key")
        except OSError as e:
            raise PlaneError(f"what is missing: write access to {METRICS_CERT_DIR} (Kueue reads "
                             f"its metrics certificate from there when internal cert "
                             f"management is off): {e}") from e

    def _configmap(self, text: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": KUEUE_CONFIGMAP, "namespace": KUEUE_NAMESPACE},
                "data": {KUEUE_CONFIG_KEY: text}}

    def _webhook_url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.ports['kueue-webhook']}{path}"

    def _bootstrap_kueue_objects(self) -> None:
        t0 = time.monotonic()
        self._apply({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": KUEUE_NAMESPACE}})
        ca = base64.b64encode(self.pki.ca_pem).decode()
        mod = self.kueue_module_dir() / "config" / "components"
        names = []
        for f in sorted((mod / "crd" / "bases").glob("*.yaml")):
            crd = load_yaml_docs(f)[0]
            if crd["metadata"]["name"] in CONVERTED_CRDS:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": self._webhook_url("/convert"), "caBundle": ca}}}
            self._apply(crd)
            names.append(crd["metadata"]["name"])
        for doc in load_yaml_docs(mod / "webhook" / "manifests.yaml"):
            self._apply(self._rewrite_webhooks(doc, ca))
        wait_until("Kueue CRDs established", lambda: all(
            self._crd_established(n) for n in names), 60, [self.procs["kube-apiserver"]])
        self.timings["bootstrap"] = time.monotonic() - t0

    def _rewrite_webhooks(self, doc: dict[str, Any], ca: str) -> dict[str, Any]:
        doc = copy.deepcopy(doc)
        framework_selector = {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", KUEUE_NAMESPACE]}]}
        for wh in doc.get("webhooks", []):
            path = wh["clientConfig"]["service"]["path"]
            wh["clientConfig"] = {"url": self._webhook_url(path), "caBundle": ca}
            groups = {g for r in wh.get("rules", []) for g in r.get("apiGroups", [])}
            if "kueue.x-k8s.io" not in groups:  # as Kueue's kustomization does
                wh["namespaceSelector"] = framework_selector
        return doc

    def _crd_established(self, name: str) -> bool:
        crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in crd.get("status", {}).get("conditions", []))

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json",
                query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Raw admin REST call (JSON in/out) via urllib; raises PlaneError on HTTP errors."""
        url = self.server + path
        if query:
            url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=60,
                                        context=_tls_context(self.pki.ca_crt)) as r:
                out: dict[str, Any] = json.loads(r.read() or b"{}")
                return out
        except urllib.error.HTTPError as e:
            raise PlaneError(f"{method} {path}: HTTP {e.code}: {e.read().decode()[:2000]}") from e

    def _apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (force) of a namespace, ConfigMap, CRD, webhook configuration,
        Service, EndpointSlice or APIService."""
        kind = obj["kind"]
        name = obj["metadata"]["name"]
        paths = {
            "Namespace": f"/api/v1/namespaces/{name}",
            "ConfigMap": f"/api/v1/namespaces/{obj['metadata'].get('namespace')}/configmaps/{name}",
            "CustomResourceDefinition":
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
            "MutatingWebhookConfiguration":
                f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}",
            "ValidatingWebhookConfiguration":
                f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}",
            "Service": f"/api/v1/namespaces/{obj['metadata'].get('namespace')}/services/{name}",
            "EndpointSlice": f"/apis/discovery.k8s.io/v1/namespaces/"
                             f"{obj['metadata'].get('namespace')}/endpointslices/{name}",
            "APIService": f"/apis/apiregistration.k8s.io/v1/apiservices/{name}",
        }
        return self.request("PATCH", paths[kind], obj, "application/apply-patch+yaml",
                            {"fieldManager": FIELD_MANAGER, "force": "true"})
