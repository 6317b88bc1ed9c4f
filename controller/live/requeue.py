"""Kueue's batched requeue of parked Workloads, and the window after a release it opens.

With `BestEffortFIFO` Kueue parks a pending Workload that did not fit. Quota released in a
ClusterQueue (a Workload finished, evicted, deactivated or deleted while holding quota)
reaches the parked Workloads only when Kueue requeues them, a batch period (1 s in Kueue
v0.19) after the first release. A priority written meanwhile moves that Workload out of the
parked ones at once, so a write landing in the window hands the released quota to the
Workload written, ahead of the head of the queue whose value was kept (seen on the plane:
Kueue admitted a deeper Workload the controller had just rewritten). The writer holds a
pool's pending writes while such a window is open (`CycleWriter.write`), and the loop runs
a cycle when it closes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from controller.workload import is_quota_reserved

# Kueue's requeue batch period (v0.19: 1 s), plus room for its requeue and scheduling pass
# to run before our writes land (the KUEUE_REQUEUE_WINDOW setting's default).
REQUEUE_WINDOW = 1.5


def released_queue(kind: str, old: Mapping[str, Any] | None,
                   new: Mapping[str, Any] | None) -> str | None:
    """The ClusterQueue whose quota a Workload event released, or None."""
    if kind != "Workload" or old is None or not is_quota_reserved(old):
        return None
    if new is not None and is_quota_reserved(new):
        return None
    admission = (old.get("status") or {}).get("admission") or {}
    cq = admission.get("clusterQueue")
    return cq if isinstance(cq, str) and cq else None


class ReleaseWindows:
    """Per ClusterQueue, when the window opened by its first release since the last one
    closed ends (monotonic seconds). Thread-safe: watches record, the loop reads."""

    def __init__(self, window: float = REQUEUE_WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._ends: dict[str, float] = {}

    def observe(self, kind: str, old: Mapping[str, Any] | None,
                new: Mapping[str, Any] | None) -> None:
        cq = released_queue(kind, old, new)
        if cq is None or self._window <= 0:
            return
        now = self._clock()
        with self._lock:
            if self._ends.get(cq, 0.0) <= now:  # a later release joins the open batch
                self._ends[cq] = now + self._window

    def open(self) -> dict[str, float]:
        """The ClusterQueues whose window is open now, with when each ends."""
        now = self._clock()
        with self._lock:
            for cq in [cq for cq, end in self._ends.items() if end <= now]:
                del self._ends[cq]
            return dict(self._ends)
