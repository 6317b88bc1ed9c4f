"""Exponentially decayed team usage, carried between cycles (live: a ConfigMap, as JSON).

Pure data with a pure `advance`; no dependency on settings, so the plan can carry it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

# Seconds a stored timestamp may be ahead of this replica's clock (another replica wrote it;
# clocks of a cluster's nodes agree to well under this).
MAX_CLOCK_SKEW = 60.0


@dataclass(frozen=True, slots=True)
class UsageHistory:
    """Exponentially decayed team usage (same units as usage): a value, stored by the live
    controller in a ConfigMap as JSON. `advance` is pure."""

    usage: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    timestamp: datetime | None = None

    def advance(
        self, current: Mapping[str, Mapping[str, float]], now: datetime, half_life: float
    ) -> UsageHistory:
        """Blend `current` usage in: old x d + current x (1 - d), d = 2^(-dt/half_life).
        Half-life 0 (or no earlier sample) means current usage only."""
        fresh = {t: dict(v) for t, v in current.items()}
        if half_life <= 0 or self.timestamp is None:
            return UsageHistory(_freeze(fresh), now)
        dt = max((now - self.timestamp).total_seconds(), 0.0)
        d = math.pow(2.0, -dt / half_life)
        out: dict[str, dict[str, float]] = {}
        for team in sorted(set(self.usage) | set(fresh)):
            old = self.usage.get(team, {})
            cur = fresh.get(team, {})
            vec = {}
            for r in sorted(set(old) | set(cur)):
                v = old.get(r, 0.0) * d + cur.get(r, 0.0) * (1.0 - d)
                if v > 1e-9:
                    vec[r] = v
            if vec:
                out[team] = vec
        # Never ahead of `now`: a history stamped in the future (a clock that jumped ahead and
        # back) would otherwise freeze the decay until the clock caught up.
        return UsageHistory(_freeze(out), now)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": 1,
                "timestamp": self.timestamp.isoformat() if self.timestamp else None,
                "usage": {t: dict(v) for t, v in sorted(self.usage.items())},
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, now: datetime | None = None,
                  skew: float = MAX_CLOCK_SKEW) -> UsageHistory:
        """Parse what `to_json` wrote; ValueError on anything else: a timestamp without a
        time zone, or (with `now`) one more than `skew` seconds in the future."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"usage history is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("usage history: expected an object with version 1")
        ts_raw = doc.get("timestamp")
        if ts_raw is not None and not isinstance(ts_raw, str):
            raise ValueError("usage history: timestamp must be a string or null")
        ts = None
        if ts_raw is not None:
            try:
                ts = datetime.fromisoformat(ts_raw)
            except ValueError as exc:
                raise ValueError(f"usage history: timestamp {ts_raw!r}: {exc}") from exc
            if ts.tzinfo is None or ts.utcoffset() is None:
                raise ValueError(f"usage history: timestamp {ts_raw!r} has no time zone")
            if now is not None and (ts - now).total_seconds() > skew:
                raise ValueError(f"usage history: timestamp {ts_raw!r} is in the future "
                                 f"(now {now.isoformat()})")
        usage_raw = doc.get("usage", {})
        if not isinstance(usage_raw, dict):
            raise ValueError("usage history: usage must be an object")
        usage: dict[str, dict[str, float]] = {}
        for team, vec in usage_raw.items():
            if not isinstance(vec, dict):
                raise ValueError(f"usage history: usage[{team!r}] must be an object")
            usage[str(team)] = {}
            for r, v in vec.items():
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                    raise ValueError(f"usage history: usage[{team!r}][{r!r}] is not a number")
                if v < 0:
                    raise ValueError(f"usage history: usage[{team!r}][{r!r}] is negative")
                usage[str(team)][str(r)] = float(v)
        return cls(_freeze(usage), ts)


def _freeze(usage: Mapping[str, Mapping[str, float]]) -> Mapping[str, Mapping[str, float]]:
    return MappingProxyType({t: MappingProxyType(dict(v)) for t, v in usage.items()})
