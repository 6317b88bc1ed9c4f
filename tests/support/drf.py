"""Weighted DRF by progressive filling (Ghodsi et al., "Dominant Resource Fairness", NSDI 2011,
section 4), in exact arithmetic: the allocation a burst of freed quota must end in, for the unit
property (tests/unit/test_progressive_filling.py) and the plane proof
(tests/plane/test_drf_example.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

Vec = Mapping[str, Fraction]
Alloc = tuple[tuple[str, int], ...]  # (team, tasks given), by team name


@dataclass(frozen=True)
class Team:
    """One user of DRF: `tasks` identical tasks, each taking `task` from the free quota (what
    must fit) and counting `counted` in the team's share (default: `task`; the controller
    counts a HAMi GPU fraction as a fraction where Kueue's quota counts a whole GPU), on top
    of `used`, what the team already holds (in share terms)."""

    task: Vec
    tasks: int
    weight: Fraction = Fraction(1)
    used: Vec = field(default_factory=dict)
    counted: Vec | None = None


def dominant_share(team: Team, given: int, capacity: Vec) -> Fraction:
    """Weighted dominant share once `given` tasks run: max over resources of use / capacity,
    over the team's weight (resources with no capacity are not compared)."""
    per_task = team.task if team.counted is None else team.counted
    shares = [(Fraction(team.used.get(r, 0)) + given * Fraction(per_task.get(r, 0))) / capacity[r]
              for r in {*per_task, *team.used} if capacity.get(r, 0) > 0]
    return max(shares, default=Fraction(0)) / team.weight


def progressive_filling(teams: Mapping[str, Team], free: Vec, capacity: Vec,
                        rank: Callable[[Fraction], int] | None = None) -> set[Alloc]:
    """Every allocation weighted DRF allows: the next task goes to the team with the lowest
    weighted dominant share (`dominant_share` against `capacity`) whose next task still fits
    in `free`; a team whose next task does not fit (or that has none left) is saturated; until
    every team is. A tie is followed every way, so the result is one allocation when ties do
    not matter and all of them when they do. `rank` (non-decreasing in the share) compares
    shares at a coarser resolution: shares of one rank tie."""
    names = sorted(teams)
    out: set[Alloc] = set()
    seen: set[tuple[tuple[int, ...], frozenset[str]]] = set()

    def fits(count: Mapping[str, int], team: str) -> bool:
        t = teams[team]
        if count[team] >= t.tasks:
            return False
        return all(sum(count[u] * Fraction(teams[u].task.get(r, 0)) for u in names) + q
                   <= Fraction(free.get(r, 0)) for r, q in t.task.items() if q)

    def fill(count: dict[str, int], blocked: frozenset[str]) -> None:
        state = (tuple(count[t] for t in names), blocked)
        if state in seen:
            return
        seen.add(state)
        open_ = [t for t in names if t not in blocked]
        if not open_:
            out.add(tuple(sorted(count.items())))
            return
        shares = {t: dominant_share(teams[t], count[t], capacity) for t in open_}
        keys: Mapping[str, Fraction | int] = shares if rank is None else {
            t: rank(s) for t, s in shares.items()}
        lowest = min(keys.values())
        for team in (t for t in open_ if keys[t] == lowest):
            if fits(count, team):
                fill({**count, team: count[team] + 1}, blocked)
            else:
                fill(count, blocked | {team})

    fill(dict.fromkeys(names, 0), frozenset())
    return out
