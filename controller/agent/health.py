"""When is a GPU unhealthy, and why: pure rules over one ``GpuSample``.

Reasons are stable strings (no live readings in them), so the published inventory changes only
when the verdict changes, not with every degree or error count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controller.agent.nvml import GpuSample

# XIDs caused by applications, not by the GPU (the same set the NVIDIA device plugin skips by
# default): 13 graphics engine exception, 31 memory page fault, 43 GPU stopped processing,
# 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    max_temperature_c: int = 85  # hotter than this: unhealthy
    temperature_hysteresis_c: int = 5  # a hot GPU is fine again below max - hysteresis
    ignored_xids: frozenset[int] = APPLICATION_XIDS

    def __post_init__(self) -> None:
        if self.temperature_hysteresis_c < 0:
            raise ValueError("temperature hysteresis must be >= 0")


@dataclass(frozen=True, slots=True)
class GpuHealth:
    healthy: bool
    reasons: tuple[str, ...] = ()
    hot: bool = False  # carried to the next assessment for hysteresis


def is_hot(temperature_c: int | None, policy: HealthPolicy, was_hot: bool) -> bool:
    if temperature_c is None:
        return was_hot
    limit = policy.max_temperature_c - (policy.temperature_hysteresis_c if was_hot else 0)
    return temperature_c > limit


def critical_xids(xids: Iterable[int], policy: HealthPolicy) -> tuple[int, ...]:
    return tuple(sorted({x for x in xids if x not in policy.ignored_xids}))


def assess(
    sample: GpuSample, policy: HealthPolicy, was_hot: bool = False, xids: Iterable[int] = ()
) -> GpuHealth:
    """Unhealthy when NVML failed mid-read, on uncorrectable ECC errors, when hot, or after a
    critical XID; every reason that applies is listed."""
    reasons = list(sample.errors)
    if sample.ecc_uncorrected:
        reasons.append("uncorrectable ECC errors")
    hot = is_hot(sample.temperature_c, policy, was_hot)
    if hot:
        reasons.append(f"temperature above {policy.max_temperature_c}C")
    reasons.extend(f"critical XID {x}" for x in critical_xids(xids, policy))
    return GpuHealth(healthy=not reasons, reasons=tuple(reasons), hot=hot)
