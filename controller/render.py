"""Plans for people and machines: table / json / yaml, and `explain` for one workload."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import yaml

from controller.config import Settings
from controller.plan import Plan, TeamShare, WorkloadDecision

OUTPUTS = ("table", "json", "yaml")


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def _duration_up(seconds: float) -> str:
    """Like _duration, rounded up to the unit shown (a bound must not be understated)."""
    unit = 1 if seconds < 120 else 60 if seconds < 172800 else 3600
    return _duration(math.ceil(seconds / unit) * unit)


def _amount(resource: str, value: float) -> str:
    """Human units: bytes as GiB for memory-like resources, GPUs as GPU-equivalents."""
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return f"{value / 2**30:.4g}Gi"
    if resource.startswith("nvidia.com/"):
        return f"{value:.4g} GPU"
    return f"{value:.4g}"


def _opt(v: int | None) -> str:
    return "-" if v is None else str(v)


def current_effective(d: WorkloadDecision) -> int:
    return (d.current_priority or 0) + (d.current_boost or 0)


def reason(d: WorkloadDecision) -> str:
    """One-line why: the formula's terms, or what stopped the decision."""
    if d.leave_unchanged:
        first = d.problems[0] if d.problems else None
        return f"UNCHANGED: {first.field}={first.value!r}" if first else "UNCHANGED"
    b = d.breakdown
    if b is None:
        return ""
    if b.override is not None:
        return f"override {b.override}"
    share = f"{b.dominant_share:.3f}"
    if b.dominant_resource:
        share += f" {b.dominant_resource}"
    class_points = b.score - b.fairness_term - b.aging_term
    return (
        f"{b.priority_class.value} {class_points} + fair {b.fairness_term} (share {share})"
        f" + age {b.aging_term}"
    )


_HAMI_SHORT = {
    "hami.io/node-scheduler-policy": "node",
    "hami.io/gpu-scheduler-policy": "gpu",
    "nvidia.com/gpucores": "cores",
    "nvidia.com/gpumem-percentage": "mem%",
}


def hami_short(d: WorkloadDecision) -> str:
    """Compact HAMi column: what changes, e.g. "node=binpack gpu=binpack cores=50 mem%=50"."""
    h = d.hami
    if h is None or not h.changes:
        return "-"
    parts = []
    for c in h.changes:
        key, _, rest = c.partition(": ")
        short = _HAMI_SHORT.get(key, key)
        parts.append(f"{short}={rest.rpartition(' -> ')[2]}")
    return " ".join(parts)


def decision_dict(d: WorkloadDecision) -> dict[str, Any]:
    b = d.breakdown
    out: dict[str, Any] = {
        "workload": d.key,
        "uid": d.uid,
        "clusterQueue": d.cluster_queue,
        "rank": d.rank,
        "team": d.team,
        "basePriority": d.base_priority,
        "currentPriority": d.current_priority,
        "currentBoost": d.current_boost,
        "currentEffective": current_effective(d),
        "targetBoost": d.target_boost,
        "targetPriority": d.target_priority,
        "leaveUnchanged": d.leave_unchanged,
        "reason": reason(d),
    }
    if b is not None:
        out["breakdown"] = {
            "class": b.priority_class.value,
            "classWeight": b.class_weight,
            "team": b.team,
            "dominantResource": b.dominant_resource,
            "dominantShare": round(b.dominant_share, 6),
            "fairnessTerm": b.fairness_term,
            "waitSeconds": round(b.wait_seconds, 3),
            "agingTerm": b.aging_term,
            "override": b.override,
            "score": b.score,
        }
    if d.hami is not None:
        out["hami"] = {
            "nodePolicy": d.hami.node_policy,
            "gpuPolicy": d.hami.gpu_policy,
            "gpucores": d.hami.gpucores,
            "gpumemPercentage": d.hami.gpumem_percentage,
            "changes": list(d.hami.changes),
            "reason": d.hami.reason,
        }
    if d.problems:
        out["problems"] = [str(p) for p in d.problems]
    return out


def team_dict(t: TeamShare) -> dict[str, Any]:
    return {
        "usage": {k: float(v) for k, v in t.usage.items()},
        "shares": {k: round(v, 6) for k, v in t.shares.items()},
        "dominantResource": t.dominant_resource,
        "dominantShare": round(t.dominant_share, 6),
    }


def plan_dict(plan: Plan) -> dict[str, Any]:
    return {
        "now": plan.now.isoformat(),
        "decisions": [decision_dict(d) for d in plan.decisions],
        "teams": {name: team_dict(t) for name, t in sorted(plan.teams.items())},
        "problems": [str(p) for p in plan.problems],
        "warnings": list(plan.warnings),
    }


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def render_table(plan: Plan, settings: Settings | None = None) -> str:
    header = ["#", "CLUSTERQUEUE", "WORKLOAD", "TEAM", "CLASS", "WAIT", "PRIORITY NOW->PLAN",
              "BOOST NOW->PLAN", "HAMI", "WHY"]
    rows = [header]
    for d in plan.decisions:
        b = d.breakdown
        cls = b.priority_class.value if b else "-"
        wait = _duration(b.wait_seconds) if b else "-"
        now_eff = current_effective(d)
        changed = "" if (now_eff == d.target_priority or d.leave_unchanged) else " *"
        hami = hami_short(d)
        rows.append([
            str(d.rank),
            d.cluster_queue or "-",
            d.key,
            d.team,
            cls,
            wait,
            f"{now_eff} -> {d.target_priority}{changed}",
            f"{_opt(d.current_boost)} -> {d.target_boost}",
            hami,
            reason(d),
        ])
    out = [f"Plan at {plan.now.isoformat()}: {len(plan.decisions)} pending workload(s)"
           " in planned admission order (# = position in its ClusterQueue; * = will change)"]
    out.append(_table(rows) if plan.decisions else "(no pending workloads)")
    if plan.teams:
        out.append("")
        out.append("Teams (weighted dominant share):")
        trows = [["TEAM", "DOMINANT", "SHARE", "SHARES"]]
        for name, t in sorted(plan.teams.items(), key=lambda kv: (kv[1].dominant_share, kv[0])):
            shares = ", ".join(f"{k}={v:.3f}" for k, v in sorted(t.shares.items()) if v)
            trows.append([name, t.dominant_resource or "-", f"{t.dominant_share:.3f}",
                          shares or "-"])
        out.append(_table(trows))
    problems = [p for d in plan.decisions for p in d.problems] + list(plan.problems)
    if problems:
        out.append("")
        out.append(f"Problems ({len(problems)}):")
        out += [f"  - {p}" for p in problems]
    if plan.warnings:
        out.append("")
        out.append("Warnings:")
        out += [f"  - {w}" for w in plan.warnings]
    if settings is not None:
        out.append("")
        out.append(f"Starvation bound: {settings.starvation_bound(_duration_up)}")
    return "\n".join(out)


def render(plan: Plan, output: str, settings: Settings | None = None) -> str:
    if output == "json":
        return json.dumps(plan_dict(plan), indent=2, sort_keys=False)
    if output == "yaml":
        return yaml.safe_dump(plan_dict(plan), sort_keys=False, default_flow_style=False)
    return render_table(plan, settings)


# --------------------------------------------------------------------------------------------


def find_decision(plan: Plan, key: str) -> WorkloadDecision | None:
    for d in plan.decisions:
        if d.key == key:
            return d
    return None


def _compare(a: WorkloadDecision, b: WorkloadDecision) -> str:
    """Why `a` ranks ahead of `b` (a is earlier in the same ClusterQueue)."""
    if a.target_priority != b.target_priority:
        ab, bb = a.breakdown, b.breakdown
        parts = [f"priority {a.target_priority} > {b.target_priority}"]
        if ab and bb:
            if ab.override is not None or bb.override is not None:
                parts.append("admin override")
            elif ab.priority_class != bb.priority_class:
                parts.append(f"class {ab.priority_class.value} vs {bb.priority_class.value}")
            else:
                diffs = []
                if ab.fairness_term != bb.fairness_term:
                    diffs.append(f"fairness {ab.fairness_term} vs {bb.fairness_term} (team "
                                 f"share {ab.dominant_share:.3f} vs {bb.dominant_share:.3f})")
                if ab.aging_term != bb.aging_term:
                    diffs.append(f"aging {ab.aging_term} vs {bb.aging_term}")
                if a.base_priority != b.base_priority:
                    diffs.append(f"base {a.base_priority} vs {b.base_priority}")
                parts += diffs
        elif a.leave_unchanged or b.leave_unchanged:
            parts.append("one of them is left unchanged because of bad input")
        return "; ".join(parts)
    return f"equal priority {a.target_priority}: Kueue breaks the tie by creation time, then UID"


def explain(plan: Plan, key: str, settings: Settings) -> str:
    """The breakdown for one workload and why it ranks where it does against its neighbours."""
    d = find_decision(plan, key)
    if d is None:
        return f"{key}: not a pending workload in this snapshot"
    lines = [f"Workload {d.key} (uid {d.uid or '-'})"]
    lines.append(f"  ClusterQueue:   {d.cluster_queue or '(unknown LocalQueue)'}  "
                 f"planned position {d.rank}")
    lines.append(f"  Team:           {d.team}")
    t = plan.teams.get(d.team)
    if t is not None:
        for r in sorted(t.shares):
            used = _amount(r, float(t.usage.get(r, 0)))
            cap = _amount(r, float(t.capacity.get(r, 0)))
            lines.append(f"    share {r}: {used} / {cap} -> weighted {t.shares[r]:.4f}")
        lines.append(f"    weighted dominant share: {t.dominant_share:.4f} "
                     f"({t.dominant_resource or 'no usage'})")
    b = d.breakdown
    if d.leave_unchanged or b is None:
        lines.append("  LEFT UNCHANGED because of bad input:")
        lines += [f"    - {p}" for p in d.problems]
        lines.append(
            f"  Current priority {_opt(d.current_priority)}, boost {_opt(d.current_boost)}"
        )
    else:
        lines.append(f"  Class:          {b.priority_class.value} (weight {b.class_weight} x "
                     f"{settings.priority_class_unit} = "
                     f"{b.class_weight * settings.priority_class_unit})")
        lines.append(f"  Fairness:       {b.fairness_term} of {settings.fairness_points} "
                     f"(lower share -> more points)")
        capped = " (capped)" if b.wait_seconds >= settings.max_aging_time else ""
        lines.append(f"  Aging:          {b.aging_term} after waiting {_duration(b.wait_seconds)}"
                     f"{capped} ({settings.aging_coefficient:g}/s, step "
                     f"{_duration(settings.aging_step)}, cap {_duration(settings.max_aging_time)})")
        if b.override is not None:
            lines.append(f"  Override:       {b.override} (wdrf.x-k8s.io/priority-override)")
        lines.append(f"  Base priority:  {d.base_priority}")
        lines.append(f"  Boost:          {d.target_boost} (now {_opt(d.current_boost)})")
        lines.append(f"  Priority:       {d.target_priority} = base + boost "
                     f"(now {current_effective(d)})")
        for p in d.problems:
            lines.append(f"  Note: {p}")
    if d.hami is not None:
        lines.append(f"  HAMi:           node={d.hami.node_policy or '-'} "
                     f"gpu={d.hami.gpu_policy or '-'}"
                     + (f" gpucores={d.hami.gpucores} gpumem%={d.hami.gpumem_percentage}"
                        if d.hami.gpucores is not None else ""))
        lines.append(f"    from: {d.hami.reason or '-'}")
        for c in d.hami.changes:
            lines.append(f"    change: {c}")
    same = [x for x in plan.decisions if x.cluster_queue == d.cluster_queue]
    idx = same.index(d)
    if idx > 0:
        ahead = same[idx - 1]
        lines.append(f"  Behind {ahead.key}: {_compare(ahead, d)}")
    else:
        lines.append("  First in its ClusterQueue's planned order")
    if idx + 1 < len(same):
        behind = same[idx + 1]
        lines.append(f"  Ahead of {behind.key}: {_compare(d, behind)}")
    cq_warnings = [w for w in plan.warnings if d.cluster_queue and
                   w.startswith(f"ClusterQueue {d.cluster_queue}:")]
    lines += [f"  Warning: {w}" for w in cq_warnings]
    return "\n".join(lines)


def explain_dict(plan: Plan, key: str) -> Mapping[str, Any] | None:
    d = find_decision(plan, key)
    return None if d is None else decision_dict(d)
