"""`python -m controller --health-check`: can this controller run against this cluster?

Checks, in order: the apiserver answers; Kueue's API is served (v1beta2, else v1beta1) with
the resources the controller reads; for every permission in `controller.live.rbac`, a
SelfSubjectAccessReview says it is allowed; and which priority mode `auto` would pick.
Prints one line per check and exits non-zero if any required check fails.
"""

from __future__ import annotations

import sys
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
from controller.live.rbac import Permission, permissions

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
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs},
    }
    answer = t.request("POST", SELF_SUBJECT_ACCESS_REVIEWS.collection(), body=body)
    status = (answer or {}).get("status") or {}
    return bool(status.get("allowed")), str(status.get("reason") or "")


def check_rbac(t: Transport, settings: Settings) -> list[Check]:
    checks: list[Check] = []
    for p in permissions(settings):
        try:
            allowed, reason = access_review(t, p)
        except ApiError as e:
            checks.append(Check(FAIL, f"RBAC {p.describe()}", f"review failed: {e}"))
            continue
        if allowed:
            checks.append(Check(OK, f"RBAC {p.describe()}"))
        else:
            status = FAIL if p.required else WARN
            checks.append(Check(status, f"RBAC {p.describe()}",
                                f"denied ({p.why}){': ' + reason if reason else ''}"))
    return checks


def check_mode(t: Transport, settings: Settings) -> Check:
    gate, where = read_priority_boost_gate(t, settings.kueue_namespace)
    choice = resolve_mode(settings.priority_mode, gate, where)
    status = WARN if "WARNING" in choice.reason else OK
    return Check(status, "priority mode", f"{choice.mode.value}: {choice.reason}")


def health_checks(t: Transport, settings: Settings) -> list[Check]:
    first = check_apiserver(t)
    if first.status == FAIL:
        return [first]
    return [first, *check_kueue(t), *check_rbac(t, settings), check_mode(t, settings)]


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
) -> int:
    if transport is None:
        try:
            from controller.live.kube import KubeTransport

            transport = KubeTransport.from_config(settings.kubeconfig_path or None)
        except Exception as e:
            echo(f"[FAIL] Kubernetes client configuration: {e}\nUNHEALTHY")
            return 1
    text, code = report(health_checks(transport, settings))
    echo(text)
    sys.stdout.flush()
    return code
