"""A digest of plans over several synthetic clusters and settings, computed with the pure-Python
planner (`pure`) or the mypyc build beside it (`compiled`; tools/compile.py): the two must
print the same (tests/unit/test_compiled.py).

    .venv/bin/python tests/support/compiled_digest.py pure|compiled
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.compiled_bench import pure_python_imports  # noqa: E402  (imports no controller module)


def main(mode: str) -> None:
    if mode == "pure":
        pure_python_imports()
    from bench.plan_bench import NOW, synthetic
    from controller import policy
    from controller.config import HamiRule, Settings
    from controller.domain import ApprovedScope, PriorityMode
    from controller.incremental import IncrementalPlanner
    from tests.support.builders import settings as make_settings
    from tests.support.builders import written

    if policy.__file__.endswith(".py") != (mode == "pure"):
        sys.exit(f"asked for the {mode} planner, imported {policy.__file__}")
    variants = [
        Settings(),
        make_settings(approved_scope=ApprovedScope.TEAM, gpu_memory_mib=81920),
        make_settings(
            hami_rules=(HamiRule(cluster_queue="cq-03", gpu_policy="spread"),
                        HamiRule(priority_class="approved", gpu_policy="topology-aware"),
                        HamiRule(fractional=True, node_policy="binpack", gpu_policy="binpack")),
            hami_default_node_policy="binpack", base_priority_cap=100,
            priority_mode=PriorityMode.SPEC, reclaim_enabled=False),
    ]
    digest = hashlib.sha256()
    for seed, (pending, admitted, teams, queues, cohorts) in enumerate(
            [(1500, 500, 20, 40, 4), (800, 300, 30, 12, 1)], start=1):
        snap = synthetic(pending, admitted, teams, queues, seed=seed, cohorts=cohorts)
        for s in variants:
            first = policy.compute_plan(snap, s, NOW)
            digest.update(repr(first).encode())
            # The next cycle reads the levels the first one wrote (hysteresis, kept order),
            # with a memo and through the incremental planner.
            boost = s.priority_mode is not PriorityMode.SPEC
            later = written(snap, first, boost=boost)
            memo = policy.PlanMemo()
            planner = IncrementalPlanner()
            for snapshot in (later, replace(later, workloads=later.workloads[:-7])):
                plans = [policy.compute_plan(snapshot, s, NOW),
                         policy.compute_plan(snapshot, s, NOW, memo=memo),
                         planner.plan(snapshot, s, NOW)]
                digest.update(repr(plans[0]).encode())
                digest.update(str(plans[1] == plans[0] and plans[2] == plans[0]).encode())
    print(digest.hexdigest())


if __name__ == "__main__":
    main(sys.argv[1])
