"""HAMi-style packing of (fractional) GPU pods onto physical GPUs on nodes.

Each physical GPU has 100 GPU-percent. A pod asks for `gpus` distinct physical GPUs on one node
(HAMi `nvidia.com/gpu`) and `pct` percent of each (HAMi `nvidia.com/gpucores` /
`gpumem-percentage`; 100 = exclusive). HAMi's node policy picks the node (`binpack`: the most used
node that fits, `spread`: the least used), its GPU policy picks the GPUs on that node (`binpack`:
the most used GPUs that fit, `spread`: the least used). Ties go to the lowest index, so placement
is deterministic. No GPU is ever given more than 100 percent: `place` refuses instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from evaluation.trace import PCT

BINPACK = "binpack"
SPREAD = "spread"
POLICIES = (BINPACK, SPREAD)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job's pods went: (node, gpu index on the node, percent) per pod per GPU."""

    slots: tuple[tuple[int, int, int], ...]

    @property
    def total(self) -> int:
        return sum(s[2] for s in self.slots)


class Cluster:
    """Free GPU-percent per physical GPU, with aggregates that make 'does it fit?' O(1)-ish."""

    def __init__(self, nodes: int, gpus_per_node: int) -> None:
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError("a cluster needs at least one node with at least one GPU")
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.free: list[list[int]] = [[PCT] * gpus_per_node for _ in range(nodes)]
        self.tenants: list[list[int]] = [[0] * gpus_per_node for _ in range(nodes)]
        self.node_free: list[int] = [PCT * gpus_per_node] * nodes
        self.node_whole: list[int] = [gpus_per_node] * nodes  # fully free GPUs per node
        self.whole_hist: list[int] = [0] * (gpus_per_node + 1)  # nodes by fully free GPUs
        self.whole_hist[gpus_per_node] = nodes
        self.gpu_free_hist: list[int] = [0] * (PCT + 1)  # GPUs by free percent
        self.gpu_free_hist[PCT] = nodes * gpus_per_node
        self.capacity = nodes * gpus_per_node * PCT
        self.allocated = 0
        self.max_tenants = 0

    # -- queries -------------------------------------------------------------------------------
    def can_place(self, pods: int, gpus: int, pct: int) -> bool:
        """Exact feasibility (placement is greedy but optimal for identical pods, see tests)."""
        if pods * gpus * pct > self.capacity - self.allocated or gpus > self.gpus_per_node:
            return False
        if pct >= PCT:
            room = 0
            for c in range(gpus, self.gpus_per_node + 1):
                room += self.whole_hist[c] * (c // gpus)
                if room >= pods:
                    return True
            return False
        if pods == 1 and gpus == 1:
            hist = self.gpu_free_hist
            return any(hist[f] for f in range(pct, PCT + 1))
        # Rare shapes (fractional, several GPUs or pods): try it and roll back.
        p = self.place(pods, gpus, pct, BINPACK, BINPACK)
        if p is None:
            return False
        self.release(p)
        return True

    # -- changes -------------------------------------------------------------------------------
    def _take(self, n: int, g: int, amount: int) -> None:
        before = self.free[n][g]
        after = before - amount
        if after < 0:
            raise AssertionError(f"over-commit of GPU {n}/{g}: {before} free, {amount} asked")
        self.free[n][g] = after
        self.gpu_free_hist[before] -= 1
        self.gpu_free_hist[after] += 1
        self.node_free[n] -= amount
        if before == PCT:
            self.whole_hist[self.node_whole[n]] -= 1
            self.node_whole[n] -= 1
            self.whole_hist[self.node_whole[n]] += 1
        self.allocated += amount
        t = self.tenants[n][g] + 1
        self.tenants[n][g] = t
        if t > self.max_tenants:
            self.max_tenants = t

    def _give(self, n: int, g: int, amount: int) -> None:
        before = self.free[n][g]
        after = before + amount
        if after > PCT:
            raise AssertionError(f"GPU {n}/{g} released to {after} percent free")
        self.free[n][g] = after
        self.gpu_free_hist[before] -= 1
        self.gpu_free_hist[after] += 1
        self.node_free[n] += amount
        if after == PCT:
            self.whole_hist[self.node_whole[n]] -= 1
            self.node_whole[n] += 1
            self.whole_hist[self.node_whole[n]] += 1
        self.allocated -= amount
        self.tenants[n][g] -= 1

    def _pick_node(self, gpus: int, pct: int, node_policy: str) -> int | None:
        best: int | None = None
        best_free = 0
        spread = node_policy == SPREAD
        for n in range(self.nodes):
            nf = self.node_free[n]
            if nf < gpus * pct:
                continue
            if pct >= PCT:
                if self.node_whole[n] < gpus:
                    continue
            elif sum(1 for f in self.free[n] if f >= pct) < gpus:
                continue
            if best is None or (nf > best_free if spread else nf < best_free):
                best, best_free = n, nf
        return best

    def _pick_gpus(self, n: int, gpus: int, pct: int, gpu_policy: str) -> list[int]:
        fits = [g for g, f in enumerate(self.free[n]) if f >= pct]
        if gpu_policy == SPREAD:
            fits.sort(key=lambda g: (-self.free[n][g], g))
        else:
            fits.sort(key=lambda g: (self.free[n][g], g))
        return fits[:gpus]

    def place(
        self, pods: int, gpus: int, pct: int, node_policy: str, gpu_policy: str
    ) -> Placement | None:
        """Place every pod or none (gang); None when it does not fit."""
        slots: list[tuple[int, int, int]] = []
        for _ in range(pods):
            n = self._pick_node(gpus, pct, node_policy)
            if n is None:
                for sn, sg, sp in slots:
                    self._give(sn, sg, sp)
                return None
            for g in self._pick_gpus(n, gpus, pct, gpu_policy):
                self._take(n, g, pct)
                slots.append((n, g, pct))
        return Placement(tuple(slots))

    def release(self, placement: Placement) -> None:
        for n, g, p in placement.slots:
            self._give(n, g, p)

    # -- checks --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if any GPU is over-committed or an aggregate disagrees."""
        total = 0
        hist = [0] * (PCT + 1)
        whole_hist = [0] * (self.gpus_per_node + 1)
        for n in range(self.nodes):
            whole = 0
            for f in self.free[n]:
                assert 0 <= f <= PCT, f"GPU free percent {f} out of range"
                hist[f] += 1
                whole += f == PCT
                total += PCT - f
            assert self.node_whole[n] == whole
            assert self.node_free[n] == sum(self.free[n])
            whole_hist[whole] += 1
        assert total == self.allocated
        assert hist == self.gpu_free_hist
        assert whole_hist == self.whole_hist
