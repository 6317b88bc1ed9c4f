"""The node agent on a real NVIDIA GPU, witnessed by ``nvidia-smi`` (the driver's own tool).

Everywhere else the agent runs over ``tests.support.fakenvml``. These tests run the same code
over the real driver and check two things: what the agent reads and publishes agrees with
``nvidia-smi``, and the fake answers in the real library's shapes (return types, errors), so
the unit tests built on it test what runs on a GPU node.

Marker ``gpu``: needs an NVIDIA driver and at least one GPU (``make test-gpu``). CI has no GPU,
so ``make test`` leaves them out. Without a driver they FAIL, naming what is missing; they never
skip.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.agent.health import HealthPolicy
from controller.agent.metrics import new_registry, render
from controller.agent.nvml import NvmlReader
from controller.agent.publish import annotation_patch
from controller.agent.runner import Agent, AgentConfig
from controller.domain import CapacitySource
from controller.inventory import decode_agent_inventory, parse_node_inventory, summarize_capacity
from tests.support.fakenvml import FakeGpu, FakeNvml

pytestmark = pytest.mark.gpu

MIB = 1024 * 1024
SMI_FIELDS = (
    "index,uuid,name,memory.total,memory.used,temperature.gpu,power.draw,"
    "utilization.gpu,driver_version,ecc.errors.uncorrected.volatile.total"
)


@dataclass(frozen=True)
class SmiGpu:
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    temperature_c: int
    power_w: float | None
    utilization_pct: int
    driver: str
    ecc_uncorrected: int | None


def _number(text: str) -> str | None:
    text = text.strip()
    return None if text in {"[N/A]", "N/A", "[Not Supported]", ""} else text


def nvidia_smi() -> list[SmiGpu]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.fail("nvidia-smi not found: these tests need an NVIDIA driver and GPU", False)
    out = subprocess.run(
        [exe, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    gpus = []
    for row in csv.reader(out.strip().splitlines(), skipinitialspace=True):
        power, ecc = _number(row[6]), _number(row[9])
        gpus.append(
            SmiGpu(
                index=int(row[0]),
                uuid=row[1].strip(),
                name=row[2].strip(),
                memory_total_mib=int(row[3]),
                memory_used_mib=int(row[4]),
                temperature_c=int(row[5]),
                power_w=float(power) if power else None,
                utilization_pct=int(row[7]),
                driver=row[8].strip(),
                ecc_uncorrected=int(ecc) if ecc else None,
            )
        )
    assert gpus, f"nvidia-smi lists no GPU:\n{out}"
    return gpus


@pytest.fixture(scope="module")
def smi() -> list[SmiGpu]:
    return nvidia_smi()


@pytest.fixture
def reader() -> Iterator[NvmlReader]:
    r = NvmlReader()
    r.open()  # NoDriverError here fails the test with NVML's reason
    yield r
    r.close()


def test_once_publishes_the_gpus_nvidia_smi_lists(smi: list[SmiGpu]) -> None:
    """The DaemonSet's own command, as an operator would run it on a node."""
    run = subprocess.run(
        [sys.executable, "-m", "controller", "agent", "--once", "--no-publish"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    inventory = decode_agent_inventory(run.stdout.strip())
    assert inventory.driver == smi[0].driver
    published = {g.uuid: g for g in inventory.gpus}
    assert set(published) == {g.uuid for g in smi}
    for expected in smi:
        got = published[expected.uuid]
        assert (got.index, got.model, got.memory_mib) == (
            expected.index,
            expected.name,
            expected.memory_total_mib,
        )
        # healthy unless nvidia-smi itself shows a reason the agent treats as unhealthy
        hot = expected.temperature_c > HealthPolicy().max_temperature_c
        broken = bool(expected.ecc_uncorrected)
        assert got.healthy is not (hot or broken), got.reasons


def test_readings_agree_with_nvidia_smi(reader: NvmlReader, smi: list[SmiGpu]) -> None:
    samples = {s.uuid: s for s in reader.read()}
    after = {g.uuid: g for g in nvidia_smi()}  # read around the agent's read: live values move
    for before in smi:
        s, late = samples[before.uuid], after[before.uuid]
        assert s.errors == (), s.errors
        assert s.memory_total_bytes == before.memory_total_mib * MIB
        assert s.memory_used_bytes is not None
        used_mib = s.memory_used_bytes / MIB
        low, high = sorted((before.memory_used_mib, late.memory_used_mib))
        assert low - 64 <= used_mib <= high + 64, (used_mib, low, high)
        assert s.temperature_c is not None
        assert (
            min(before.temperature_c, late.temperature_c) - 3
            <= s.temperature_c
            <= max(before.temperature_c, late.temperature_c) + 3
        )
        assert s.utilization_gpu_pct is not None and 0 <= s.utilization_gpu_pct <= 100
        if before.power_w is not None and late.power_w is not None:
            assert s.power_w is not None
            low_w, high_w = sorted((before.power_w, late.power_w))
            assert low_w * 0.7 - 10 <= s.power_w <= high_w * 1.3 + 10, (s.power_w, low_w, high_w)
        if before.ecc_uncorrected is not None:
            assert s.ecc_uncorrected == before.ecc_uncorrected


# A child process that holds 2 GiB of device memory through the driver API (libcuda ships with
# every NVIDIA driver; no CUDA toolkit or framework needed).
HOLD_2_GIB = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 << 30)) == 0
print("holding", flush=True)
sys.stdin.read()
"""


def _used_mib(reader: NvmlReader) -> float:
    sample = next(s for s in reader.read() if s.index == 0)
    assert sample.memory_used_bytes is not None
    return sample.memory_used_bytes / MIB


def test_memory_a_process_takes_shows_as_used(reader: NvmlReader) -> None:
    idle = _used_mib(reader)
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_2_GIB],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "holding"
        held = _used_mib(reader)
        smi_held = next(g for g in nvidia_smi() if g.index == 0).memory_used_mib
    finally:
        child.communicate("", timeout=60)
    assert held - idle >= 2048, (idle, held)  # the 2 GiB, plus the context's own memory
    assert abs(held - smi_held) <= 64, (held, smi_held)
    deadline = time.monotonic() + 30
    while _used_mib(reader) > idle + 64 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _used_mib(reader) <= idle + 64  # freed when the process ends


def test_metrics_on_a_real_gpu(smi: list[SmiGpu]) -> None:
    registry, collector = new_registry()
    agent = Agent(AgentConfig("gpu-node"), NvmlReader(), collector, client=None)
    agent.start()
    try:
        result = agent.step()
    finally:
        agent.close()
    assert result.inventory is not None and result.problem == ""
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(render(registry)):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert values[("wdrf_gpu_nvml_up", ())] == 1
    assert values[("wdrf_gpus", ())] == len(smi)
    for g in smi:
        labels = (("index", str(g.index)), ("uuid", g.uuid))
        assert values[("wdrf_gpu_memory_total_bytes", labels)] == g.memory_total_mib * MIB
        info = dict(labels, model=g.name, driver=g.driver)
        assert values[("wdrf_gpu_info", tuple(sorted(info.items())))] == 1


def test_the_controller_counts_this_node_from_what_the_agent_publishes(smi: list[SmiGpu]) -> None:
    """The agent's Node annotation, read back by the controller's capacity code: one GPU per
    physical card nvidia-smi lists, of its model and memory."""
    _registry, collector = new_registry()
    agent = Agent(AgentConfig("gpu-node"), NvmlReader(), collector, client=None)
    agent.start()
    try:
        inventory = agent.step().inventory
    finally:
        agent.close()
    assert inventory is not None
    node = {"metadata": {"name": "gpu-node", **annotation_patch(inventory)["metadata"]}}  # type: ignore[dict-item]
    parsed, problems = parse_node_inventory(node, inventory.observed)
    assert problems == [] and parsed is not None
    capacity = summarize_capacity([parsed])
    assert capacity.source is CapacitySource.AGENT
    assert capacity.gpus == Decimal(len(smi))
    for g in smi:
        assert capacity.card_memory_mib(g.name) == min(
            x.memory_total_mib for x in smi if x.name == g.name
        )


def test_xid_watch_opens_and_a_healthy_gpu_reports_none(reader: NvmlReader) -> None:
    assert reader.poll_xids() == []


# -------------------------------------------------------------- the fake's fidelity


def _call(fn: Any, *args: Any) -> tuple[str, Any]:
    """('ok', value) or ('error', the NVMLError class name)."""
    try:
        return "ok", fn(*args)
    except pynvml.NVMLError as e:
        return "error", type(e).__name__


def _shape(value: Any) -> Any:
    """What the agent relies on in a return value: its type, and the fields it reads."""
    if isinstance(value, bytes):
        return "text"  # older nvidia-ml-py returns bytes; the agent decodes either
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool | int | float):
        return "number"
    if isinstance(value, list | tuple):
        return [_shape(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        return {name: _shape(getattr(value, name)) for name, _ in fields}
    return type(value).__name__


def _fn(name: str) -> Any:
    """The pynvml function of a query name; ``..._v2`` is the same function given a version
    (looked up at call time, so the fake installed on pynvml answers once installed)."""
    return getattr(pynvml, name.removesuffix("_v2"))


def test_v1_counts_the_drivers_reservation_as_used_and_v2_does_not(
    reader: NvmlReader, smi: list[SmiGpu]
) -> None:
    """Why the agent reads v2: v1's ``used`` = v2's ``used`` + ``reserved``, and nvidia-smi
    shows v2's. Measured on an H100 (driver 580): v1 480 MiB, nvidia-smi 0 MiB at idle."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert v1.total == v2.total
    assert abs(int(v1.used) - (int(v2.used) + int(v2.reserved))) <= 64 * MIB
    sample = next(s for s in reader.read() if s.index == 0)
    assert sample.memory_reserved_bytes is not None
    assert abs(sample.memory_reserved_bytes - int(v2.reserved)) <= 64 * MIB


def test_the_fake_answers_in_the_real_libraries_shapes(
    reader: NvmlReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    temperature = (pynvml.NVML_TEMPERATURE_GPU,)
    ecc = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    queries: dict[str, tuple[Any, ...]] = {
        "nvmlDeviceGetUUID": (),
        "nvmlDeviceGetName": (),
        "nvmlDeviceGetMemoryInfo": (),
        "nvmlDeviceGetMemoryInfo_v2": (pynvml.nvmlMemory_v2,),
        "nvmlDeviceGetUtilizationRates": (),
        "nvmlDeviceGetTemperature": temperature,
        "nvmlDeviceGetPowerUsage": (),
        "nvmlDeviceGetTotalEccErrors": ecc,
    }
    real = {n: _call(_fn(n), real_handle, *args) for n, args in queries.items()}
    real["nvmlSystemGetDriverVersion"] = _call(pynvml.nvmlSystemGetDriverVersion)
    real_mig = _call(pynvml.nvmlDeviceGetMigMode, real_handle)
    real_wait = _call(pynvml.nvmlEventSetWait, pynvml.nvmlEventSetCreate(), 1)

    # the fake, configured as this GPU is (MIG and ECC support as NVML reports them)
    mig_mode = None if real_mig[0] == "error" else int(real_mig[1][0])
    ecc_count = real["nvmlDeviceGetTotalEccErrors"]
    fake = FakeNvml(
        gpus=[
            FakeGpu(
                uuid="GPU-fake",
                mig_mode=mig_mode,
                ecc_uncorrected=None if ecc_count[0] == "error" else 0,
            )
        ]
    )
    fake.install(monkeypatch.setattr)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    faked = {name: _call(_fn(name), handle, *args) for name, args in queries.items()}
    faked["nvmlSystemGetDriverVersion"] = _call(pynvml.nvmlSystemGetDriverVersion)
    fake_mig = _call(pynvml.nvmlDeviceGetMigMode, handle)
    fake_wait = _call(pynvml.nvmlEventSetWait, pynvml.nvmlEventSetCreate(), 1)

    for name in real:
        got, want = faked[name], real[name]
        assert (got[0], _shape(got[1])) == (want[0], _shape(want[1])), name
    assert (real_mig[0], _shape(real_mig[1])) == (fake_mig[0], _shape(fake_mig[1]))
    assert real_wait == fake_wait == ("error", "NVMLError_Timeout")
