"""The agent's NVML reading, health rules and metrics, driven through a fake pynvml.

The fake replaces the functions of the real ``pynvml`` module (the lowest seam), so
``controller.agent.nvml`` runs unchanged and sees real ``pynvml.NVMLError`` subclasses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from controller.agent import nvml as agent_nvml
from controller.agent.health import HealthPolicy, assess
from controller.agent.metrics import new_registry, render
from controller.agent.nvml import GpuSample, NoDriverError, NvmlReader, NvmlReadError
from controller.agent.runner import Agent, AgentConfig
from controller.inventory import encode_agent_inventory
from tests.support.fakenvml import GIB, H100, H100_BYTES, FakeGpu, FakeMig, FakeNvml, h100s

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
A100 = "NVIDIA A100-SXM4-40GB"
MIB = 1024 * 1024


def test_the_real_pynvml_is_imported() -> None:
    assert vars(agent_nvml)["pynvml"] is pynvml
    assert pynvml.__file__.endswith("pynvml.py")
    assert hasattr(pynvml, "nvmlDeviceGetMigMode")  # nvidia-ml-py, not a stub


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    f = FakeNvml()
    f.install(monkeypatch.setattr)
    yield f


def make_agent(max_temperature: int = 85) -> tuple[Agent, CollectorRegistry]:
    registry, collector = new_registry()
    config = AgentConfig("gpu-node-1", health=HealthPolicy(max_temperature_c=max_temperature))
    agent = Agent(config, NvmlReader(), collector, client=None, clock=lambda: NOW)
    agent.start()
    return agent, registry


def inventory_json(agent: Agent) -> dict[str, Any]:
    result = agent.step()
    assert result.inventory is not None
    body: dict[str, Any] = json.loads(encode_agent_inventory(result.inventory))
    return body


def samples(metrics_text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return metrics.get((name, tuple(sorted(labels.items()))))


# ------------------------------------------------------------------ 0, 1 and 8 GPUs


def test_zero_gpus(fake: FakeNvml) -> None:
    agent, registry = make_agent()
    body = inventory_json(agent)
    assert body == {"v": 1, "observed": "2025-06-01T12:00:00Z", "driver": "550.54.15", "gpus": []}
    m = samples(render(registry))
    assert value(m, "wdrf_gpus") == 0
    assert value(m, "wdrf_gpu_nvml_up") == 1
    assert not any(name == "wdrf_gpu_info" for name, _ in m)


def test_one_gpu_inventory_and_metrics(fake: FakeNvml) -> None:
    fake.gpus = [
        FakeGpu(
            "GPU-aaaa",
            memory_used=10 * 1024**3,
            util_gpu=37,
            util_memory=12,
            temperature=55,
            power_mw=312_500,
        )
    ]
    agent, registry = make_agent()
    body = inventory_json(agent)
    assert body["gpus"] == [
        {"uuid": "GPU-aaaa", "index": 0, "model": H100, "memMiB": 81559, "healthy": True}
    ]
    m = samples(render(registry))
    gpu = {"uuid": "GPU-aaaa", "index": "0"}
    assert value(m, "wdrf_gpu_info", **gpu, model=H100, driver="550.54.15") == 1
    assert value(m, "wdrf_gpu_healthy", **gpu) == 1
    assert value(m, "wdrf_gpu_memory_total_bytes", **gpu) == H100_BYTES
    assert value(m, "wdrf_gpu_memory_used_bytes", **gpu) == 10 * 1024**3
    assert value(m, "wdrf_gpu_utilization_ratio", **gpu) == pytest.approx(0.37)
    assert value(m, "wdrf_gpu_memory_busy_ratio", **gpu) == pytest.approx(0.12)
    assert value(m, "wdrf_gpu_temperature_celsius", **gpu) == 55
    assert value(m, "wdrf_gpu_power_watts", **gpu) == pytest.approx(312.5)
    assert value(m, "wdrf_gpu_ecc_uncorrected_errors", **gpu) == 0
    assert value(m, "wdrf_gpu_mig_enabled", **gpu) == 0
    assert value(m, "wdrf_gpu_xid_errors_total", **gpu) == 0
    assert value(m, "wdrf_gpus") == 1 and value(m, "wdrf_gpus_healthy") == 1
    assert value(m, "wdrf_gpu_last_read_timestamp_seconds") == NOW.timestamp()


@pytest.mark.parametrize("driver_has_v2", [True, False])
def test_memory_in_use_leaves_out_the_drivers_reservation(
    fake: FakeNvml, driver_has_v2: bool
) -> None:
    """NVML's v1 memory info counts the driver's reservation as used (480 MiB on a real idle
    H100, where nvidia-smi shows 0); the agent reads v2 and falls back to v1 without it."""
    fake.gpus = [
        FakeGpu("GPU-aaaa", memory_used=GIB, memory_reserved=480 * MIB, memory_v2=driver_has_v2)
    ]
    agent, registry = make_agent()
    agent.step()
    m = samples(render(registry))
    gpu = {"uuid": "GPU-aaaa", "index": "0"}
    if driver_has_v2:
        assert value(m, "wdrf_gpu_memory_used_bytes", **gpu) == GIB
        assert value(m, "wdrf_gpu_memory_reserved_bytes", **gpu) == 480 * MIB
    else:
        assert value(m, "wdrf_gpu_memory_used_bytes", **gpu) == GIB + 480 * MIB
        assert value(m, "wdrf_gpu_memory_reserved_bytes", **gpu) is None
    assert value(m, "wdrf_gpu_healthy", **gpu) == 1


def test_eight_gpus(fake: FakeNvml) -> None:
    fake.gpus = h100s(8)
    agent, registry = make_agent()
    body = inventory_json(agent)
    gpus = body["gpus"]
    assert isinstance(gpus, list)
    assert [g["index"] for g in gpus] == list(range(8))
    assert [g["uuid"] for g in gpus] == [f"GPU-{i:04d}" for i in range(8)]
    assert all(g["healthy"] and g["memMiB"] == 81559 for g in gpus)
    text = render(registry)
    m = samples(text)
    assert value(m, "wdrf_gpus") == 8
    for i in range(8):
        assert value(m, "wdrf_gpu_healthy", uuid=f"GPU-{i:04d}", index=str(i)) == 1
    assert text.count("wdrf_gpu_temperature_celsius{") == 8


def test_an_unchanged_node_reads_to_the_same_content(fake: FakeNvml) -> None:
    fake.gpus = h100s(8)
    agent, _ = make_agent()
    first = agent.step().inventory
    fake.gpus[3].util_gpu = 99  # live readings are metrics, not inventory content
    fake.gpus[3].temperature = 70
    fake.gpus[3].memory_used = 5 * 1024**3
    second = agent.step().inventory
    assert first is not None and second is not None
    assert first.content_key() == second.content_key()


# ------------------------------------------------------------------ MIG


def test_mig_on(fake: FakeNvml) -> None:
    fake.gpus = [
        FakeGpu(
            "GPU-mig",
            name=A100,
            memory_total=40960 * 1024**2,
            mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
            migs={
                0: FakeMig("MIG-a", "3g.20gb", 19968 * 1024**2, 512 * 1024**2, 1, 0),
                3: FakeMig("MIG-b", "1g.5gb", 4864 * 1024**2, 0, 9, 0),
            },
        )
    ]
    agent, registry = make_agent()
    (gpu,) = inventory_json(agent)["gpus"]
    assert gpu == {
        "uuid": "GPU-mig",
        "index": 0,
        "model": A100,
        "memMiB": 40960,
        "healthy": True,
        "mig": True,
        "migInstances": [
            {"uuid": "MIG-a", "profile": "3g.20gb", "memMiB": 19968, "gi": 1, "ci": 0},
            {"uuid": "MIG-b", "profile": "1g.5gb", "memMiB": 4864, "gi": 9, "ci": 0},
        ],
    }
    m = samples(render(registry))
    lab = {"uuid": "GPU-mig", "index": "0"}
    assert value(m, "wdrf_gpu_mig_enabled", **lab) == 1
    assert value(m, "wdrf_gpu_mig_instances", **lab) == 2
    # utilisation is not supported per physical GPU in MIG mode: not exported, not an error
    assert value(m, "wdrf_gpu_utilization_ratio", **lab) is None
    assert value(m, "wdrf_gpu_healthy", **lab) == 1
    mig = {**lab, "mig_uuid": "MIG-a", "profile": "3g.20gb"}
    assert value(m, "wdrf_gpu_mig_memory_total_bytes", **mig) == 19968 * 1024**2
    assert value(m, "wdrf_gpu_mig_memory_used_bytes", **mig) == 512 * 1024**2


def test_mig_capable_but_off(fake: FakeNvml) -> None:
    fake.gpus = [FakeGpu("GPU-off", mig_mode=pynvml.NVML_DEVICE_MIG_DISABLE)]
    agent, registry = make_agent()
    (gpu,) = inventory_json(agent)["gpus"]
    assert "mig" not in gpu and "migInstances" not in gpu
    assert "nvmlDeviceGetMaxMigDeviceCount" not in fake.calls
    m = samples(render(registry))
    assert value(m, "wdrf_gpu_mig_enabled", uuid="GPU-off", index="0") == 0


# ------------------------------------------------------------------ failures


def test_nvml_error_mid_read_marks_only_that_gpu(fake: FakeNvml) -> None:
    fake.gpus = h100s(3)
    fake.gpus[1].fail = {"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_GPU_IS_LOST}
    agent, registry = make_agent()
    gpus = inventory_json(agent)["gpus"]
    assert isinstance(gpus, list)
    assert [g["healthy"] for g in gpus] == [True, False, True]
    assert gpus[1]["reasons"] == ["NVML error reading power: GPU is lost"]
    assert gpus[1]["uuid"] == "GPU-0001" and gpus[1]["memMiB"] == 81559  # rest of it was read
    m = samples(render(registry))
    assert value(m, "wdrf_gpu_healthy", uuid="GPU-0001", index="1") == 0
    assert value(m, "wdrf_gpu_power_watts", uuid="GPU-0001", index="1") is None
    assert value(m, "wdrf_gpu_power_watts", uuid="GPU-0002", index="2") == 70
    assert value(m, "wdrf_gpus_healthy") == 2


def test_gpu_that_cannot_be_opened_is_listed_unhealthy(fake: FakeNvml) -> None:
    fake.gpus = h100s(2)
    fake.gpus[0].fail = {"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST}
    agent, _ = make_agent()
    gpus = inventory_json(agent)["gpus"]
    assert isinstance(gpus, list)
    assert gpus[0]["uuid"] == "unknown-gpu-0" and gpus[0]["healthy"] is False
    assert gpus[0]["reasons"] == ["NVML error opening GPU 0: GPU is lost"]
    assert gpus[1]["healthy"] is True


def test_unsupported_fields_are_not_errors(fake: FakeNvml) -> None:
    fake.gpus = [FakeGpu("GPU-geforce", name="NVIDIA GeForce RTX 4090", ecc_uncorrected=None)]
    fake.gpus[0].fail = {
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_NO_PERMISSION,
    }
    agent, registry = make_agent()
    (gpu,) = inventory_json(agent)["gpus"]
    assert gpu["healthy"] is True
    m = samples(render(registry))
    assert value(m, "wdrf_gpu_ecc_uncorrected_errors", uuid="GPU-geforce", index="0") is None


def test_hot_gpu_with_hysteresis(fake: FakeNvml) -> None:
    fake.gpus = h100s(2)
    fake.gpus[1].temperature = 91
    agent, registry = make_agent(max_temperature=85)
    gpus = inventory_json(agent)["gpus"]
    assert isinstance(gpus, list)
    assert gpus[1]["healthy"] is False and gpus[1]["reasons"] == ["temperature above 85C"]
    assert (
        value(
            samples(render(registry)),
            "wdrf_gpu_temperature_celsius",
            uuid="GPU-0001",
            index="1",
        )
        == 91
    )
    fake.gpus[1].temperature = 83  # below the limit but not below limit - hysteresis (80)
    assert inventory_json(agent)["gpus"][1]["healthy"] is False
    fake.gpus[1].temperature = 79
    assert inventory_json(agent)["gpus"][1]["healthy"] is True
    fake.gpus[1].temperature = 84  # not hot again until above 85
    assert inventory_json(agent)["gpus"][1]["healthy"] is True


def test_ecc_failing_gpu(fake: FakeNvml) -> None:
    fake.gpus = h100s(2)
    fake.gpus[0].ecc_uncorrected = 3
    agent, registry = make_agent()
    gpus = inventory_json(agent)["gpus"]
    assert isinstance(gpus, list)
    assert gpus[0]["healthy"] is False and gpus[0]["reasons"] == ["uncorrectable ECC errors"]
    m = samples(render(registry))
    assert value(m, "wdrf_gpu_ecc_uncorrected_errors", uuid="GPU-0000", index="0") == 3
    assert value(m, "wdrf_gpu_healthy", uuid="GPU-0000", index="0") == 0


def test_critical_xid_is_sticky_and_application_xids_are_ignored(fake: FakeNvml) -> None:
    fake.gpus = h100s(2)
    agent, registry = make_agent()
    fake.gpus[0].xids = [13, 31]  # application faults
    fake.gpus[1].xids = [79]  # fallen off the bus
    gpus = inventory_json(agent)["gpus"]
    assert isinstance(gpus, list)
    assert gpus[0]["healthy"] is True
    assert gpus[1]["healthy"] is False and gpus[1]["reasons"] == ["critical XID 79"]
    assert inventory_json(agent)["gpus"][1]["healthy"] is False
    m = samples(render(registry))
    assert value(m, "wdrf_gpu_xid_errors_total", uuid="GPU-0001", index="1") == 1
    assert value(m, "wdrf_gpu_xid_errors_total", uuid="GPU-0000", index="0") == 0


def test_several_reasons_are_all_listed(fake: FakeNvml) -> None:
    fake.gpus = [FakeGpu("GPU-x", temperature=99, ecc_uncorrected=1)]
    fake.gpus[0].fail = {"nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_UNKNOWN}
    agent, _ = make_agent()
    (gpu,) = inventory_json(agent)["gpus"]
    assert gpu["reasons"] == [
        "NVML error reading utilization: Unknown Error",
        "uncorrectable ECC errors",
        "temperature above 85C",
    ]


def test_whole_node_failure_marks_known_gpus_unhealthy(fake: FakeNvml) -> None:
    fake.gpus = h100s(2)
    agent, registry = make_agent()
    assert agent.step().inventory is not None
    fake.count_error = pynvml.NVML_ERROR_UNKNOWN
    result = agent.step()
    assert result.inventory is not None
    assert [g.healthy for g in result.inventory.gpus] == [False, False]
    assert result.inventory.gpus[0].reasons == ("NVML error counting GPUs: Unknown Error",)
    m = samples(render(registry))
    assert value(m, "wdrf_gpu_nvml_up") == 0


def test_reader_raises_read_error_when_count_fails(fake: FakeNvml) -> None:
    fake.count_error = pynvml.NVML_ERROR_GPU_IS_LOST
    reader = NvmlReader(watch_xids=False)
    reader.open()
    with pytest.raises(NvmlReadError, match="GPU is lost"):
        reader.read()
    reader.close()
    assert fake.calls[-1] == "nvmlShutdown"


# ------------------------------------------------------------------ no driver


def test_no_driver_raises_a_clear_error(fake: FakeNvml) -> None:
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(NoDriverError) as exc:
        NvmlReader().open()
    assert str(exc.value) == "no NVIDIA driver: Driver Not Loaded"
    assert isinstance(exc.value.error, pynvml.NVMLError_DriverNotLoaded)


def test_allow_no_gpu_serves_zero_and_picks_up_a_late_driver(fake: FakeNvml) -> None:
    fake.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    registry, collector = new_registry()
    config = AgentConfig("n", allow_no_gpu=True)
    agent = Agent(config, NvmlReader(), collector, clock=lambda: NOW)
    agent.start()
    result = agent.step()
    assert result.inventory is None  # unknown is not zero: nothing to publish
    assert result.problem == "no NVIDIA driver: NVML Shared Library Not Found"
    m = samples(render(registry))
    assert value(m, "wdrf_gpus") == 0 and value(m, "wdrf_gpu_nvml_up") == 0
    fake.init_error = None  # the driver container finished installing
    fake.gpus = h100s(1)
    result = agent.step()
    assert result.inventory is not None and len(result.inventory.gpus) == 1
    assert value(samples(render(registry)), "wdrf_gpu_nvml_up") == 1


# ------------------------------------------------------------------ health rules (pure)


def test_health_rules_pure() -> None:
    policy = HealthPolicy(max_temperature_c=80, temperature_hysteresis_c=0)
    ok = GpuSample(index=0, uuid="G", temperature_c=80, ecc_uncorrected=0)
    assert assess(ok, policy).healthy
    hot = GpuSample(index=0, uuid="G", temperature_c=81)
    assert assess(hot, policy).reasons == ("temperature above 80C",)
    unknown_temp = GpuSample(index=0, uuid="G")
    assert assess(unknown_temp, policy, was_hot=True).hot  # no reading: keep the last verdict
    assert assess(ok, policy, xids=[43, 45, 109]).healthy
    assert assess(ok, policy, xids=[48, 48]).reasons == ("critical XID 48",)
    with pytest.raises(ValueError):
        HealthPolicy(temperature_hysteresis_c=-1)
