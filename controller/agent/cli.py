"""``agent``: the click command of the node agent (registered as ``python -m controller agent``).

Exit codes: 0 stopped normally; 1 Kubernetes or metrics-port trouble at start; 2 no NVIDIA
driver (without ``--allow-no-gpu``) or bad flags. Errors are one line on stderr, no traceback.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
from datetime import timedelta
from types import FrameType

import click

from controller.agent.health import HealthPolicy
from controller.agent.metrics import new_registry
from controller.agent.nvml import NoDriverError, NvmlReader
from controller.agent.publish import KubeError, NodeClient
from controller.agent.runner import Agent, AgentConfig
from controller.inventory import encode_agent_inventory
from controller.logs import setup_logging

EXIT_TROUBLE = 1
EXIT_NO_DRIVER = 2

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> timedelta:
    """``15``, ``15s``, ``2m``, ``1h`` -> timedelta (plain numbers are seconds)."""
    if isinstance(value, timedelta):
        return value
    m = _DURATION.match(str(value))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{value!r} is not a positive duration like 15s, 2m or 1h")
    return timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2)])


def _duration(ctx: click.Context, param: click.Parameter, value: object) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from e


def _fail(code: int, message: str) -> None:
    click.echo(message, err=True)
    sys.exit(code)


def _client(kubeconfig: str | None, context: str | None = None) -> NodeClient:
    from controller.agent.kube import KubeNodeClient, load_api_client  # kubernetes is heavy

    return KubeNodeClient(load_api_client(kubeconfig, context))


def _serve_metrics(port: int, address: str, agent_registry: object) -> None:
    from prometheus_client import start_http_server

    start_http_server(port, addr=address, registry=agent_registry)  # type: ignore[arg-type]


class _AgentCommand(click.Command):
    """Bad settings (flags or AGENT_* variables) reported like the controller's config errors:
    `KEY=value: why (from environment|command line)`, exit 2."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: object) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.BadParameter as e:
            if e.param is None or e.ctx is None:
                raise
            source = e.ctx.get_parameter_source(e.param.name or "")
            from_env = source is click.core.ParameterSource.ENVIRONMENT
            envvar = e.param.envvar if isinstance(e.param.envvar, str) else None
            key = envvar if from_env and envvar else (e.param.opts or ["?"])[0]
            value = os.environ.get(envvar, "") if from_env and envvar else ""
            where = "environment" if from_env else "command line"
            shown = f"{key}={value}" if value else key
            click.echo(f"1 configuration error(s):\n  {shown}: {e.message.rstrip('.')} "
                       f"(from {where})", err=True)
            sys.exit(EXIT_NO_DRIVER)  # 2, as every configuration error


@click.command("agent", cls=_AgentCommand)
@click.option(
    "--node-name",
    envvar="NODE_NAME",
    default="",
    show_envvar=True,
    help="This node's name (downward API spec.nodeName); needed to publish.",
)
@click.option(
    "--interval",
    envvar="AGENT_INTERVAL",
    callback=_duration,
    metavar="DURATION",
    default="15s",
    show_default=True,
    show_envvar=True,
    help="Time between NVML reads.",
)
@click.option(
    "--refresh-interval",
    envvar="AGENT_REFRESH_INTERVAL",
    callback=_duration,
    metavar="DURATION",
    default="2m",
    show_default=True,
    show_envvar=True,
    help="Re-patch an unchanged inventory this often, so its timestamp stays fresh.",
)
@click.option(
    "--metrics-port",
    envvar="AGENT_METRICS_PORT",
    type=click.IntRange(0, 65535),
    default=9400,
    show_default=True,
    show_envvar=True,
    help="Prometheus metrics port (0: no metrics server).",
)
@click.option(
    "--metrics-address",
    envvar="AGENT_METRICS_ADDRESS",
    default="0.0.0.0",
    show_default=True,
    show_envvar=True,
)
@click.option(
    "--allow-no-gpu",
    envvar="AGENT_ALLOW_NO_GPU",
    is_flag=True,
    show_envvar=True,
    help="Without a driver keep serving metrics with zero GPUs (and retry NVML).",
)
@click.option(
    "--kubeconfig",
    "--kubeconfig-path",
    "kubeconfig",
    envvar="KUBECONFIG_PATH",
    default=None,
    show_envvar=True,
    help="Kubeconfig file; default: the in-cluster ServiceAccount.",
)
@click.option(
    "--context",
    envvar="KUBECONFIG_CONTEXT",
    default=None,
    show_envvar=True,
    help="Kubeconfig context (default: its current context).",
)
@click.option(
    "--max-temperature",
    envvar="AGENT_MAX_TEMPERATURE",
    type=int,
    default=85,
    show_default=True,
    show_envvar=True,
    help="Hotter (Celsius): unhealthy.",
)
@click.option(
    "--temperature-hysteresis",
    envvar="AGENT_TEMPERATURE_HYSTERESIS",
    type=click.IntRange(0, 50),
    default=5,
    show_default=True,
    show_envvar=True,
    help="A hot GPU is healthy again below max-temperature minus this.",
)
@click.option(
    "--no-publish",
    envvar="AGENT_NO_PUBLISH",
    is_flag=True,
    show_envvar=True,
    help="Do not touch Kubernetes: metrics only.",
)
@click.option(
    "--once", is_flag=True, help="One cycle: print the inventory JSON on stdout and exit."
)
@click.option(
    "--log-level",
    envvar="AGENT_LOG_LEVEL",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    show_envvar=True,
)
def agent(
    node_name: str,
    interval: timedelta,
    refresh_interval: timedelta,
    metrics_port: int,
    metrics_address: str,
    allow_no_gpu: bool,
    kubeconfig: str | None,
    context: str | None,
    max_temperature: int,
    temperature_hysteresis: int,
    no_publish: bool,
    once: bool,
    log_level: str,
) -> None:
    """Per-node GPU agent: NVML inventory, health and utilisation for WDRF capacity."""
    setup_logging(log_level.upper())
    publish = not no_publish
    if publish and not node_name:
        raise click.UsageError("--node-name (NODE_NAME) is required unless --no-publish")
    config = AgentConfig(
        node_name=node_name or "local",
        interval=interval,
        refresh=refresh_interval,
        health=HealthPolicy(max_temperature, temperature_hysteresis),
        allow_no_gpu=allow_no_gpu,
    )
    registry, collector = new_registry()
    reader = NvmlReader()
    try:
        reader.open()  # before Kubernetes: "no driver" is the first thing to know
    except NoDriverError as e:
        if not allow_no_gpu:
            _fail(EXIT_NO_DRIVER, f"{e} (use --allow-no-gpu to serve metrics with zero GPUs)")
            return
    try:
        client = _client(kubeconfig, context) if publish else None
        runner = Agent(config, reader, collector, client)
        runner.start()
    except KubeError as e:
        reader.close()
        _fail(EXIT_TROUBLE, f"wdrf agent: {e}")
        return
    try:
        if once:
            result = runner.step()
            if result.inventory is not None:
                click.echo(encode_agent_inventory(result.inventory))
            else:
                click.echo(f"wdrf agent: zero GPUs: {result.problem}", err=True)
            return
        if metrics_port:
            try:
                _serve_metrics(metrics_port, metrics_address, registry)
            except OSError as e:
                _fail(EXIT_TROUBLE, f"wdrf agent: metrics port {metrics_port}: {e}")
        _run_until_signalled(runner)
    finally:
        runner.close()


def _run_until_signalled(runner: Agent) -> None:
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    runner.run(stop)
