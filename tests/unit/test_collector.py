"""The cyclic garbage collector around plans (controller.collector)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from controller.collector import Collector, paused


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the session collects as usual


def test_paused_turns_automatic_collection_off_and_back_on() -> None:
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_paused_leaves_collection_off_when_it_was_off_and_restores_it_after_an_error() -> None:
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), paused():
        raise RuntimeError("a plan failed")
    assert gc.isenabled()


def test_after_a_cycle_young_garbage_is_collected_and_survivors_are_frozen() -> None:
    collector = Collector(clock=lambda: 0.0)
    collector.after_cycle()  # the first call: the whole heap
    assert collector.last_full
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    kept = Node()
    collector.after_cycle()
    assert not collector.last_full
    assert gone() is None  # young cyclic garbage: collected
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # frozen: in no generation


def test_cyclic_garbage_frozen_while_alive_waits_for_the_next_whole_heap_collection() -> None:
    now = [0.0]
    collector = Collector(full_every=3600.0, clock=lambda: now[0])
    collector.after_cycle()
    node = Node()
    dead = weakref.ref(node)
    collector.after_cycle()  # alive: frozen
    del node  # now cyclic garbage among the frozen objects
    now[0] = 3599.0
    collector.after_cycle()
    assert not collector.last_full and dead() is not None  # frozen: not collected yet
    now[0] = 3600.0
    collector.after_cycle()
    assert collector.last_full and dead() is None  # unfrozen and collected with the heap
