"""Per-node GPU inventory: where the controller's GPU capacity comes from.

Pure functions, no Kubernetes client. A Node is read as the plain JSON mapping the API returns
(``{"metadata": {"name": ..., "annotations": {...}}}``). Sources, in order of trust:

1. ``wdrf.x-k8s.io/gpu-inventory``, written by the node agent (``controller.agent``): used when it
   decodes and its timestamp is within ``max_age`` of ``now``; only healthy GPUs count.
2. ``hami.io/node-nvidia-register``, written by HAMi: a JSON array since v2.8 (zero-valued fields
   omitted), a ``UUID,count,devmem,devcore,type,numa,health[,index,mode]:`` list up to v2.7.
3. Neither: ``parse_node_inventory`` returns ``None`` and the caller falls back to ClusterQueue
   quotas (``resolve_gpu_capacity``).

Bad annotations never raise out of ``parse_node_inventory``: each becomes an ``InputProblem``
naming the node and the annotation, and the next source is tried.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from controller.domain import (
    GPU_INVENTORY_ANNOTATION,
    HAMI_NODE_REGISTER_ANNOTATION,
    CapacitySource,
    GpuDevice,
    InputProblem,
    NodeInventory,
    ObjectRef,
)

AGENT_FORMAT_VERSION = 1
DEFAULT_MAX_AGE = timedelta(minutes=15)
MIB = 1024 * 1024


class InventoryFormatError(ValueError):
    """An annotation that does not decode; ``field`` is the path inside it that is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.detail = message


# --------------------------------------------------------------------------- agent format


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device carved out of a physical GPU."""

    uuid: str
    profile: str  # e.g. "1g.10gb"; "" when NVML did not say
    memory_mib: int
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True, slots=True)
class AgentGpu:
    """One physical GPU as the node agent publishes it (capacity facts, no usage)."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = True
    reasons: tuple[str, ...] = ()  # why it is unhealthy; stable strings (no live readings)
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()

    def device(self, split_count: int = 10, cores: int = 100) -> GpuDevice:
        return GpuDevice(
            uuid=self.uuid,
            index=self.index,
            model=self.model,
            memory_mib=self.memory_mib,
            split_count=split_count,
            cores=cores,
            healthy=self.healthy,
        )


@dataclass(frozen=True, slots=True)
class AgentInventory:
    """What the agent writes in ``wdrf.x-k8s.io/gpu-inventory``."""

    observed: datetime
    gpus: tuple[AgentGpu, ...] = ()
    driver: str = ""

    def content_key(self) -> str:
        """The encoding without the timestamp: equal keys mean nothing worth patching changed."""
        return _dumps(_inventory_body(self))


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=True)


def _format_time(ts: datetime) -> str:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _mig_body(m: MigInstance) -> dict[str, Any]:
    out: dict[str, Any] = {"uuid": m.uuid, "profile": m.profile, "memMiB": m.memory_mib}
    if m.gpu_instance is not None:
        out["gi"] = m.gpu_instance
    if m.compute_instance is not None:
        out["ci"] = m.compute_instance
    return out


def _gpu_body(g: AgentGpu) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uuid": g.uuid,
        "index": g.index,
        "model": g.model,
        "memMiB": g.memory_mib,
        "healthy": g.healthy,
    }
    if g.reasons:
        out["reasons"] = list(g.reasons)
    if g.mig_enabled:
        out["mig"] = True
    if g.mig_instances:
        out["migInstances"] = [_mig_body(m) for m in g.mig_instances]
    return out


def _inventory_body(inv: AgentInventory) -> dict[str, Any]:
    body: dict[str, Any] = {
        "v": AGENT_FORMAT_VERSION,
        "gpus": [_gpu_body(g) for g in sorted(inv.gpus, key=lambda g: (g.index, g.uuid))],
    }
    if inv.driver:
        body["driver"] = inv.driver
    return body


def encode_agent_inventory(inv: AgentInventory) -> str:
    """Compact, deterministic JSON for the annotation (keys sorted, GPUs by index)."""
    body = _inventory_body(inv)
    body["observed"] = _format_time(inv.observed)
    return _dumps(body)


def _get(
    obj: Mapping[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    where: str,
    default: Any = None,
    required: bool = False,
) -> Any:
    if key not in obj:
        if required:
            raise InventoryFormatError(f"{where}.{key}", "missing")
        return default
    value = obj[key]
    # bool is an int in Python; never accept it where a number is expected (and vice versa).
    bad_bool = isinstance(value, bool) and bool not in (
        kind if isinstance(kind, tuple) else (kind,)
    )
    if bad_bool or not isinstance(value, kind):
        raise InventoryFormatError(
            f"{where}.{key}", f"wrong type {type(value).__name__}: {value!r}"
        )
    return value


def _non_negative(value: int, where: str) -> int:
    if value < 0:
        raise InventoryFormatError(where, f"negative: {value}")
    return value


def _parse_time(text: str, where: str) -> datetime:
    try:
        ts = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError as e:
        raise InventoryFormatError(where, f"not an RFC 3339 time: {text!r}") from e
    if ts.tzinfo is None:
        raise InventoryFormatError(where, f"time without a zone: {text!r}")
    return ts.astimezone(UTC)


def _decode_mig(raw: Any, where: str) -> MigInstance:
    if not isinstance(raw, dict):
        raise InventoryFormatError(where, f"not an object: {raw!r}")
    gi = _get(raw, "gi", int, where)
    ci = _get(raw, "ci", int, where)
    return MigInstance(
        uuid=_get(raw, "uuid", str, where, required=True),
        profile=_get(raw, "profile", str, where, default=""),
        memory_mib=_non_negative(_get(raw, "memMiB", int, where, default=0), f"{where}.memMiB"),
        gpu_instance=gi,
        compute_instance=ci,
    )


def _decode_gpu(raw: Any, where: str) -> AgentGpu:
    if not isinstance(raw, dict):
        raise InventoryFormatError(where, f"not an object: {raw!r}")
    uuid = _get(raw, "uuid", str, where, required=True)
    if not uuid:
        raise InventoryFormatError(f"{where}.uuid", "empty")
    reasons = _get(raw, "reasons", list, where, default=[])
    if not all(isinstance(r, str) for r in reasons):
        raise InventoryFormatError(f"{where}.reasons", f"not a list of strings: {reasons!r}")
    migs = _get(raw, "migInstances", list, where, default=[])
    return AgentGpu(
        uuid=uuid,
        index=_non_negative(_get(raw, "index", int, where, required=True), f"{where}.index"),
        model=_get(raw, "model", str, where, default=""),
        memory_mib=_non_negative(_get(raw, "memMiB", int, where, default=0), f"{where}.memMiB"),
        healthy=_get(raw, "healthy", bool, where, required=True),
        reasons=tuple(reasons),
        mig_enabled=_get(raw, "mig", bool, where, default=False),
        mig_instances=tuple(
            _decode_mig(m, f"{where}.migInstances[{i}]") for i, m in enumerate(migs)
        ),
    )


def decode_agent_inventory(text: str) -> AgentInventory:
    """Decode the agent annotation; raises ``InventoryFormatError`` naming the bad field."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InventoryFormatError("", f"not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise InventoryFormatError("", f"not a JSON object: {type(raw).__name__}")
    version = _get(raw, "v", int, "$", required=True)
    if version != AGENT_FORMAT_VERSION:
        raise InventoryFormatError("$.v", f"unsupported format version {version}")
    observed = _parse_time(_get(raw, "observed", str, "$", required=True), "$.observed")
    gpus = _get(raw, "gpus", list, "$", required=True)
    decoded = tuple(_decode_gpu(g, f"$.gpus[{i}]") for i, g in enumerate(gpus))
    uuids = [g.uuid for g in decoded]
    if len(set(uuids)) != len(uuids):
        raise InventoryFormatError("$.gpus", "duplicate GPU UUIDs")
    return AgentInventory(
        observed=observed, gpus=decoded, driver=_get(raw, "driver", str, "$", default="")
    )


# --------------------------------------------------------------------------- HAMi format

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def _int_field(text: str, where: str) -> int:
    try:
        value = int(text.strip())
    except ValueError as e:
        raise InventoryFormatError(where, f"not an integer: {text!r}") from e
    return _non_negative(value, where)


def _parse_hami_csv(text: str) -> tuple[GpuDevice, ...]:
    out: list[GpuDevice] = []
    entries = [e for e in text.strip().split(":") if e.strip()]
    for i, entry in enumerate(entries):
        where = f"[{i}]"
        parts = entry.strip().split(",")
        if not 7 <= len(parts) <= 9:
            raise InventoryFormatError(
                where, f"expected 7 to 9 comma-separated fields, got {len(parts)}: {entry!r}"
            )
        uuid, count, devmem, devcore, model, _numa, health = parts[:7]
        if not uuid.strip():
            raise InventoryFormatError(f"{where}.id", "empty")
        if health.strip() not in _GO_TRUE | _GO_FALSE:
            raise InventoryFormatError(f"{where}.health", f"not a boolean: {health!r}")
        index = _int_field(parts[7], f"{where}.index") if len(parts) > 7 and parts[7] else i
        out.append(
            GpuDevice(
                uuid=uuid.strip(),
                index=index,
                model=model.strip(),
                memory_mib=_int_field(devmem, f"{where}.devmem"),
                split_count=_int_field(count, f"{where}.count"),
                cores=_int_field(devcore, f"{where}.devcore"),
                healthy=health.strip() in _GO_TRUE,
            )
        )
    return tuple(out)


def _parse_hami_json(text: str) -> tuple[GpuDevice, ...]:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InventoryFormatError("", f"not JSON: {e}") from e
    if not isinstance(raw, list):
        raise InventoryFormatError("", f"not a JSON array: {type(raw).__name__}")
    out: list[GpuDevice] = []
    for i, entry in enumerate(raw):
        where = f"[{i}]"
        if not isinstance(entry, dict):
            raise InventoryFormatError(where, f"not an object: {entry!r}")
        uuid = _get(entry, "id", str, where, required=True)
        if not uuid:
            raise InventoryFormatError(f"{where}.id", "empty")
        # HAMi (Go, omitempty) leaves out zero values: index 0, numa 0, health false, ...
        out.append(
            GpuDevice(
                uuid=uuid,
                index=_non_negative(_get(entry, "index", int, where, default=0), f"{where}.index"),
                model=_get(entry, "type", str, where, default=""),
                memory_mib=_non_negative(
                    _get(entry, "devmem", int, where, default=0), f"{where}.devmem"
                ),
                split_count=_non_negative(
                    _get(entry, "count", int, where, default=0), f"{where}.count"
                ),
                cores=_non_negative(
                    _get(entry, "devcore", int, where, default=0), f"{where}.devcore"
                ),
                healthy=_get(entry, "health", bool, where, default=False),
            )
        )
    return tuple(out)


def parse_hami_register(text: str) -> tuple[GpuDevice, ...]:
    """Parse ``hami.io/node-nvidia-register`` in either format; raises ``InventoryFormatError``."""
    stripped = text.strip()
    devices = _parse_hami_json(stripped) if stripped.startswith("[") else _parse_hami_csv(stripped)
    uuids = [d.uuid for d in devices]
    if len(set(uuids)) != len(uuids):
        raise InventoryFormatError("", "duplicate GPU UUIDs")
    return devices


# --------------------------------------------------------------------------- nodes


def _node_ref(node: Mapping[str, Any]) -> tuple[ObjectRef, Mapping[str, Any]]:
    meta = node.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    name = meta.get("name")
    uid = meta.get("uid")
    ref = ObjectRef(
        "Node",
        name if isinstance(name, str) and name else "<unnamed>",
        uid=uid if isinstance(uid, str) else "",
        api_version="v1",
    )
    annotations = meta.get("annotations")
    return ref, annotations if isinstance(annotations, Mapping) else {}


def _field_name(annotation: str, detail: str = "") -> str:
    """``metadata.annotations[key]`` plus the path inside it (``$.gpus[0]`` -> ``.gpus[0]``)."""
    return f"metadata.annotations[{annotation}]{detail.removeprefix('$')}"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _problem(
    ref: ObjectRef, annotation: str, value: str, err: InventoryFormatError, what: str
) -> InputProblem:
    return InputProblem(
        object=ref,
        field=_field_name(annotation, err.field),
        value=_short(value),
        message=f"{what}: {err.detail}",
    )


def _not_a_string(ref: ObjectRef, annotation: str, value: object) -> InputProblem:
    return InputProblem(ref, _field_name(annotation), repr(value), "not a string; not used")


def _hami_source(
    ref: ObjectRef, annotations: Mapping[str, Any]
) -> tuple[NodeInventory | None, InputProblem | None]:
    text = annotations.get(HAMI_NODE_REGISTER_ANNOTATION)
    if text is None:
        return None, None
    if not isinstance(text, str):
        return None, _not_a_string(ref, HAMI_NODE_REGISTER_ANNOTATION, text)
    try:
        devices = parse_hami_register(text)
    except InventoryFormatError as e:
        what = "unreadable HAMi GPU register; not used"
        return None, _problem(ref, HAMI_NODE_REGISTER_ANNOTATION, text, e, what)
    return NodeInventory(ref.name, CapacitySource.HAMI, devices, None), None


def _agent_source(
    ref: ObjectRef, annotations: Mapping[str, Any], hami: NodeInventory | None
) -> tuple[NodeInventory | None, InputProblem | None]:
    text = annotations.get(GPU_INVENTORY_ANNOTATION)
    if text is None:
        return None, None
    if not isinstance(text, str):
        return None, _not_a_string(ref, GPU_INVENTORY_ANNOTATION, text)
    try:
        inv = decode_agent_inventory(text)
    except InventoryFormatError as e:
        what = "unreadable GPU inventory from the node agent; not used"
        return None, _problem(ref, GPU_INVENTORY_ANNOTATION, text, e, what)
    by_uuid = {d.uuid: d for d in hami.gpus} if hami else {}

    def device(g: AgentGpu) -> GpuDevice:
        h = by_uuid.get(g.uuid)
        return g.device(h.split_count, h.cores) if h else g.device()

    gpus = tuple(device(g) for g in inv.gpus)
    return NodeInventory(ref.name, CapacitySource.AGENT, gpus, inv.observed), None


def freshness_problem(
    inv: NodeInventory, now: datetime, max_age: timedelta = DEFAULT_MAX_AGE
) -> InputProblem | None:
    """Why an agent inventory must not be used (stale, or far in the future); None if fresh.

    HAMi inventories carry no timestamp and are always "fresh".
    """
    if inv.source is not CapacitySource.AGENT or inv.observed is None:
        return None
    ref = ObjectRef("Node", inv.node, api_version="v1")
    field_name = _field_name(GPU_INVENTORY_ANNOTATION, "$.observed")
    age = _aware(now) - _aware(inv.observed)
    if age > max_age:
        return InputProblem(
            ref,
            field_name,
            _format_time(inv.observed),
            f"GPU inventory is stale ({_human(age)} old, limit "
            f"{_human(max_age)}): is the node agent running? not used",
        )
    if -age > max_age:
        return InputProblem(
            ref,
            field_name,
            _format_time(inv.observed),
            f"GPU inventory is {_human(-age)} in the future: clock skew; not used",
        )
    return None


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def parse_node_sources(
    node: Mapping[str, Any],
) -> tuple[tuple[NodeInventory, ...], list[InputProblem]]:
    """Every inventory the Node's annotations decode to (agent first, then HAMi), unselected.

    For callers that keep both per node and choose later (``controller.accounting`` picks a
    fresh agent inventory, else HAMi's). No freshness check here: see ``freshness_problem``.
    """
    problems: list[InputProblem] = []
    ref, annotations = _node_ref(node)
    if ref.name == "<unnamed>":
        problems.append(InputProblem(ref, "metadata.name", "", "Node without a name"))
    hami, hami_problem = _hami_source(ref, annotations)
    agent, agent_problem = _agent_source(ref, annotations, hami)
    problems.extend(p for p in (agent_problem, hami_problem) if p is not None)
    return tuple(i for i in (agent, hami) if i is not None), problems


def parse_node_inventory(
    node: Mapping[str, Any], now: datetime, max_age: timedelta = DEFAULT_MAX_AGE
) -> tuple[NodeInventory | None, list[InputProblem]]:
    """The node's GPU inventory from its best usable annotation, plus what was wrong on the way.

    The agent's inventory when it decodes and is fresh, else HAMi's register; ``None`` means
    neither is usable (the caller falls back to quotas). When both annotations are present, the
    agent's GPUs keep HAMi's split count and cores per UUID.
    """
    found, problems = parse_node_sources(node)
    for inv in found:
        stale = freshness_problem(inv, now, max_age)
        if stale is None:
            return inv, problems
        problems.append(stale)
    return None, problems


def parse_node_inventories(
    nodes: Iterable[Mapping[str, Any]], now: datetime, max_age: timedelta = DEFAULT_MAX_AGE
) -> tuple[tuple[NodeInventory, ...], tuple[InputProblem, ...]]:
    """``parse_node_inventory`` over many Nodes; Nodes without any inventory are left out."""
    found: list[NodeInventory] = []
    problems: list[InputProblem] = []
    for node in nodes:
        inv, probs = parse_node_inventory(node, now, max_age)
        problems.extend(probs)
        if inv is not None:
            found.append(inv)
    return tuple(found), tuple(problems)


# --------------------------------------------------------------------------- capacity


def gpu_capacity(nodes: Iterable[NodeInventory]) -> Decimal:
    """Healthy physical GPUs over the nodes (not HAMi's split slots)."""
    return Decimal(sum(n.healthy_gpus for n in nodes))


def _empty_counts() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuCapacity:
    """Everything capacity needs from the node inventories."""

    gpus: Decimal  # healthy physical GPUs
    unhealthy: int = 0
    gpus_by_model: Mapping[str, int] = field(default_factory=_empty_counts)  # healthy only
    memory_mib_by_model: Mapping[str, int] = field(default_factory=_empty_counts)  # smallest card
    sources: Mapping[str, CapacitySource] = field(
        default_factory=lambda: MappingProxyType({})
    )  # node -> source used

    @property
    def source(self) -> CapacitySource:
        """QUOTA when no node has an inventory; HAMI when any node relies on HAMi; else AGENT."""
        used = set(self.sources.values())
        if not used:
            return CapacitySource.QUOTA
        return CapacitySource.HAMI if CapacitySource.HAMI in used else CapacitySource.AGENT

    def card_memory_mib(self, model: str | None = None) -> int | None:
        """Memory of the smallest healthy card, of models containing ``model`` when given.

        Substring match, as HAMi's ``nvidia.com/use-gputype``. ``None`` when nothing matches.
        """
        sizes = [
            mib
            for m, mib in self.memory_mib_by_model.items()
            if mib > 0 and (model is None or model.lower() in m.lower())
        ]
        return min(sizes) if sizes else None


def summarize_capacity(nodes: Iterable[NodeInventory]) -> GpuCapacity:
    total = 0
    unhealthy = 0
    by_model: dict[str, int] = {}
    memory: dict[str, int] = {}
    sources: dict[str, CapacitySource] = {}
    for node in nodes:
        sources[node.node] = node.source
        for g in node.gpus:
            if not g.healthy:
                unhealthy += 1
                continue
            total += 1
            by_model[g.model] = by_model.get(g.model, 0) + 1
            if g.memory_mib > 0:
                memory[g.model] = min(memory.get(g.model, g.memory_mib), g.memory_mib)
    return GpuCapacity(
        gpus=Decimal(total),
        unhealthy=unhealthy,
        gpus_by_model=MappingProxyType(by_model),
        memory_mib_by_model=MappingProxyType(memory),
        sources=MappingProxyType(sources),
    )


def resolve_gpu_capacity(
    nodes: Iterable[NodeInventory], quota_gpus: Decimal
) -> tuple[Decimal, CapacitySource]:
    """GPU capacity and where it came from: node inventories when any, else the quota sum."""
    summary = summarize_capacity(nodes)
    if summary.source is CapacitySource.QUOTA:
        return quota_gpus, CapacitySource.QUOTA
    return summary.gpus, summary.source


def gpumem_fraction(gpumem_mib: Decimal, card_memory_mib: int) -> Decimal:
    """``nvidia.com/gpumem`` (MiB per GPU) as a fraction of one card, capped at 1."""
    if card_memory_mib <= 0:
        raise ValueError(f"card memory must be positive, got {card_memory_mib}")
    if gpumem_mib <= 0:
        return Decimal(0)
    return min(Decimal(1), gpumem_mib / Decimal(card_memory_mib))
