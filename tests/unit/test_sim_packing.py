"""HAMi packing model: binpack vs spread, fractions, gang placement, no over-commit."""

from __future__ import annotations

import random

import pytest

from evaluation.packing import BINPACK, SPREAD, Cluster


def test_whole_gpu_binpack_fills_one_node_first() -> None:
    c = Cluster(nodes=3, gpus_per_node=4)
    first = c.place(1, 1, 100, BINPACK, SPREAD)
    second = c.place(1, 1, 100, BINPACK, SPREAD)
    assert first is not None and second is not None
    assert first.slots[0][0] == second.slots[0][0]  # same node: binpack prefers the used one


def test_whole_gpu_spread_uses_a_different_node() -> None:
    c = Cluster(nodes=3, gpus_per_node=4)
    first = c.place(1, 1, 100, SPREAD, SPREAD)
    second = c.place(1, 1, 100, SPREAD, SPREAD)
    assert first is not None and second is not None
    assert first.slots[0][0] != second.slots[0][0]


def test_fractions_binpack_share_one_gpu_spread_does_not() -> None:
    packed = Cluster(nodes=1, gpus_per_node=4)
    for _ in range(4):
        assert packed.place(1, 1, 25, BINPACK, BINPACK) is not None
    assert packed.free[0] == [0, 100, 100, 100]  # four quarters on one card
    assert packed.max_tenants == 4
    spread = Cluster(nodes=1, gpus_per_node=4)
    for _ in range(4):
        assert spread.place(1, 1, 25, BINPACK, SPREAD) is not None
    assert spread.free[0] == [75, 75, 75, 75]
    # With one quarter on every card, no whole GPU is left: a 1-GPU job no longer fits.
    assert not spread.can_place(1, 1, 100)
    assert packed.can_place(1, 3, 100)
    packed.check()
    spread.check()


def test_fraction_never_overcommits_a_gpu() -> None:
    c = Cluster(nodes=1, gpus_per_node=1)
    assert c.place(1, 1, 50, BINPACK, BINPACK) is not None
    assert c.place(1, 1, 25, BINPACK, BINPACK) is not None
    assert not c.can_place(1, 1, 50)
    assert c.place(1, 1, 50, BINPACK, BINPACK) is None
    assert c.place(1, 1, 25, BINPACK, BINPACK) is not None
    assert c.free[0] == [0]
    with pytest.raises(AssertionError):
        c._take(0, 0, 1)


def test_multi_gpu_pod_needs_free_gpus_on_one_node() -> None:
    c = Cluster(nodes=2, gpus_per_node=4)
    # 3 whole GPUs used on each node: 2 free GPUs in all but not on one node.
    for _ in range(2):
        assert c.place(1, 3, 100, SPREAD, SPREAD) is not None
    assert c.allocated == 600
    assert not c.can_place(1, 2, 100)
    assert c.place(1, 2, 100, BINPACK, SPREAD) is None
    assert c.can_place(2, 1, 100)  # two 1-GPU pods do fit, one per node


def test_gang_placement_is_all_or_nothing() -> None:
    c = Cluster(nodes=2, gpus_per_node=4)
    assert c.place(1, 4, 100, BINPACK, SPREAD) is not None
    assert c.place(2, 4, 100, BINPACK, SPREAD) is None  # second pod has nowhere to go
    assert c.allocated == 400  # the first pod of the failed gang was rolled back
    c.check()


def test_release_restores_everything() -> None:
    c = Cluster(nodes=2, gpus_per_node=8)
    ps = [c.place(1, 1, 50, BINPACK, BINPACK), c.place(2, 4, 100, SPREAD, SPREAD)]
    for p in ps:
        assert p is not None
        c.release(p)
    assert c.allocated == 0
    assert all(f == 100 for node in c.free for f in node)
    c.check()


@pytest.mark.parametrize("seed", range(5))
def test_can_place_agrees_with_place(seed: int) -> None:
    """The fast feasibility check is exact: it says yes iff placing succeeds."""
    rng = random.Random(seed)
    c = Cluster(nodes=4, gpus_per_node=8)
    live = []
    for _ in range(400):
        if live and rng.random() < 0.4:
            c.release(live.pop(rng.randrange(len(live))))
            continue
        shape = rng.choice([(1, 1, 25), (1, 1, 50), (1, 1, 100), (1, 2, 100), (1, 8, 100),
                            (2, 8, 100), (2, 4, 100)])
        pol = rng.choice([(BINPACK, SPREAD), (SPREAD, BINPACK), (BINPACK, BINPACK)])
        expect = c.can_place(*shape)
        got = c.place(*shape, *pol)
        assert (got is not None) == expect, shape
        if got is not None:
            assert got.total == shape[0] * shape[1] * shape[2]
            live.append(got)
        c.check()
