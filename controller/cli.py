"""`python -m controller`: offline dry run over snapshot files, live mode, explain, agent.

The offline path imports only PyYAML and click (no kubernetes client): live mode, the health
check and the node agent are imported lazily, only when asked for.

Exit codes: 0 ok (bad objects are reported, not fatal); 1 live mode or health check failed, or
its module is missing; 2 a snapshot file cannot be parsed at all, or the configuration is
invalid (every error listed).
"""

from __future__ import annotations

import importlib
import logging
import sys
from datetime import UTC, datetime
from typing import Any, ClassVar

import click

from controller import __version__, logs
from controller.config import SETTING_FIELDS, ConfigError, Settings, load_settings
from controller.domain import ClusterSnapshot
from controller.parse import SnapshotFileError, load_snapshot
from controller.plan import Plan
from controller.render import (
    NOT_DECIDED,
    explain,
    explain_dict,
    find_decision,
    machine,
    output_option,
    render,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

log = logging.getLogger("controller")


def setup_logging(settings: Settings) -> None:
    """The one logging set-up of every command (controller.logs)."""
    logs.setup_logging(settings.log_level, settings.log_format)


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


# The flags every command that talks to a cluster has (the config key's own flag stays too).
FLAG_ALIASES = {"KUBECONFIG_PATH": "--kubeconfig", "KUBECONFIG_CONTEXT": "--context"}


def _config_flags(f: Any) -> Any:
    """One `--some-key VALUE` flag per config key. Its environment variable is the key itself,
    read by the config loader like the file, so a bad value is a config error like any other
    and precedence stays file < environment < flag."""
    for key in reversed(list(SETTING_FIELDS)):
        doc = SETTING_FIELDS[key].metadata["doc"]
        names = [FLAG_ALIASES[key], _flag(key)] if key in FLAG_ALIASES else [_flag(key)]
        f = click.option(*names, "cfg_" + key, default=None, metavar="VALUE",
                         help=f"{doc} [config {key}, env {key}]")(f)
    return f


def _overrides(sets: tuple[str, ...], flags: dict[str, Any] | None = None) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in (flags or {}).items():
        if name.startswith("cfg_") and value is not None:
            out[name[4:]] = value
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        out[key.strip()] = value
    return out


def _settings(
    config_path: str | None, sets: tuple[str, ...], flags: dict[str, Any] | None = None
) -> Settings:
    try:
        return load_settings(config_path, overrides=_overrides(sets, flags))
    except ConfigError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(EXIT_BAD_INPUT)


def offline_plan(paths: tuple[str, ...], settings: Settings, now: str | None) -> Plan:
    """Parse snapshot files and compute the plan; exits 2 when a file cannot be parsed.
    The clock is --now, else the snapshot's newest timestamp (a file is a frozen moment:
    judging it by today's clock would cap every wait), else the current time."""
    return offline_plan_and_snapshot(paths, settings, now)[0]


def offline_plan_and_snapshot(
    paths: tuple[str, ...], settings: Settings, now: str | None
) -> tuple[Plan, ClusterSnapshot]:
    from controller.collector import paused
    from controller.policy import compute_plan

    try:
        snapshot = load_snapshot(paths)
    except SnapshotFileError as exc:
        click.echo(f"error: snapshot: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    clock = _parse_now(now) if now else (snapshot.observed or _parse_now(None))
    with paused():  # one plan, no cyclic garbage: the collector would only walk the heap
        return compute_plan(snapshot, settings, clock), snapshot


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
    @click.command(name, context_settings={"ignore_unknown_options": True},
                   help=f"Not available here: {module} cannot be imported ({exc}); install the "
                   "package's dependencies (pip install .).")
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def cmd(args: tuple[str, ...]) -> None:
        click.echo(f"error: `{name}` is not available ({module}: {exc})", err=True)
        sys.exit(EXIT_FAILED)

    return cmd


_FILE_HELP = ("Snapshot file, directory or - for stdin (YAML/JSON, e.g. kubectl get -o yaml); "
              "repeatable.")


@click.group(cls=_Group, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="wdrf-controller")
@click.option("--dry-run", is_flag=True, help="Compute and print the plan, write nothing.")
@click.option("--once", is_flag=True, help="Live mode: run one cycle and exit.")
@click.option("--from-file", "from_file", multiple=True, type=click.Path(), help=_FILE_HELP)
@output_option
@click.option("--config", "config_path", type=click.Path(),
              help="Config file (default: ./config.yaml if present).")
@click.option("--health-check", is_flag=True,
              help="Check the live controller's health and exit (0 healthy).")
@click.option("--now", help="Clock for the plan (RFC 3339). Default: with --from-file the newest "
              "timestamp in the snapshot, else the current time.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set AGING_COEFFICIENT=2.")
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
    health_check: bool,
    now: str | None,
    sets: tuple[str, ...],
    **flags: Any,
) -> None:
    """WDRF controller: weighted-DRF fairness, approval classes and aging for Kueue + HAMi.

    With --from-file: compute the plan offline and print it (never writes).
    Without: live mode against the cluster (--dry-run: compute, print, write nothing).

    Environment variables set config keys under their own names (LOG_LEVEL, LOOP_INTERVAL,
    KUBECONFIG_PATH, ...); everything else is a flag.
    """
    ctx.ensure_object(dict)
    ctx.obj.update(from_file=from_file, output=output, config_path=config_path,
                   now=now, sets=sets, flags=flags)
    if ctx.invoked_subcommand is not None:
        return
    settings = _settings(config_path, sets, flags)
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
@click.argument("workload", metavar="[NAMESPACE/]NAME")
@click.option("-n", "--namespace", default=None,
              help="Namespace (default: NAMESPACE/ in the argument, else the kubeconfig's).")
@click.option("--kind", default=None,
              help="Owner kind when NAME is ambiguous (job, jobset, ..., or workload).")
@click.option("--from-file", "from_file", multiple=True, type=click.Path(), help=_FILE_HELP)
@output_option
@click.pass_context
def explain_cmd(ctx: click.Context, workload: str, namespace: str | None, kind: str | None,
                from_file: tuple[str, ...], output: str) -> None:
    """Why a workload gets its priority and ranks where it does. NAME is the Workload's or its
    owner's (a Job, a JobSet, ...)."""
    opts: dict[str, Any] = ctx.obj or {}
    settings = _settings(opts.get("config_path"), opts.get("sets", ()), opts.get("flags"))
    setup_logging(settings)
    ns, sep, name = workload.partition("/")
    if not sep:
        ns, name = namespace or _default_namespace(settings), workload
    if not ns or not name or "/" in name:
        raise click.BadParameter(f"expected [NAMESPACE/]NAME, got {workload!r}",
                                 param_hint="NAME")
    files = tuple(opts.get("from_file", ())) + from_file
    if files:
        plan, snapshot = offline_plan_and_snapshot(files, settings, opts.get("now"))
    else:
        plan, snapshot = _live_plan(settings, opts.get("now"))
    keys = workload_keys(snapshot, ns, name, kind)
    if len(keys) > 1:
        click.echo(f"error: {ns}/{name} names {len(keys)} Workloads ({', '.join(keys)}): "
                   "pass --kind, or NAMESPACE/WORKLOAD", err=True)
        sys.exit(EXIT_BAD_INPUT)
    key = keys[0] if keys else f"{ns}/{name}"
    if find_decision(plan, key) is None:
        click.echo(f"{key}: {NOT_DECIDED}", err=True)
        sys.exit(EXIT_FAILED)
    if output in ("json", "yaml"):
        click.echo(machine(explain_dict(plan, key), output))
        return
    click.echo(explain(plan, key, settings))


def workload_keys(snapshot: ClusterSnapshot, ns: str, name: str, kind: str | None) -> list[str]:
    """The Workloads NAME means in namespace NS: the Workload of that name, else those whose
    owner has that name (of `kind` when given)."""
    wls = [w for w in snapshot.workloads if w.namespace == ns]
    want = (kind or "").lower()
    if want in ("", "workload"):
        exact = [w.key for w in wls if w.name == name]
        if exact or want == "workload":
            return exact
    return sorted(w.key for w in wls if w.owner is not None and w.owner.name == name
                  and (not want or w.owner.kind.lower() == want))


def _default_namespace(settings: Settings) -> str:
    try:
        from controller.why import default_namespace
    except ImportError:
        return "default"
    return default_namespace(settings.kubeconfig_path or None,
                             settings.kubeconfig_context or None)


def _live_plan(settings: Settings, now: str | None) -> tuple[Plan, ClusterSnapshot]:
    try:
        live_plan = _lazy("controller.live.main", "live_plan_and_snapshot")
    except (ImportError, AttributeError) as exc:
        click.echo(f"error: explain without --from-file needs live mode "
                   f"(controller.live.main: {exc})", err=True)
        sys.exit(EXIT_FAILED)
    try:
        plan, snapshot = live_plan(settings, _parse_now(now))
    except Exception as exc:  # LiveError: one line, no traceback
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    if not isinstance(plan, Plan) or not isinstance(snapshot, ClusterSnapshot):
        click.echo("error: controller.live.main.live_plan_and_snapshot returned no plan",
                   err=True)
        sys.exit(EXIT_FAILED)
    return plan, snapshot
