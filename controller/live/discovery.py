"""What the cluster serves and how Kueue is configured, read once at start-up.

* Kueue API version: v1beta2 when served, else v1beta1 (group discovery, one request).
* Priority mode `auto`: `boost` when Kueue's `PriorityBoost` feature gate is on, read from
  ConfigMap `kueue-manager-config` (key `controller_manager_config.yaml`, `featureGates`) or
  from the manager Deployment's `--feature-gates` argument; else `spec`.

Only a 404 (the ConfigMap or Deployment does not exist) counts as "does not say"; any other
error (500, 429, 403, timeouts) is raised, so the caller retries and keeps its last known
mode instead of silently switching to spec mode. The leader records the mode it uses in an
annotation on its Lease (`MODE_ANNOTATION`); a replica that cannot read Kueue's configuration
takes the mode from there, so a failover never flips it.

The parsing functions are pure; `read_*` functions do the GETs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from controller.domain import KUEUE_GROUP, KueueApiVersion, QuotaCheck, RequeueTimestamp
from controller.live.api import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    ApiError,
    Resource,
    Transport,
)
from controller.plan import PriorityMode

log = logging.getLogger(__name__)

KUEUE_CONFIG_MAP = "kueue-manager-config"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
KUEUE_DEPLOYMENT = "kueue-controller-manager"
PRIORITY_BOOST_GATE = "PriorityBoost"
NEEDED_RESOURCES = ("workloads", "clusterqueues", "localqueues")
MODE_ANNOTATION = "wdrf.x-k8s.io/priority-mode"


def mode_from_annotation(value: str | None) -> PriorityMode | None:
    """The mode a leader recorded on the Lease (boost or spec); None when absent/invalid."""
    for mode in (PriorityMode.BOOST, PriorityMode.SPEC):
        if value == mode.value:
            return mode
    return None


class KueueNotServed(Exception):
    """Neither kueue.x-k8s.io/v1beta2 nor v1beta1 is served: Kueue is not installed."""


def served_versions(transport: Transport, group: str) -> list[str]:
    try:
        doc = transport.request("GET", f"/apis/{group}")
    except ApiError as e:
        if e.status == 404:
            return []
        raise
    return [str(v.get("version")) for v in (doc or {}).get("versions") or []]


def choose_kueue_version(versions: Iterable[str]) -> KueueApiVersion:
    served = set(versions)
    if "v1beta2" in served:
        return KueueApiVersion.V1BETA2
    if "v1beta1" in served:
        return KueueApiVersion.V1BETA1
    raise KueueNotServed(f"{KUEUE_GROUP}: neither v1beta2 nor v1beta1 is served")


def served_resources(transport: Transport, group_version: str) -> set[str]:
    doc = transport.request("GET", f"/apis/{group_version}")
    return {str(r.get("name")) for r in (doc or {}).get("resources") or []}


def kueue_resource(base: Resource, version: KueueApiVersion) -> Resource:
    return base.with_version(version.value.split("/", 1)[1])


# -- PriorityBoost gate -------------------------------------------------------------------


def _truthy(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def gate_from_manager_config(text: str, gate: str = PRIORITY_BOOST_GATE) -> bool | None:
    """The gate in Kueue's manager configuration YAML; None when it does not say."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(doc, Mapping):
        return None
    gates = doc.get("featureGates")
    if not isinstance(gates, Mapping) or gate not in gates:
        return None
    return _truthy(gates[gate])


def gate_from_args(args: Iterable[str], gate: str = PRIORITY_BOOST_GATE) -> bool | None:
    """The gate in `--feature-gates=A=true,B=false` arguments (the last mention wins)."""
    found: bool | None = None
    items = list(args)
    for i, arg in enumerate(items):
        value = None
        if arg.startswith("--feature-gates="):
            value = arg.split("=", 1)[1]
        elif arg == "--feature-gates" and i + 1 < len(items):
            value = items[i + 1]
        if value is None:
            continue
        for pair in value.split(","):
            name, _, setting = pair.strip().partition("=")
            if name == gate:
                found = _truthy(setting)
    return found


@dataclass(frozen=True, slots=True)
class ModeChoice:
    mode: PriorityMode  # BOOST or SPEC
    gate: bool | None  # what was found about Kueue's PriorityBoost gate (None: unknown)
    reason: str


def resolve_mode(configured: PriorityMode, gate: bool | None, where: str) -> ModeChoice:
    if configured is PriorityMode.BOOST:
        why = "PRIORITY_MODE=boost"
        if gate is False:
            why += f" (WARNING: the PriorityBoost gate is off per {where}; boosts have no effect)"
        return ModeChoice(PriorityMode.BOOST, gate, why)
    if configured is PriorityMode.SPEC:
        return ModeChoice(PriorityMode.SPEC, gate, "PRIORITY_MODE=spec")
    if gate:
        return ModeChoice(PriorityMode.BOOST, gate, f"auto: PriorityBoost gate on ({where})")
    state = "off" if gate is False else "not found"
    return ModeChoice(PriorityMode.SPEC, gate, f"auto: PriorityBoost gate {state} ({where})")


def read_priority_boost_gate(transport: Transport, kueue_namespace: str) -> tuple[bool | None, str]:
    """(gate, where it was read). Kueue's default for the alpha gate is off. Raises
    `ApiError` for anything but a 404: an unreadable configuration is not a gate that is off."""
    where: list[str] = []
    try:
        cm = transport.request("GET", CONFIG_MAPS.item(KUEUE_CONFIG_MAP, kueue_namespace))
        text = ((cm or {}).get("data") or {}).get(KUEUE_CONFIG_KEY)
        if isinstance(text, str):
            found = gate_from_manager_config(text)
            if found is not None:
                return found, f"ConfigMap {kueue_namespace}/{KUEUE_CONFIG_MAP}"
        where.append(f"ConfigMap {kueue_namespace}/{KUEUE_CONFIG_MAP} does not set it")
    except ApiError as e:
        if e.status != 404:
            raise
        where.append(f"ConfigMap {kueue_namespace}/{KUEUE_CONFIG_MAP}: not found")
    try:
        dep = transport.request("GET", DEPLOYMENTS.item(KUEUE_DEPLOYMENT, kueue_namespace))
        containers = (((dep or {}).get("spec") or {}).get("template") or {}).get("spec", {})
        for c in containers.get("containers") or []:
            found = gate_from_args([*(c.get("command") or []), *(c.get("args") or [])])
            if found is not None:
                return found, f"Deployment {kueue_namespace}/{KUEUE_DEPLOYMENT} args"
        where.append(f"Deployment {kueue_namespace}/{KUEUE_DEPLOYMENT} args do not set it")
    except ApiError as e:
        if e.status != 404:
            raise
        where.append(f"Deployment {kueue_namespace}/{KUEUE_DEPLOYMENT}: not found")
    return None, "; ".join(where)


# -- quota check strategy (can a Workload gain a resource its ClusterQueue does not cover?) --


def requeue_timestamp_from_manager_config(doc: object) -> RequeueTimestamp | None:
    """`waitForPodsReady.requeuingStrategy.timestamp` (Eviction | Creation), else None."""
    wfpr = doc.get("waitForPodsReady") if isinstance(doc, Mapping) else None
    strategy = wfpr.get("requeuingStrategy") if isinstance(wfpr, Mapping) else None
    value = strategy.get("timestamp") if isinstance(strategy, Mapping) else None
    if isinstance(value, str) and value.lower() in ("eviction", "creation"):
        return RequeueTimestamp(value.lower())
    return None


def quota_check_from_manager_config(text: str) -> QuotaCheck:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return QuotaCheck()
    requeue = requeue_timestamp_from_manager_config(doc)
    res = doc.get("resources") if isinstance(doc, Mapping) else None
    if not isinstance(res, Mapping):
        return QuotaCheck(requeue_timestamp=requeue)
    inputs = frozenset(
        str(t.get("input")) for t in res.get("transformations") or []
        if isinstance(t, Mapping) and t.get("input")
    )
    prefixes = tuple(str(p) for p in res.get("excludeResourcePrefixes") or [])
    return QuotaCheck(res.get("quotaCheckStrategy") == "IgnoreUndeclared", inputs, prefixes,
                      requeue)


def read_quota_check(transport: Transport, kueue_namespace: str) -> QuotaCheck:
    """From Kueue's manager ConfigMap; Kueue's default (BlockUndeclared) when there is none.
    Raises `ApiError` for anything but a 404 (the caller keeps what it knew)."""
    try:
        cm = transport.request("GET", CONFIG_MAPS.item(KUEUE_CONFIG_MAP, kueue_namespace))
    except ApiError as e:
        if e.status != 404:
            raise
        return QuotaCheck()
    text = ((cm or {}).get("data") or {}).get(KUEUE_CONFIG_KEY)
    return quota_check_from_manager_config(text) if isinstance(text, str) else QuotaCheck()
