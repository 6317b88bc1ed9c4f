"""Exponential backoff with full jitter (pure apart from the injected random source)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delay n is uniform in [initial * 2^n / 2, min(cap, initial * 2^n)]: grows, never in step."""

    initial: float = 0.5
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.initial * (2 ** min(self.attempts, 30)))
        self.attempts += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
