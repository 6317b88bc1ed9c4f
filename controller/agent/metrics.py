"""Prometheus metrics ``wdrf_gpu_*``, labelled by GPU UUID and index, on the agent's own registry.

A collector renders the latest ``AgentState`` on each scrape, so a GPU that disappears leaves
no stale series behind. ``None`` readings (not supported on this GPU) are simply not exported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.agent.health import GpuHealth
from controller.agent.nvml import GpuSample

GPU_LABELS = ["uuid", "index"]
MIG_LABELS = ["uuid", "index", "mig_uuid", "profile"]


def _no_health() -> Mapping[str, GpuHealth]:
    return MappingProxyType({})


def _no_counts() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class AgentState:
    """What the agent knows after one cycle; replaced whole, read by scrapes."""

    nvml_up: bool = False
    driver: str = ""
    samples: Sequence[GpuSample] = ()
    health: Mapping[str, GpuHealth] = field(default_factory=_no_health)  # by GPU UUID
    xid_counts: Mapping[str, int] = field(default_factory=_no_counts)  # critical XIDs by UUID
    last_read: float | None = None  # unix time of the last successful NVML read
    last_publish: float | None = None  # unix time of the last successful annotation patch
    patches: Mapping[str, int] = field(default_factory=_no_counts)  # result -> count


def _labels(s: GpuSample) -> list[str]:
    return [s.uuid, str(s.index)]


class AgentCollector(Collector):
    def __init__(self) -> None:
        self.state = AgentState()

    def update(self, state: AgentState) -> None:
        self.state = state  # one reference swap: scrapes see a whole cycle or the previous one

    def collect(self) -> Iterator[Metric]:
        st = self.state
        yield from self._node(st)
        yield from self._gpus(st)
        yield from self._migs(st)

    def _node(self, st: AgentState) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "wdrf_gpu_nvml_up", "1 when NVML answered on the last cycle", value=int(st.nvml_up)
        )
        yield GaugeMetricFamily("wdrf_gpus", "Physical GPUs NVML reports", len(st.samples))
        healthy = sum(1 for s in st.samples if self._healthy(st, s))
        yield GaugeMetricFamily("wdrf_gpus_healthy", "Healthy physical GPUs", healthy)
        if st.last_read is not None:
            yield GaugeMetricFamily(
                "wdrf_gpu_last_read_timestamp_seconds", "Last successful NVML read", st.last_read
            )
        if st.last_publish is not None:
            yield GaugeMetricFamily(
                "wdrf_gpu_inventory_published_timestamp_seconds",
                "Last successful patch of the Node's gpu-inventory annotation",
                st.last_publish,
            )
        patches = CounterMetricFamily(
            "wdrf_gpu_inventory_patches", "Node annotation patches by result", labels=["result"]
        )
        for result in ("ok", "error"):
            patches.add_metric([result], st.patches.get(result, 0))
        yield patches

    @staticmethod
    def _healthy(st: AgentState, s: GpuSample) -> bool:
        h = st.health.get(s.uuid)
        return h.healthy if h is not None else not s.errors

    def _gpus(self, st: AgentState) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "wdrf_gpu_info", "GPU identity (value 1)", labels=[*GPU_LABELS, "model", "driver"]
        )
        healthy = GaugeMetricFamily("wdrf_gpu_healthy", "1 healthy, 0 unhealthy", labels=GPU_LABELS)
        gauges = {
            "memory_total": GaugeMetricFamily(
                "wdrf_gpu_memory_total_bytes", "Device memory", labels=GPU_LABELS
            ),
            "memory_used": GaugeMetricFamily(
                "wdrf_gpu_memory_used_bytes",
                "Device memory in use, without the driver's reservation (as nvidia-smi)",
                labels=GPU_LABELS,
            ),
            "memory_reserved": GaugeMetricFamily(
                "wdrf_gpu_memory_reserved_bytes",
                "Device memory the driver reserves for itself",
                labels=GPU_LABELS,
            ),
            "util": GaugeMetricFamily(
                "wdrf_gpu_utilization_ratio",
                "Fraction of the last sample period a kernel ran",
                labels=GPU_LABELS,
            ),
            "mem_util": GaugeMetricFamily(
                "wdrf_gpu_memory_busy_ratio",
                "Fraction of the last sample period device memory was read or written",
                labels=GPU_LABELS,
            ),
            "temp": GaugeMetricFamily(
                "wdrf_gpu_temperature_celsius", "GPU core temperature", labels=GPU_LABELS
            ),
            "power": GaugeMetricFamily("wdrf_gpu_power_watts", "Power draw", labels=GPU_LABELS),
            "ecc": GaugeMetricFamily(
                "wdrf_gpu_ecc_uncorrected_errors",
                "Uncorrectable ECC errors since the driver loaded (volatile)",
                labels=GPU_LABELS,
            ),
            "mig": GaugeMetricFamily(
                "wdrf_gpu_mig_enabled", "1 when MIG mode is on", labels=GPU_LABELS
            ),
            "mig_n": GaugeMetricFamily(
                "wdrf_gpu_mig_instances", "MIG devices on this GPU", labels=GPU_LABELS
            ),
        }
        xids = CounterMetricFamily(
            "wdrf_gpu_xid_errors", "Critical XID events seen by this agent", labels=GPU_LABELS
        )
        for s in st.samples:
            lab = _labels(s)
            info.add_metric([*lab, s.model, st.driver], 1)
            healthy.add_metric(lab, int(self._healthy(st, s)))
            values: dict[str, float | None] = {
                "memory_total": s.memory_total_bytes,
                "memory_used": s.memory_used_bytes,
                "memory_reserved": s.memory_reserved_bytes,
                "util": None if s.utilization_gpu_pct is None else s.utilization_gpu_pct / 100,
                "mem_util": (
                    None if s.utilization_memory_pct is None else s.utilization_memory_pct / 100
                ),
                "temp": s.temperature_c,
                "power": s.power_w,
                "ecc": s.ecc_uncorrected,
                "mig": int(s.mig_enabled),
                "mig_n": len(s.mig_instances),
            }
            for key, value in values.items():
                if value is not None:
                    gauges[key].add_metric(lab, value)
            xids.add_metric(lab, st.xid_counts.get(s.uuid, 0))
        yield info
        yield healthy
        yield from gauges.values()
        yield xids

    def _migs(self, st: AgentState) -> Iterator[Metric]:
        total = GaugeMetricFamily(
            "wdrf_gpu_mig_memory_total_bytes", "MIG device memory", labels=MIG_LABELS
        )
        used = GaugeMetricFamily(
            "wdrf_gpu_mig_memory_used_bytes", "MIG device memory in use", labels=MIG_LABELS
        )
        for s in st.samples:
            for m in s.mig_instances:
                lab = [*_labels(s), m.uuid, m.profile]
                if m.memory_total_bytes is not None:
                    total.add_metric(lab, m.memory_total_bytes)
                if m.memory_used_bytes is not None:
                    used.add_metric(lab, m.memory_used_bytes)
        yield total
        yield used


def new_registry() -> tuple[CollectorRegistry, AgentCollector]:
    registry = CollectorRegistry(auto_describe=False)
    collector = AgentCollector()
    registry.register(collector)
    return registry, collector


def render(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode("utf-8")
