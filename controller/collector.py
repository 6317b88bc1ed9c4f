"""Python's cyclic garbage collector around plans (the live loop, offline runs, benchmarks).

At 50,000 Workloads the process tracks millions of objects (informer caches, the parsed
snapshot, the planner's parts and memos), and a full plan allocates a few hundred thousand
more. Left to its allocation counters, the collector walks the young objects hundreds of times
during a full plan and, every so often, every tracked object of the process (about 0.4 s at
that size), wherever allocation happens to trigger it: in the middle of a plan, or of a steady
cycle whose budget is tens of milliseconds. A plan makes no cyclic garbage (it builds frozen
dataclasses, tuples and dicts), so:

- `paused()`: no automatic collection while a plan is computed;
- `Collector.after_cycle()`: between cycles, collect what is young, then freeze what survives
  (`gc.freeze`), so that later collections, automatic or not, skip it and none walks the whole
  heap. Frozen objects are still freed when their last reference goes (reference counting);
  only cyclic garbage among them waits for the next full collection, every `FULL_EVERY`
  seconds, when everything is unfrozen and collected once (between cycles too).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["FULL_EVERY", "Collector", "paused"]

FULL_EVERY = 3600.0  # seconds between collections of the whole heap


@contextmanager
def paused() -> Iterator[None]:
    """Automatic collection off inside the block (as it was after it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Collector:
    """The live loop's collections, run between cycles (`after_cycle`)."""

    def __init__(self, full_every: float = FULL_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every = full_every
        self._clock = clock
        self._last_full: float | None = None  # none yet: the first call collects everything
        self.last_seconds = 0.0  # CPU time of the last call
        self.last_full = False  # whether the last call collected the whole heap

    def after_cycle(self) -> None:
        started = time.process_time()
        now = self._clock()
        self.last_full = self._last_full is None or now - self._last_full >= self.full_every
        if self.last_full:
            gc.unfreeze()
            self._last_full = now
        gc.collect()
        gc.freeze()
        self.last_seconds = time.process_time() - started
