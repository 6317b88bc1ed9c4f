"""Child-process management for the test control plane.

Every process runs in its own process group with its output in a log file. All processes
started through :class:`Proc` are stopped at interpreter exit, on SIGTERM/SIGHUP, and (via
``PR_SET_PDEATHSIG``) even when the Python process is killed outright.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

_LIVE: set[Proc] = set()
_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False
_TAKEN_PORTS: set[int] = set()


class PlaneError(RuntimeError):
    """A control-plane component is missing, failed to start, or died."""


def free_port() -> int:
    """Return a currently free TCP port on 127.0.0.1 not handed out before in this process."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _TAKEN_PORTS:
            _TAKEN_PORTS.add(port)
            return port


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Proc:
    """One long-running child process with its log file."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None
        self.peak_rss_kb = 0

    def start(self) -> None:
        """Start the process (appending to its log file)."""
        install_cleanup_handlers()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            banner = f"\n===== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n"
            log.write(banner.encode())
            log.flush()
            env = dict(os.environ)
            env.update(self.env or {})
            self.popen = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_set_pdeathsig if threading.current_thread() is threading.main_thread()
                else None,
            )
        with _LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen is not None and self.popen.poll() is None

    def sample_rss(self) -> int:
        """Record and return the process's peak resident set (VmHWM, KiB) so far."""
        if self.alive() and self.popen is not None:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_rss_kb = max(self.peak_rss_kb, int(line.split()[1]))
        return self.peak_rss_kb

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL after ``grace`` seconds."""
        p = self.popen
        if p is None:
            return
        self.sample_rss()
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        with _LOCK:
            _LIVE.discard(self)

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log."""
        try:
            data = self.log_path.read_bytes()[-200_000:].decode(errors="replace")
        except OSError:
            return f"({self.log_path} unreadable)"
        return "\n".join(data.splitlines()[-lines:])

    def check(self) -> None:
        """Raise :class:`PlaneError` with the log tail if the process has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise PlaneError(
                f"{self.name} exited with code {self.popen.returncode}; log {self.log_path}:\n"
                + self.tail()
            )


def wait_until(
    what: str, probe: Callable[[], bool], timeout: float, procs: Sequence[Proc] = (),
    interval: float = 0.1,
) -> None:
    """Poll ``probe`` until it returns True; fail early if one of ``procs`` dies."""
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            p.check()
        with contextlib.suppress(Exception):
            if probe():
                return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name} ({p.log_path}):\n{p.tail()}" for p in procs)
            raise PlaneError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")
        time.sleep(interval)


def stop_all() -> None:
    """Stop every process started through :class:`Proc` that is still registered."""
    with _LOCK:
        procs = list(_LIVE)
    for p in reversed(procs):
        with contextlib.suppress(Exception):
            p.stop(grace=5)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all()
    sys.exit(128 + signum)


def install_cleanup_handlers() -> None:
    """Register atexit and SIGTERM/SIGHUP cleanup (idempotent, main thread only).

    SIGINT keeps Python's default (KeyboardInterrupt), which unwinds fixtures and ``finally``
    blocks and ends in the atexit hook.
    """
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(stop_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)
