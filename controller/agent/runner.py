"""The agent loop: read NVML, judge health, publish the inventory, update the metrics."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from controller.agent.health import GpuHealth, HealthPolicy, assess, critical_xids
from controller.agent.metrics import AgentCollector, AgentState
from controller.agent.nvml import GpuSample, NoDriverError, NvmlReader, NvmlReadError
from controller.agent.publish import NodeClient, Publisher
from controller.inventory import MIB, AgentGpu, AgentInventory, MigInstance

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node_name: str
    interval: timedelta = timedelta(seconds=15)
    refresh: timedelta = timedelta(minutes=2)
    health: HealthPolicy = field(default_factory=HealthPolicy)
    allow_no_gpu: bool = False


@dataclass(frozen=True, slots=True)
class StepResult:
    inventory: AgentInventory | None  # None: nothing known to publish (no driver)
    patched: bool = False
    problem: str = ""  # why NVML gave nothing this cycle


def to_agent_gpu(sample: GpuSample, health: GpuHealth) -> AgentGpu:
    return AgentGpu(
        uuid=sample.uuid,
        index=sample.index,
        model=sample.model,
        memory_mib=sample.memory_mib,
        healthy=health.healthy,
        reasons=health.reasons,
        mig_enabled=sample.mig_enabled,
        mig_instances=tuple(
            MigInstance(
                uuid=m.uuid,
                profile=m.profile,
                memory_mib=(m.memory_total_bytes or 0) // MIB,
                gpu_instance=m.gpu_instance,
                compute_instance=m.compute_instance,
            )
            for m in sample.mig_instances
        ),
    )


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        reader: NvmlReader,
        collector: AgentCollector,
        client: NodeClient | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.config = config
        self.reader = reader
        self.collector = collector
        self.publisher = Publisher(client, config.node_name, config.refresh) if client else None
        self.clock = clock
        self._hot: dict[str, bool] = {}
        self._xids: dict[str, list[int]] = {}  # critical XIDs per GPU, kept until restart
        self._last: AgentInventory | None = None
        self._last_read: float | None = None
        self._last_publish: float | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open NVML (``NoDriverError`` unless no-GPU mode is allowed) and read the Node."""
        try:
            self.reader.open()
        except NoDriverError as e:
            if not self.config.allow_no_gpu:
                raise
            log.warning("%s; serving metrics with zero GPUs (--allow-no-gpu)", e)
        if self.publisher is not None:
            self.publisher.start()

    def close(self) -> None:
        self.reader.close()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = self.clock()
            try:
                self.step()
            except Exception:  # one bad cycle must not end the agent
                log.exception("agent cycle failed")
            spent = (self.clock() - started).total_seconds()
            stop.wait(max(0.0, self.config.interval.total_seconds() - spent))

    # ---------------------------------------------------------------- one cycle

    def step(self) -> StepResult:
        now = self.clock()
        samples, problem = self._read()
        if samples is None:
            inventory = self._all_unhealthy(now, problem) if self._last else None
            healths: dict[str, GpuHealth] = {}
            shown: Sequence[GpuSample] = ()
        else:
            healths = self._assess(samples)
            inventory = AgentInventory(
                observed=now,
                gpus=tuple(to_agent_gpu(s, healths[s.uuid]) for s in samples),
                driver=self.reader.driver_version,
            )
            shown = samples
            self._last_read = now.timestamp()
        patched = False
        if inventory is not None:
            self._last = inventory
            if self.publisher is not None:
                patched = self.publisher.publish(inventory)
                if patched:
                    self._last_publish = now.timestamp()
        self._update_metrics(samples is not None, shown, healths)
        return StepResult(inventory, patched, problem)

    def _read(self) -> tuple[list[GpuSample] | None, str]:
        if not self.reader.is_open:
            try:
                self.reader.open()
                log.info("NVML is up (driver %s)", self.reader.driver_version)
            except NoDriverError as e:
                return None, str(e)
        try:
            return self.reader.read(), ""
        except NvmlReadError as e:
            log.warning("%s", e)
            return None, str(e)

    def _assess(self, samples: Sequence[GpuSample]) -> dict[str, GpuHealth]:
        for ev in self.reader.poll_xids():
            if critical_xids([ev.xid], self.config.health):
                log.warning("critical XID %d on GPU %s", ev.xid, ev.uuid)
                self._xids.setdefault(ev.uuid, []).append(ev.xid)
        out: dict[str, GpuHealth] = {}
        for s in samples:
            h = assess(
                s, self.config.health, self._hot.get(s.uuid, False), self._xids.get(s.uuid, ())
            )
            self._hot[s.uuid] = h.hot
            out[s.uuid] = h
        return out

    def _all_unhealthy(self, now: datetime, problem: str) -> AgentInventory:
        """NVML stopped answering for the whole node: every GPU we knew is unusable."""
        assert self._last is not None
        reason = problem or "NVML stopped answering"
        gpus = tuple(
            AgentGpu(g.uuid, g.index, g.model, g.memory_mib, False, (reason,), g.mig_enabled)
            for g in self._last.gpus
        )
        return AgentInventory(observed=now, gpus=gpus, driver=self._last.driver)

    def _update_metrics(
        self, nvml_up: bool, samples: Sequence[GpuSample], healths: dict[str, GpuHealth]
    ) -> None:
        patches = dict(self.publisher.patches) if self.publisher else {}
        self.collector.update(
            AgentState(
                nvml_up=nvml_up,
                driver=self.reader.driver_version,
                samples=tuple(samples),
                health=MappingProxyType(healths),
                xid_counts=MappingProxyType({u: len(x) for u, x in self._xids.items()}),
                last_read=self._last_read,
                last_publish=self._last_publish,
                patches=MappingProxyType(patches),
            )
        )
