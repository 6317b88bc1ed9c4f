"""`python -m controller reset`: undo what the controller wrote on Workloads.

For every Workload (all namespaces, or `--namespace`):

* removes the annotations only the controller writes: `kueue.x-k8s.io/priority-boost`,
  `wdrf.x-k8s.io/base-priority`, `wdrf.x-k8s.io/applied-priority`,
  `wdrf.x-k8s.io/priority-terms`;
* spec mode (a `base-priority` annotation is present): puts `spec.priority` back to that base,
  unless `spec.priority` is neither the value the controller applied nor the base (then someone
  else - Kueue's WorkloadPriorityClass controller, an admin - set it since, and it stays).

One minimal JSON patch per Workload that has something to undo: a `test` of each value it
relies on, then `remove` / `replace` ops. A conflict (the Workload changed under it) is re-read
and retried. Dry run by default: prints what it would do; `--yes` writes. User annotations
(classes, override, scheduling policy, GPU fraction) and the HAMi settings on Jobs are left
alone: HAMi reads those only when pods are created.

Run it after the controller is stopped (`kubectl delete -k manifests/` or `helm uninstall`),
or it writes everything back on its next cycle: reset checks the controller's Lease and
refuses while it is held and fresh, unless `--force`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click

from controller import __version__
from controller.live.api import JSON_PATCH
from controller.render import machine, output_option
from controller.why import (
    Api,
    WhyError,
    _api_failure,
    _kube_opts,
    _transport,
    kueue_version,
    status_of,
    why_cmd,
)
from controller.workload import UndoPatch, undo_patch


@dataclass
class Undo(UndoPatch):
    """One Workload's undo (`controller.workload.undo_patch`) and what became of it."""

    result: str = "planned"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def summary(self) -> str:
        parts = []
        if self.remove:
            parts.append("remove " + ", ".join(self.remove))
        if self.priority_to is not None:
            parts.append(f"spec.priority {self.priority_from} -> {self.priority_to} (base)")
        if self.kept_priority:
            parts.append(self.kept_priority)
        return f"{self.key}: " + "; ".join(parts)


def plan_undo(wl: dict[str, Any]) -> Undo | None:
    """The JSON patch that undoes the controller's writes on one Workload (None: nothing)."""
    p = undo_patch(wl)
    if p is None:
        return None
    return Undo(p.namespace, p.name, p.remove, p.priority_from, p.priority_to, p.kept_priority,
                p.ops)


def _workloads(api: Api, version: str, namespace: str | None) -> list[dict[str, Any]]:
    where = f"namespaces/{namespace}/" if namespace else ""
    path = f"/apis/kueue.x-k8s.io/{version}/{where}workloads"
    items: list[dict[str, Any]] = []
    query: dict[str, str] = {"limit": "500"}
    while True:
        try:
            doc = api.request("GET", path, query=query) or {}
        except Exception as exc:
            if status_of(exc) == 403:
                scope = f"in namespace {namespace}" if namespace else "in all namespaces"
                raise WhyError(f"not allowed to list workloads {scope}: reset needs an admin "
                               "(list and patch workloads.kueue.x-k8s.io)") from None
            raise
        items.extend(doc.get("items") or [])
        cont = (doc.get("metadata") or {}).get("continue")
        if not cont:
            return items
        query = {"limit": "500", "continue": cont}


def controller_running(api: Api, namespace: str, lease: str, now: datetime) -> str:
    """A sentence when the controller's Lease is held and renewed recently, else ""."""
    try:
        obj = api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}"
                                 f"/leases/{lease}")
    except Exception as exc:
        if status_of(exc) in (404, 403, 401):
            return ""
        raise
    spec = (obj or {}).get("spec") or {}
    holder = spec.get("holderIdentity")
    renew = spec.get("renewTime")
    if not holder or not isinstance(renew, str):
        return ""
    try:
        renewed = datetime.fromisoformat(renew.replace("Z", "+00:00"))
    except ValueError:
        return ""
    age = (now - renewed).total_seconds()
    duration = float(spec.get("leaseDurationSeconds") or 15)
    if age > 2 * duration:
        return ""
    return (f"the controller is running (Lease {namespace}/{lease} held by {holder}, renewed "
            f"{max(age, 0):.0f} s ago): it would write everything back; uninstall it or scale "
            "it to 0 first (or pass --force)")


def reset(api: Api, *, namespace: str | None = None, write: bool = False,
          force: bool = False, controller_namespace: str = "kueue-system",
          lease: str = "wdrf-controller", now: datetime | None = None) -> list[Undo]:
    """Plan (and with `write`, apply) the undo of every Workload. Raises WhyError with a
    one-line reason when it cannot."""
    version = kueue_version(api)
    if write and not force:
        running = controller_running(api, controller_namespace, lease, now or datetime.now(UTC))
        if running:
            raise WhyError(running)
    undos = [u for wl in _workloads(api, version, namespace)
             if (u := plan_undo(wl)) is not None]
    undos.sort(key=lambda u: u.key)
    if write:
        for undo in undos:
            _apply(api, version, undo)
    return undos


def _apply(api: Api, version: str, undo: Undo, attempts: int = 3) -> None:
    path = f"/apis/kueue.x-k8s.io/{version}/namespaces/{undo.namespace}/workloads/{undo.name}"
    current = undo
    for _ in range(attempts):
        try:
            api.request("PATCH", path, body=current.ops,
                        content_type=JSON_PATCH)
            undo.result = "done"
            return
        except Exception as exc:
            code = status_of(exc)
            if code == 404:
                undo.result = "gone"
                return
            if code not in (409, 422):  # a failed `test` is 422 Invalid on kube-apiserver
                undo.result = f"failed: {exc}"
                return
        try:
            wl = api.request("GET", path)
        except Exception as exc:
            undo.result = "gone" if status_of(exc) == 404 else f"failed: {exc}"
            return
        fresh = plan_undo(wl or {})
        if fresh is None:
            undo.result = "done (already clean)"
            return
        current = fresh
    undo.result = "failed: the Workload kept changing (conflicts)"


def render(undos: Iterable[Undo], write: bool) -> str:
    undos = list(undos)
    lines = [u.summary() + ("" if not write else f"  [{u.result}]") for u in undos]
    restored = sum(1 for u in undos if u.priority_to is not None)
    if write:
        failed = sum(1 for u in undos if u.result.startswith("failed"))
        lines.append(f"reset {len(undos) - failed} of {len(undos)} Workloads "
                     f"({restored} spec.priority restored); {failed} failed")
    else:
        lines.append(f"dry run: {len(undos)} Workloads to reset ({restored} spec.priority to "
                     "restore); nothing written - run again with --yes to write")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line


@click.command("reset")
@click.option("--yes", "write", is_flag=True,
              help="Write the changes (default: dry run, print what would change).")
@click.option("-n", "--namespace", default=None, help="Only this namespace (default: all).")
@click.option("--force", is_flag=True,
              help="Write even while the controller's Lease is held (it will write back).")
@click.option("--controller-namespace", default="kueue-system", show_default=True,
              help="Namespace of the controller's Lease.")
@click.option("--lease", default="wdrf-controller", show_default=True,
              help="Name of the controller's Lease.")
@output_option
@_kube_opts
def reset_cmd(write: bool, namespace: str | None, force: bool, controller_namespace: str,
              lease: str, output: str, kubeconfig: str | None, context: str | None) -> None:
    """Remove every priority annotation the controller wrote on Workloads and restore
    spec.priority to the base (spec mode). Dry run unless --yes."""
    try:
        undos = reset(_transport(kubeconfig, context), namespace=namespace, write=write,
                      force=force, controller_namespace=controller_namespace, lease=lease)
    except WhyError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except Exception as exc:  # one clear line, no traceback
        if hasattr(exc, "status"):
            click.echo(f"error: {_api_failure(exc)}", err=True)
            sys.exit(1)
        raise
    if output in ("json", "yaml"):
        click.echo(machine([{"workload": u.key, "remove": u.remove,
                             "priorityFrom": u.priority_from, "priorityTo": u.priority_to,
                             "keptPriority": u.kept_priority, "result": u.result}
                            for u in undos], output))
    else:
        click.echo(render(undos, write))
    if any(u.result.startswith("failed") for u in undos):
        sys.exit(1)


@click.group("kubectl-wdrf", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="kubectl-wdrf")
def kubectl_plugin() -> None:
    """kubectl plugin (installed as the `kubectl-wdrf` command): `kubectl wdrf why NAME`,
    `kubectl wdrf reset`."""


kubectl_plugin.add_command(why_cmd)
kubectl_plugin.add_command(reset_cmd)
