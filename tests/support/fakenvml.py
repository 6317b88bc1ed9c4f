"""A fake NVML for tests and demos: replaces the ``pynvml`` functions the agent calls.

``FakeNvml(gpus=[FakeGpu(...)]).install(monkeypatch.setattr)`` swaps the functions on the real
``pynvml`` module (the lowest seam: everything above runs unchanged). Failures are real
``pynvml.NVMLError`` subclasses, raised per function name and GPU (``FakeGpu.fail``), so a GPU
can break mid-read. Return values are the real ctypes structures where the agent reads fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
H100_BYTES = 81559 * 1024 * 1024


def nvml_error(code: int) -> pynvml.NVMLError:
    """The real pynvml exception for an NVML return code (e.g. ``NVMLError_GpuIsLost``)."""
    return pynvml.nvmlExceptionClass(code)()


@dataclass
class FakeMig:
    uuid: str
    profile: str = "1g.10gb"
    memory_total: int = 9856 * 1024 * 1024
    memory_used: int = 0
    gpu_instance: int = 1
    compute_instance: int = 0


@dataclass
class FakeGpu:
    uuid: str
    name: str = H100
    memory_total: int = H100_BYTES
    memory_used: int = 0  # by applications (v2's used; v1 adds memory_reserved)
    memory_reserved: int = 0  # the driver's own (real H100, driver 580: 480 MiB)
    memory_v2: bool = True  # False: a driver without nvmlDeviceGetMemoryInfo_v2
    util_gpu: int = 0
    util_memory: int = 0
    temperature: int = 40
    power_mw: int = 70_000
    ecc_uncorrected: int | None = 0  # None: ECC not supported
    mig_mode: int | None = None  # None: MIG not supported; 0 off; 1 on
    migs: dict[int, FakeMig] = field(default_factory=dict)  # slot -> instance
    max_migs: int = 7
    fail: dict[str, int] = field(default_factory=dict)  # pynvml function -> NVML error code
    xids: list[int] = field(default_factory=list)  # pending critical XID events


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: int | None = None  # e.g. pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    count_error: int | None = None  # nvmlDeviceGetCount fails (whole-node failure)
    driver: str = "550.54.15"
    initialized: bool = False
    calls: list[str] = field(default_factory=list)

    # ------------------------------------------------------------ install

    def install(self, setattr_: Callable[[Any, str, Any], None]) -> None:
        """Patch pynvml with this fake; pass ``monkeypatch.setattr`` so tests undo it."""
        for name in dir(self):
            if name.startswith("nvml"):
                setattr_(pynvml, name, getattr(self, name))

    # ------------------------------------------------------------ helpers

    def _gpu(self, handle: _Handle, fn: str) -> FakeGpu:
        self.calls.append(fn)
        if not self.initialized:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.gpu]
        if fn in gpu.fail:
            raise nvml_error(gpu.fail[fn])
        return gpu

    def _mig(self, handle: _Handle) -> FakeMig | None:
        return None if handle.mig is None else self.gpus[handle.gpu].migs[handle.mig]

    # ------------------------------------------------------------ library

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("nvmlDeviceGetCount")
        if self.count_error is not None:
            raise nvml_error(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if index >= len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpu(_Handle(index), "nvmlDeviceGetHandleByIndex")
        return _Handle(index)

    # ------------------------------------------------------------ device queries

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        mig = self._mig(handle)
        return mig.uuid if mig else gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetName")
        mig = self._mig(handle)
        return f"{gpu.name} MIG {mig.profile}" if mig else gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> Any:
        """v1 without ``version`` (used includes the reservation), v2 with it, as the real."""
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        mig = self._mig(handle)
        total = mig.memory_total if mig else gpu.memory_total
        used = mig.memory_used if mig else gpu.memory_used
        reserved = 0 if mig else gpu.memory_reserved
        if not version:
            info = pynvml.c_nvmlMemory_t()
            info.total, info.used = total, used + reserved
            info.free = total - used - reserved
            return info
        if not gpu.memory_v2:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info2 = pynvml.c_nvmlMemory_v2_t()
        info2.version, info2.total, info2.reserved, info2.used = version, total, reserved, used
        info2.free = total - used - reserved
        return info2

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE:  # as real NVML: not per physical GPU
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = gpu.util_gpu
        util.memory = gpu.util_memory
        return util

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if gpu.ecc_uncorrected is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.ecc_uncorrected

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        if gpu.mig_mode is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount").max_migs

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index not in gpu.migs:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._gpu(handle, "nvmlDeviceGetGpuInstanceId")
        mig = self._mig(handle)
        if mig is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._gpu(handle, "nvmlDeviceGetComputeInstanceId")
        mig = self._mig(handle)
        if mig is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.compute_instance

    # ------------------------------------------------------------ events (XID)

    def nvmlEventSetCreate(self) -> str:
        self.calls.append("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, event_set: Any) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        for i, gpu in enumerate(self.gpus):
            if gpu.xids:
                return SimpleNamespace(
                    device=_Handle(i),
                    eventType=pynvml.nvmlEventTypeXidCriticalError,
                    eventData=gpu.xids.pop(0),
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.calls.append("nvmlEventSetFree")


def h100s(n: int, prefix: str = "GPU-") -> list[FakeGpu]:
    """``n`` idle H100s with UUIDs ``GPU-0000``, ``GPU-0001``, ..."""
    return [FakeGpu(uuid=f"{prefix}{i:04d}") for i in range(n)]
