"""`python -m controller`: offline dry run over snapshot files, live mode, explain, agent.

The offline path imports only PyYAML and click (no kubernetes client): live mode, the health
check and the node agent are imported lazily, only when asked for.

Exit codes: 0 ok (bad objects are reported, not fatal); 1 live mode or health check failed, or
its module is missing; 2 a snapshot file cannot be parsed at all, or the configuration is
invalid (every error listed).
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, ClassVar

import click

from controller.config import SETTING_FIELDS, ConfigError, Settings, load_settings
from controller.parse import SnapshotFileError, load_snapshot
from controller.plan import Plan
from controller.render import (
    NOT_DECIDED,
    OUTPUTS,
    explain,
    explain_dict,
    find_decision,
    render,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

log = logging.getLogger("controller")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)


def _parse_now(value: str | None) -> datetime:
    if not value:
        return datetime.now(UTC)
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"not an RFC 3339 time: {value!r}", param_hint="--now") from None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _flag(key: str) -> str:
    return "--" + key.lower().replace("_", "-")


def _config_flags(f: Any) -> Any:
    """One `--some-key VALUE` flag per config key (its env var is the key itself, read by the
    config loader, so precedence stays file < env < flag)."""
    for key in reversed(list(SETTING_FIELDS)):
        if key == "LOG_LEVEL":  # has its own flag with choices
            continue
        doc = SETTING_FIELDS[key].metadata["doc"]
        f = click.option(_flag(key), "cfg_" + key, default=None, metavar="VALUE",
                         help=f"{doc} [config {key}, env {key}]")(f)
    return f


def _overrides(
    log_level: str | None, sets: tuple[str, ...], flags: dict[str, Any] | None = None
) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in (flags or {}).items():
        if name.startswith("cfg_") and value is not None:
            out[name[4:]] = value
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        out[key.strip()] = value
    if log_level:
        out["LOG_LEVEL"] = log_level
    return out


def _settings(
    config_path: str | None,
    log_level: str | None,
    sets: tuple[str, ...],
    flags: dict[str, Any] | None = None,
) -> Settings:
    try:
        return load_settings(config_path, overrides=_overrides(log_level, sets, flags))
    except ConfigError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(EXIT_BAD_INPUT)


def offline_plan(paths: tuple[str, ...], settings: Settings, now: str | None) -> Plan:
    """Parse snapshot files and compute the plan; exits 2 when a file cannot be parsed.
    The clock is --now, else the snapshot's newest timestamp (a file is a frozen moment:
    judging it by today's clock would cap every wait), else the current time."""
    from controller.policy import compute_plan

    try:
        snapshot = load_snapshot(paths)
    except SnapshotFileError as exc:
        click.echo(f"error: cannot parse snapshot: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    clock = _parse_now(now) if now else (snapshot.observed or _parse_now(None))
    return compute_plan(snapshot, settings, clock)


def _lazy(module: str, attr: str) -> Any:
    """Import `module.attr` only when needed (kubernetes client stays out of offline runs)."""
    return getattr(importlib.import_module(module), attr)


class _Group(click.Group):
    """Registers `agent`, `why` and `reset` lazily, so the offline path never imports their
    dependencies."""

    LAZY: ClassVar[dict[str, tuple[str, str]]] = {
        "agent": ("controller.agent.cli", "agent"),
        "why": ("controller.why", "why_cmd"),  # namespace-scoped: why is my job waiting?
        "reset": ("controller.reset", "reset_cmd"),  # undo the controller's writes
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            module, attr = self.LAZY[cmd_name]
            try:
                    cmd = _lazy(module, attr)
            except (ImportError, AttributeError) as exc:
                return _unavailable(cmd_name, module, exc)
            if isinstance(cmd, click.Command):
                return cmd
            return _unavailable(cmd_name, module, TypeError(f"{attr} is not a click command"))
        return super().get_command(ctx, cmd_name)


def _unavailable(name: str, module: str, exc: Exception) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def cmd(args: tuple[str, ...]) -> None:
        click.echo(f"error: `{name}` is not available ({module}: {exc})", err=True)
        sys.exit(EXIT_FAILED)

    return cmd


_FILE_HELP = ("Snapshot file, directory or - for stdin (YAML/JSON, e.g. kubectl get -o yaml); "
              "repeatable.")


@click.group(cls=_Group, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dry-run", is_flag=True, envvar="WDRF_DRY_RUN", show_envvar=True,
              help="Compute and print the plan, write nothing.")
@click.option("--once", is_flag=True, envvar="WDRF_ONCE", show_envvar=True,
              help="Live mode: run one cycle and exit.")
@click.option("--from-file", "from_file", multiple=True, type=click.Path(),
              envvar="WDRF_FROM_FILE", show_envvar=True, help=_FILE_HELP)
@click.option("--output", "-o", type=click.Choice(OUTPUTS), default="table",
              envvar="WDRF_OUTPUT", show_envvar=True, show_default=True)
@click.option("--config", "config_path", type=click.Path(), envvar="WDRF_CONFIG",
              show_envvar=True, help="Config file (default: ./config.yaml if present).")
@click.option("--log-level", envvar="LOG_LEVEL", show_envvar=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                                case_sensitive=False))
@click.option("--health-check", is_flag=True, envvar="WDRF_HEALTH_CHECK", show_envvar=True,
              help="Check the live controller's health and exit (0 healthy).")
@click.option("--now", envvar="WDRF_NOW", show_envvar=True,
              help="Clock for the plan (RFC 3339). Default: with --from-file the newest "
              "timestamp in the snapshot, else the current time.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", envvar="WDRF_SET",
              show_envvar=True, help="Override any config key, e.g. --set AGING_COEFFICIENT=2.")
@_config_flags
@click.pass_context
def main(
    ctx: click.Context,
    /,
    dry_run: bool,
    once: bool,
    from_file: tuple[str, ...],
    output: str,
    config_path: str | None,
    log_level: str | None,
    health_check: bool,
    now: str | None,
    sets: tuple[str, ...],
    **flags: Any,
) -> None:
    """WDRF controller: weighted-DRF fairness, approval classes and aging for Kueue + HAMi.

    With --from-file: compute the plan offline and print it (never writes).
    Without: live mode against the cluster (--dry-run: compute, print, write nothing).
    """
    ctx.ensure_object(dict)
    ctx.obj.update(from_file=from_file, output=output, config_path=config_path,
                   log_level=log_level, now=now, sets=sets, flags=flags)
    if ctx.invoked_subcommand is not None:
        return
    settings = _settings(config_path, log_level, sets, flags)
    setup_logging(settings)
    if health_check:
        try:
            run_health_check = _lazy("controller.live.health", "run_health_check")
        except (ImportError, AttributeError) as exc:
            click.echo(f"error: health check unavailable (controller.live.health: {exc})",
                       err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(int(run_health_check(settings)))
    if from_file:
        plan = offline_plan(from_file, settings, now)
        click.echo(render(plan, output, settings))
        sys.exit(EXIT_OK)
    try:
        run_live = _lazy("controller.live.main", "run_live")
    except (ImportError, AttributeError) as exc:
        click.echo(
            f"error: live mode unavailable (controller.live.main: {exc}); "
            "use --from-file SNAPSHOT for an offline dry run",
            err=True,
        )
        sys.exit(EXIT_FAILED)
    sys.exit(int(run_live(settings, dry_run=dry_run, once=once, output=output)))


@main.command("explain")
@click.argument("workload", metavar="NAMESPACE/WORKLOAD")
@click.option("--from-file", "from_file", multiple=True, type=click.Path(), help=_FILE_HELP)
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@click.pass_context
def explain_cmd(ctx: click.Context, workload: str, from_file: tuple[str, ...], output: str) -> None:
    """Why a pending workload gets its priority and ranks where it does."""
    opts: dict[str, Any] = ctx.obj or {}
    if "/" not in workload:
        raise click.BadParameter("expected NAMESPACE/WORKLOAD", param_hint="WORKLOAD")
    settings = _settings(opts.get("config_path"), opts.get("log_level"), opts.get("sets", ()),
                         opts.get("flags"))
    setup_logging(settings)
    files = tuple(opts.get("from_file", ())) + from_file
    if files:
        plan = offline_plan(files, settings, opts.get("now"))
    else:
        try:
            live_plan = _lazy("controller.live.main", "live_plan")
        except (ImportError, AttributeError) as exc:
            click.echo(f"error: explain without --from-file needs live mode "
                       f"(controller.live.main.live_plan: {exc})", err=True)
            sys.exit(EXIT_FAILED)
        try:
            plan = live_plan(settings, _parse_now(opts.get("now")))
        except Exception as exc:  # LiveError: one line, no traceback
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_FAILED)
        if not isinstance(plan, Plan):
            click.echo("error: controller.live.main.live_plan returned no Plan", err=True)
            sys.exit(EXIT_FAILED)
    if find_decision(plan, workload) is None:
        click.echo(f"{workload}: {NOT_DECIDED}", err=True)
        sys.exit(EXIT_FAILED)
    if output == "json":
        click.echo(json.dumps(explain_dict(plan, workload), indent=2, allow_nan=False))
        return
    click.echo(explain(plan, workload, settings))
