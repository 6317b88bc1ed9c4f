"""What HAMi accepts (docs/policy.md, "HAMi decisions"): its node and GPU scheduling-policy
values and the HAMi versions they need. A leaf module, so the settings and the HAMi decisions
both validate against the same lists without importing each other.
"""

from __future__ import annotations

import re

NODE_POLICIES = ("binpack", "spread")
GPU_POLICIES_BASE = ("binpack", "spread", "topology-aware")  # HAMi v2.7+
GPU_POLICIES_2_10 = ("mutex", "numa")  # HAMi v2.10+, also chainable: "binpack,numa"


def parse_hami_version(value: str) -> tuple[int, int] | None:
    m = re.match(r"^v?([0-9]+)\.([0-9]+)(?:\.[0-9]+)?$", value)
    return (int(m.group(1)), int(m.group(2))) if m else None


def valid_gpu_policy(value: str, hami_version: str) -> bool:
    """What HAMi's GPU scheduler accepts for hami.io/gpu-scheduler-policy."""
    version = parse_hami_version(hami_version) or (2, 10)
    if version >= (2, 10):
        parts = value.split(",")
        allowed = (*GPU_POLICIES_BASE, *GPU_POLICIES_2_10)
        return bool(parts) and all(p in allowed for p in parts) and len(set(parts)) == len(parts)
    if version >= (2, 7):
        return value in GPU_POLICIES_BASE
    return value in ("binpack", "spread")
