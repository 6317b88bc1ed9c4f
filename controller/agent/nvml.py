"""Read the node's GPUs through NVML (``pynvml``, package nvidia-ml-py).

Every NVML call goes through the ``pynvml`` module attribute at call time, so tests replace
those functions (``tests.support.fakenvml``) and exercise this code unchanged.

Error policy, per GPU and per field:
- "not available here" errors (not supported, no permission, function not found in this
  driver) leave the field ``None``;
- any other ``NVMLError`` is recorded in ``GpuSample.errors`` and makes the GPU unhealthy
  (``controller.agent.health``); the other GPUs are still read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

log = logging.getLogger(__name__)

T = TypeVar("T")

_UNAVAILABLE = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
)
# A driver without nvmlDeviceGetMemoryInfo_v2 (or with another struct version) answers these;
# the agent then reads v1, whose "used" includes the driver's reservation.
_NO_MEMORY_V2 = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
MAX_EVENTS_PER_POLL = 1000


class NoDriverError(RuntimeError):
    """NVML could not start: no driver, no library, or no permission to the devices."""

    def __init__(self, error: pynvml.NVMLError) -> None:
        super().__init__(f"no NVIDIA driver: {nvml_error_text(error)}")
        self.error = error


class NvmlReadError(RuntimeError):
    """NVML failed for the whole node (e.g. the device count), not just one GPU."""


def nvml_error_text(error: BaseException) -> str:
    """``str()`` of an NVMLError never raises, but be safe with odd codes."""
    try:
        return str(error) or type(error).__name__
    except Exception:  # pragma: no cover - defensive
        return type(error).__name__


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class MigSample:
    uuid: str
    profile: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    gpu_instance: int | None
    compute_instance: int | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One read of one physical GPU."""

    index: int
    uuid: str
    model: str = ""
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None  # as nvidia-smi shows it: without the reservation
    memory_reserved_bytes: int | None = None  # the driver's own; None where NVML lacks v2
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    ecc_uncorrected: int | None = None  # volatile count since the last driver reload
    mig_enabled: bool = False
    mig_instances: tuple[MigSample, ...] = ()
    errors: tuple[str, ...] = ()  # NVML errors met while reading this GPU

    @property
    def memory_mib(self) -> int:
        return (self.memory_total_bytes or 0) // (1024 * 1024)


@dataclass(frozen=True, slots=True)
class XidEvent:
    uuid: str
    xid: int


class _Fields:
    """Collects per-field NVML errors while reading one device."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def memory(self, what: str, handle: Any) -> Any:
        """Memory info v2, whose ``used`` leaves out what the driver reserves (480 MiB on an
        H100 with driver 580, where v1 reports it as used); v1 on drivers without v2."""
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        except pynvml.NVMLError as e:
            if e.value not in _NO_MEMORY_V2:
                self.errors.append(f"NVML error reading {what}: {nvml_error_text(e)}")
                return None
        return self.get(what, pynvml.nvmlDeviceGetMemoryInfo, handle)

    def get(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            if e.value in _UNAVAILABLE:
                return None
            self.errors.append(f"NVML error reading {what}: {nvml_error_text(e)}")
            return None


def _reserved(memory: Any) -> int | None:
    return int(memory.reserved) if isinstance(memory, pynvml.c_nvmlMemory_v2_t) else None


def _profile(name: str) -> str:
    """``NVIDIA A100-SXM4-40GB MIG 3g.20gb`` -> ``3g.20gb``."""
    _, sep, tail = name.rpartition(" MIG ")
    return tail.strip() if sep else ""


class NvmlReader:
    """NVML session for one agent process: ``open()``, ``read()`` repeatedly, ``close()``."""

    def __init__(self, watch_xids: bool = True) -> None:
        self._open = False
        self._watch_xids = watch_xids
        self._event_set: Any = None
        self.driver_version = ""

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self) -> None:
        """Start NVML; raises ``NoDriverError`` with NVML's own reason when it cannot."""
        if self._open:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NoDriverError(e) from e
        self._open = True
        fields = _Fields()
        self.driver_version = _text(
            fields.get("driver version", pynvml.nvmlSystemGetDriverVersion) or ""
        )
        if self._watch_xids:
            self._register_xid_events()

    def close(self) -> None:
        if not self._open:
            return
        if self._event_set is not None:
            try:
                pynvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError as e:
                log.debug("nvmlEventSetFree: %s", nvml_error_text(e))
            self._event_set = None
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            log.debug("nvmlShutdown: %s", nvml_error_text(e))
        self._open = False

    def read(self) -> list[GpuSample]:
        """Read every GPU; raises ``NvmlReadError`` only when the GPUs cannot be listed."""
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            raise NvmlReadError(f"NVML error counting GPUs: {nvml_error_text(e)}") from e
        return [self._read_gpu(i) for i in range(count)]

    def _read_gpu(self, index: int) -> GpuSample:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as e:
            error = f"NVML error opening GPU {index}: {nvml_error_text(e)}"
            return GpuSample(index=index, uuid=f"unknown-gpu-{index}", errors=(error,))
        f = _Fields()
        uuid = f.get("UUID", pynvml.nvmlDeviceGetUUID, handle)
        name = f.get("name", pynvml.nvmlDeviceGetName, handle)
        memory = f.memory("memory", handle)
        util = f.get("utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
        temp = f.get(
            "temperature", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
        )
        power_mw = f.get("power", pynvml.nvmlDeviceGetPowerUsage, handle)
        ecc = f.get(
            "ECC errors",
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        mig_mode = f.get("MIG mode", pynvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = mig_mode is not None and mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        migs = self._read_migs(handle, f) if mig_enabled else ()
        return GpuSample(
            index=index,
            uuid=_text(uuid) if uuid else f"unknown-gpu-{index}",
            model=_text(name) if name else "",
            memory_total_bytes=int(memory.total) if memory is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_reserved_bytes=_reserved(memory),
            utilization_gpu_pct=int(util.gpu) if util is not None else None,
            utilization_memory_pct=int(util.memory) if util is not None else None,
            temperature_c=int(temp) if temp is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            mig_enabled=mig_enabled,
            mig_instances=migs,
            errors=tuple(f.errors),
        )

    def _read_migs(self, handle: Any, f: _Fields) -> tuple[MigSample, ...]:
        slots = f.get("MIG device count", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        out: list[MigSample] = []
        for slot in range(slots):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as e:
                if e.value != pynvml.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: empty slot
                    f.errors.append(f"NVML error opening MIG slot {slot}: {nvml_error_text(e)}")
                continue
            uuid = f.get(f"MIG {slot} UUID", pynvml.nvmlDeviceGetUUID, mig)
            name = f.get(f"MIG {slot} name", pynvml.nvmlDeviceGetName, mig)
            memory = f.memory(f"MIG {slot} memory", mig)
            out.append(
                MigSample(
                    uuid=_text(uuid) if uuid else f"unknown-mig-{slot}",
                    profile=_profile(_text(name)) if name else "",
                    memory_total_bytes=int(memory.total) if memory is not None else None,
                    memory_used_bytes=int(memory.used) if memory is not None else None,
                    gpu_instance=f.get(
                        f"MIG {slot} GPU instance", pynvml.nvmlDeviceGetGpuInstanceId, mig
                    ),
                    compute_instance=f.get(
                        f"MIG {slot} compute instance", pynvml.nvmlDeviceGetComputeInstanceId, mig
                    ),
                )
            )
        return tuple(out)

    # ---------------------------------------------------------------- XID events

    def _register_xid_events(self) -> None:
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            log.info("XID events unavailable: %s", nvml_error_text(e))
            self._event_set = None
            return
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
                )
            except pynvml.NVMLError as e:
                log.info("XID events unavailable for GPU %d: %s", i, nvml_error_text(e))

    def poll_xids(self) -> list[XidEvent]:
        """Critical XID events since the last poll, without waiting."""
        if self._event_set is None:
            return []
        out: list[XidEvent] = []
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                data = pynvml.nvmlEventSetWait(self._event_set, 0)
            except pynvml.NVMLError as e:
                if e.value != pynvml.NVML_ERROR_TIMEOUT:
                    log.warning("waiting for XID events: %s", nvml_error_text(e))
                break
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
            except pynvml.NVMLError as e:
                log.warning("XID %d on an unidentified GPU: %s", data.eventData, e)
                continue
            out.append(XidEvent(uuid=uuid, xid=int(data.eventData)))
        return out
