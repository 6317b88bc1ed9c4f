"""The ``agent`` command: flags and env vars, and real runs on this machine (no NVIDIA driver)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner

from controller.agent.cli import agent, parse_duration
from tests.support.fakenvml import FakeNvml, h100s

ROOT = Path(__file__).resolve().parents[2]


def _no_real_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return True
    pynvml.nvmlShutdown()
    return False


needs_no_driver = pytest.mark.skipif(
    not _no_real_driver(), reason="this machine has an NVIDIA driver"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "NODE_NAME"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    f = FakeNvml(gpus=h100s(2))
    f.install(monkeypatch.setattr)
    yield f


# ------------------------------------------------------------------ in process, fake NVML


def test_once_prints_the_inventory(fake: FakeNvml) -> None:
    result = CliRunner().invoke(agent, ["--once", "--no-publish"], env=_env())
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout.strip().splitlines()[-1])
    assert [g["uuid"] for g in body["gpus"]] == ["GPU-0000", "GPU-0001"]


def test_env_vars_configure_the_health_rule(fake: FakeNvml) -> None:
    fake.gpus[1].temperature = 75
    env = _env(AGENT_MAX_TEMPERATURE="70", AGENT_NO_PUBLISH="true", AGENT_INTERVAL="1m")
    result = CliRunner().invoke(agent, ["--once"], env=env)
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout.strip().splitlines()[-1])
    assert body["gpus"][1]["reasons"] == ["temperature above 70C"]


def test_node_name_is_required_to_publish(fake: FakeNvml) -> None:
    result = CliRunner().invoke(agent, ["--once"], env=_env())
    assert result.exit_code == 2
    assert "--node-name (NODE_NAME) is required" in result.output


def test_bad_kubeconfig_is_one_line_exit_1(fake: FakeNvml, tmp_path: Path) -> None:
    env = _env(NODE_NAME="gpu-1", KUBECONFIG_PATH=str(tmp_path / "missing"))
    result = CliRunner().invoke(agent, ["--once"], env=env)
    assert result.exit_code == 1
    assert "wdrf agent: cannot load Kubernetes credentials" in result.output
    assert "Traceback" not in result.output


def test_fake_driver_not_loaded_exit_2(fake: FakeNvml) -> None:
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    result = CliRunner().invoke(agent, ["--no-publish"], env=_env())
    assert result.exit_code == 2
    assert result.output.startswith("no NVIDIA driver: Driver Not Loaded")


@pytest.mark.parametrize(
    ("text", "seconds"), [("15", 15), ("15s", 15), ("2m", 120), ("1h", 3600), ("500ms", 0.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["0", "-1s", "soon", "5d", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


# ------------------------------------------------------------------ for real on this machine


@needs_no_driver
def test_real_run_without_driver_says_so_and_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "controller.agent", "--node-name", "gpu-1"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    first = proc.stderr.strip().splitlines()[0]
    assert first.startswith("no NVIDIA driver: NVML Shared Library Not Found")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


@needs_no_driver
def test_real_run_through_the_package_cli() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "agent", "--no-publish"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no NVIDIA driver: " in proc.stderr
    assert "Traceback" not in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_no_driver
def test_real_run_allow_no_gpu_serves_zero_gpu_metrics() -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller.agent",
            "--no-publish",
            "--allow-no-gpu",
            "--metrics-address",
            "127.0.0.1",
            "--interval",
            "1s",
        ],
        cwd=ROOT,
        env=_env(AGENT_METRICS_PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                if "wdrf_gpus" in text:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert "wdrf_gpus 0.0" in text
        assert "wdrf_gpu_nvml_up 0.0" in text
        assert "wdrf_gpu_info{" not in text
        assert "python_gc_objects" not in text  # own registry, only the agent's metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "no NVIDIA driver: NVML Shared Library Not Found; serving metrics with zero GPUs" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("env", "args", "says"), [
    ({"AGENT_LOG_LEVEL": "trace"}, [], "AGENT_LOG_LEVEL=trace: 'trace' is not one of"),
    ({"AGENT_INTERVAL": "0"}, [], "AGENT_INTERVAL=0: '0' is not a positive duration"),
    ({}, ["--metrics-port", "70000"], "--metrics-port: "),
])
def test_bad_settings_read_like_the_controllers_config_errors(
    fake: FakeNvml, env: dict[str, str], args: list[str], says: str
) -> None:
    result = CliRunner().invoke(agent, ["--once", "--no-publish", *args], env=_env(**env))
    assert result.exit_code == 2
    assert result.output.startswith("1 configuration error(s):\n"), result.output
    assert says in result.output and ("(from environment)" if env else "(from command line)") \
        in result.output


def test_log_level_in_any_case(fake: FakeNvml) -> None:
    result = CliRunner().invoke(agent, ["--once", "--no-publish"],
                                env=_env(AGENT_LOG_LEVEL="DEBUG"))
    assert result.exit_code == 0, result.output
