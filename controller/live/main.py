"""Entry points of live mode for `controller.cli`: process concerns only (signals, exit codes,
time limits, one clear line per failure).

* `run_live`: the controller (or `--once`, or a `--dry-run` loop). SIGTERM/SIGINT stop
  planning; the shutdown then drains writes, saves the history and releases the Lease. Exits
  1 when leadership was lost (the Deployment restarts the replica).
* `--once` is bounded by ONCE_TIMEOUT: an unreachable apiserver ends it with one line and
  exit 1, never an endless retry.
* `live_plan`: `explain` without `--from-file` (one LIST per resource, no writes), bounded the
  same way; raises `LiveError` with one line to print.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import FrameType
from typing import TypeVar

from controller.config import Settings
from controller.domain import ClusterSnapshot
from controller.live.api import ReadOnlyTransport, Transport
from controller.live.apply import FAILED
from controller.live.leader import LeaderElector, default_identity
from controller.live.runner import SYNC_TIMEOUT, CycleReport, LiveController
from controller.plan import Plan

log = logging.getLogger(__name__)

T = TypeVar("T")


class LiveError(Exception):
    """A live-mode failure with a one-line explanation (no traceback for the user)."""


def user_agent(identity: str) -> str:
    """Names the replica in the apiserver's audit log and, as its field manager, in the
    managedFields of every object it writes."""
    return f"wdrf-controller/{identity}"


def make_transport(settings: Settings, identity: str = "") -> Transport:
    from controller.live.kube import KubeTransport

    try:
        name = user_agent(identity) if identity else "wdrf-controller"
        return KubeTransport.from_config(settings.kubeconfig_path or None,
                                         settings.kubeconfig_context or None,
                                         user_agent=name,
                                         field_manager=name if identity else "")
    except Exception as e:
        raise LiveError(f"cannot configure the Kubernetes client: {e}") from None


def make_manager_transport(settings: Settings, identity: str = "") -> Transport | None:
    """The MultiKueue manager's API (MULTIKUEUE_MANAGER_KUBECONFIG), None when not set."""
    from controller.live.kube import KubeTransport

    if not settings.multikueue_manager_kubeconfig:
        return None
    try:
        return KubeTransport.from_config(settings.multikueue_manager_kubeconfig,
                                         user_agent=user_agent(identity) if identity else
                                         "wdrf-controller")
    except Exception as e:
        raise LiveError(f"cannot configure the client of the MultiKueue manager "
                        f"(MULTIKUEUE_MANAGER_KUBECONFIG): {e}") from None


def print_plan(report: CycleReport, output: str, settings: Settings) -> str:
    from controller.render import render

    text = render(report.plan, output, settings)
    if output == "table":
        refused = report.refused()
        lines = [text, "", f"Writes a live run would make ({len(refused)}):"]
        lines += [f"  - {c.ref}: {c.summary}" for c in refused] or ["  (none)"]
        text = "\n".join(lines)
    return text


def bounded(what: str, seconds: float, stop: threading.Event, work: Callable[[], T]) -> T:
    """Run `work` in a thread; `LiveError` if it has no result within `seconds`."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=target, name=what, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        stop.set()
        raise LiveError(f"{what}: no result within {seconds:.0f}s (ONCE_TIMEOUT); is the "
                        "apiserver reachable?")
    if "error" in box:
        e = box["error"]
        if isinstance(e, LiveError):
            raise e
        from controller.live.api import ApiError

        if isinstance(e, ApiError) and e.status == 0:
            raise LiveError(f"{what}: the apiserver did not answer ({e.reason}); is it "
                            "reachable? (kubeconfig server, network)") from None
        raise LiveError(f"{what} failed: {e}") from None
    return box["value"]  # type: ignore[return-value]


def run_live(settings: Settings, dry_run: bool, once: bool, output: str) -> int:
    """`python -m controller` without --from-file. Returns the process exit code."""
    from controller.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # we log failed requests ourselves
    identity = default_identity()
    try:
        transport = make_transport(settings, identity)
    except LiveError as e:
        log.error("%s", e)
        return 1
    try:
        manager = make_manager_transport(settings, identity)
    except LiveError as e:
        log.error("%s", e)
        return 1
    controller = LiveController(settings, transport, dry_run=dry_run, identity=identity,
                                manager=manager)
    previous = _install_signal_handlers(controller.stop_event)
    failure = ""
    try:
        if once:
            limit = settings.once_timeout
            try:
                return bounded("--once", limit, controller.stop_event,
                               lambda: _run_once(controller, output, time.monotonic() + limit))
            except LiveError as e:
                failure = str(e)
                return 1
        controller.start()
        if controller.stop_event.is_set():
            return 1 if controller.lost_leadership else 0
        if not controller.wait_synced():
            log.warning("caches not synced after %.0fs; running anyway", SYNC_TIMEOUT)
        if dry_run:
            _dry_run_loop(controller, output)
        else:
            controller.loop()
        return 1 if controller.lost_leadership else 0
    finally:
        controller.shutdown()
        _restore_signal_handlers(previous)
        log.info("stopped; %s", dict(controller.counting.snapshot()))
        if failure:
            log.error("%s", failure)  # the last line says why


def _run_once(controller: LiveController, output: str, deadline: float) -> int:
    controller.discover(deadline=deadline)
    if controller.stop_event.is_set():
        return 1
    controller.build_informers()
    controller.sync_once()
    elector: LeaderElector | None = controller.elector
    if elector is not None:
        try:
            if not elector.try_acquire_or_renew():
                log.warning("another replica holds Lease %s/%s: computing only, no writes",
                            elector.namespace, elector.name)
        except Exception as e:
            log.warning("could not take the Lease (%s): computing only, no writes", e)
    report = controller.run_cycle()
    if controller.dry_run:
        print(print_plan(report, output, controller.settings), flush=True)
    failed = report.applied.by_result(FAILED) if report.applied else []
    return 1 if failed else 0


def _dry_run_loop(controller: LiveController, output: str) -> None:
    last = ""
    while not controller.stop_event.is_set():
        try:
            report = controller.run_cycle()
            text = print_plan(report, output, controller.settings)
        except Exception as e:  # one line, as --once says it; the next cycle tries again
            log.error("dry run: cycle failed: %s: %s", type(e).__name__, e)
            controller.metrics.cycles.labels("error").inc()
        else:
            if text != last:
                print(text, flush=True)
                last = text
        controller.stop_event.wait(controller.settings.loop_interval)


def live_plan(settings: Settings, now: datetime) -> Plan:
    """For `explain` without --from-file: one LIST per resource, one plan, no writes.
    Raises `LiveError` (one line) when the cluster cannot be read within ONCE_TIMEOUT."""
    return live_plan_and_snapshot(settings, now)[0]


def live_plan_and_snapshot(settings: Settings, now: datetime) -> tuple[Plan, ClusterSnapshot]:
    """`live_plan` with the snapshot it was computed from (explain finds a Job's Workload in
    it)."""
    controller = LiveController(settings, ReadOnlyTransport(make_transport(settings)),
                                dry_run=True, manager=make_manager_transport(settings))
    limit = settings.once_timeout
    deadline = time.monotonic() + limit

    def work() -> tuple[Plan, ClusterSnapshot]:
        controller.discover(deadline=deadline)
        controller.build_informers()
        controller.sync_once()
        plan, built = controller.plan(now)
        return plan, built.snapshot

    return bounded("reading the cluster", limit, controller.stop_event, work)


_Handler = Callable[[int, FrameType | None], object] | int | None


def _install_signal_handlers(stop: threading.Event) -> dict[int, _Handler]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping (finish writes in flight, save history, release the "
                 "Lease)", signum)
        stop.set()

    previous: dict[int, _Handler] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    return previous


def _restore_signal_handlers(previous: dict[int, _Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


__all__ = ["LiveError", "live_plan", "run_live"]
