"""Health of the controller: the probes of a running replica, and `--health-check`.

Probes (`Probes`, served by the metrics HTTP server on /healthz and /readyz):

* /healthz (liveness, and the startupProbe): 503 until the first cycle has completed
  ("starting"), then 200 while the control loop made progress within `stale_after`. The
  Deployment's startupProbe bounds the first cycle; liveness only applies after it.
* /readyz: 200 when start-up discovery is done, every cache has synced, and the Workload and
  ClusterQueue caches are younger than CACHE_MAX_STALENESS; 503 with the reason otherwise.
  While not ready for staleness, the leader also pauses its writes (see the runner).

`python -m controller --health-check`: can this controller run against this cluster?
Checks, in order: the apiserver answers; Kueue's API is served (v1beta2, else v1beta1) with
the resources the controller reads; for every permission in `controller.live.rbac`, a
SelfSubjectAccessReview says it is allowed; and which priority mode `auto` would pick. With
MULTIKUEUE_MANAGER_KUBECONFIG, also that the manager answers and allows its reads there.
Prints one line per check and exits non-zero if any required check fails.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.config import Settings
from controller.live.api import SELF_SUBJECT_ACCESS_REVIEWS, ApiError, Transport
from controller.live.discovery import (
    NEEDED_RESOURCES,
    KueueNotServed,
    choose_kueue_version,
    read_priority_boost_gate,
    resolve_mode,
    served_resources,
    served_versions,
)
from controller.live.metrics import Health
from controller.live.rbac import Permission, manager_permissions, permissions

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass(frozen=True, slots=True)
class Check:
    status: str
    name: str
    detail: str = ""

    def line(self) -> str:
        return f"[{self.status:<4}] {self.name}" + (f": {self.detail}" if self.detail else "")


def check_apiserver(t: Transport) -> Check:
    try:
        version = t.request("GET", "/version", timeout=10)
    except ApiError as e:
        return Check(FAIL, "apiserver reachable", str(e))
    return Check(OK, "apiserver reachable", str((version or {}).get("gitVersion", "?")))


def check_kueue(t: Transport) -> list[Check]:
    try:
        versions = served_versions(t, "kueue.x-k8s.io")
        chosen = choose_kueue_version(versions)
    except KueueNotServed as e:
        return [Check(FAIL, "Kueue API served", str(e))]
    except ApiError as e:
        return [Check(FAIL, "Kueue API served", str(e))]
    checks = [Check(OK, "Kueue API served",
                    f"using {chosen.value} (served: {', '.join(versions)})")]
    if chosen.value.endswith("v1beta1"):
        checks.append(Check(WARN, "Kueue API version",
                            "v1beta2 not served: Kueue older than v0.15; v1beta1 fallback"))
    try:
        have = served_resources(t, chosen.value)
    except ApiError as e:
        return [*checks, Check(FAIL, "Kueue resources", str(e))]
    missing = [r for r in NEEDED_RESOURCES if r not in have]
    checks.append(
        Check(FAIL, "Kueue resources", f"missing: {', '.join(missing)}") if missing
        else Check(OK, "Kueue resources", ", ".join(NEEDED_RESOURCES))
    )
    return checks


def access_review(t: Transport, p: Permission) -> tuple[bool, str]:
    attrs: dict[str, str] = {"verb": p.verb, "group": p.group, "resource": p.resource}
    if p.namespace:
        attrs["namespace"] = p.namespace
    if p.name:
        attrs["name"] = p.name
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs},
    }
    answer = t.request("POST", SELF_SUBJECT_ACCESS_REVIEWS.collection(), body=body)
    status = (answer or {}).get("status") or {}
    return bool(status.get("allowed")), str(status.get("reason") or "")


def check_rbac(t: Transport, settings: Settings) -> list[Check]:
    return [_review(t, p, "RBAC") for p in permissions(settings)]


def _review(t: Transport, p: Permission, prefix: str) -> Check:
    try:
        allowed, reason = access_review(t, p)
    except ApiError as e:
        return Check(FAIL, f"{prefix} {p.describe()}", f"review failed: {e}")
    if allowed:
        return Check(OK, f"{prefix} {p.describe()}")
    return Check(FAIL if p.required else WARN, f"{prefix} {p.describe()}",
                 f"denied ({p.why}){': ' + reason if reason else ''}")


def check_manager(m: Transport, settings: Settings) -> list[Check]:
    """A MultiKueue worker's controller: the manager answers and lets it read what it reads
    there (`manager_permissions`)."""
    reach = check_apiserver(m)
    first = Check(reach.status, "MultiKueue manager reachable", reach.detail)
    if first.status == FAIL:
        return [first]
    return [first, *(_review(m, p, "manager RBAC") for p in manager_permissions(settings))]


class Probes(Health):
    """Liveness/startup and readiness of a running replica (see the module docstring)."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stale_after, clock)
        self._cycled = False
        self._stale: tuple[str, ...] = ()

    def beat(self) -> None:
        self._cycled = True
        super().beat()

    def set_stale(self, stale: tuple[str, ...]) -> None:
        """The caches (e.g. "workloads 130s") that are older than the bound; () = fresh."""
        self._stale = stale

    @property
    def stale(self) -> tuple[str, ...]:
        return self._stale

    def alive(self) -> tuple[bool, str]:
        if not self._cycled:
            return False, "starting: the first cycle has not completed"
        return super().alive()

    def ready(self) -> tuple[bool, str]:
        ok, why = super().ready()
        if ok and self._stale:
            return False, "stale cache: " + ", ".join(self._stale) + " (writes paused)"
        return ok, why


def check_mode(t: Transport, settings: Settings) -> Check:
    try:
        gate, where = read_priority_boost_gate(t, settings.kueue_namespace)
    except ApiError as e:
        return Check(WARN, "priority mode",
                     f"cannot read Kueue's configuration ({e}); the controller would retry "
                     "and keep the mode recorded on its Lease")
    choice = resolve_mode(settings.priority_mode, gate, where)
    status = WARN if "WARNING" in choice.reason else OK
    return Check(status, "priority mode", f"{choice.mode.value}: {choice.reason}")


def health_checks(t: Transport, settings: Settings,
                  manager: Transport | None = None) -> list[Check]:
    first = check_apiserver(t)
    if first.status == FAIL:
        return [first]
    checks = [first, *check_kueue(t), *check_rbac(t, settings), check_mode(t, settings)]
    return [*checks, *check_manager(manager, settings)] if manager is not None else checks


def report(checks: list[Check]) -> tuple[str, int]:
    failed = sum(1 for c in checks if c.status == FAIL)
    warned = sum(1 for c in checks if c.status == WARN)
    lines = [c.line() for c in checks]
    lines.append(
        f"{'UNHEALTHY' if failed else 'HEALTHY'}: {len(checks)} checks, "
        f"{failed} failed, {warned} warnings"
    )
    return "\n".join(lines), 1 if failed else 0


def run_health_check(
    settings: Settings,
    transport: Transport | None = None,
    echo: Callable[[str], object] = print,
    manager: Transport | None = None,
) -> int:
    if transport is None:
        try:
            from controller.live.kube import KubeTransport

            transport = KubeTransport.from_config(settings.kubeconfig_path or None,
                                                  settings.kubeconfig_context or None)
        except Exception as e:
            echo(f"[FAIL] Kubernetes client configuration: {e}\nUNHEALTHY")
            return 1
    if manager is None and settings.multikueue_manager_kubeconfig:
        try:
            from controller.live.kube import KubeTransport

            manager = KubeTransport.from_config(settings.multikueue_manager_kubeconfig)
        except Exception as e:
            echo(f"[FAIL] MultiKueue manager client configuration "
                 f"(MULTIKUEUE_MANAGER_KUBECONFIG): {e}\nUNHEALTHY")
            return 1
    text, code = report(health_checks(transport, settings, manager))
    echo(text)
    sys.stdout.flush()
    return code
