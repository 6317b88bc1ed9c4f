"""Plans for people and machines: table / json / yaml, and `explain` for one workload."""

from __future__ import annotations

import io
import json
import math
import shutil
import textwrap
from collections.abc import Mapping
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import click
import yaml

from controller.config import Settings
from controller.domain import PriorityClass
from controller.plan import (
    ExposureReason,
    Plan,
    PriorityBreakdown,
    TeamShare,
    WorkloadDecision,
    parse_terms,
)

OUTPUTS = ("table", "json", "yaml")


def output_option(f: Any) -> Any:
    """`-o/--output table|json|yaml`, the same on every command (`text` still means table)."""
    def normal(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
        return "table" if value == "text" else value

    return click.option("--output", "-o", type=click.Choice([*OUTPUTS, "text"]),
                        default="table", show_default=True, callback=normal,
                        metavar="table|json|yaml", help="Output format.")(f)


def json_text(doc: object, default: Any = None) -> str:
    """`json.dumps(doc, indent=2, allow_nan=False, default=default)`, written piece by piece:
    indented JSON is encoded in pure Python, and `dumps` holds every piece until it joins
    them (at 50,000 Workloads a plan is about 65 MB of text from millions of pieces, which
    took about 500 MB at once)."""
    out = io.StringIO()
    for piece in json.JSONEncoder(indent=2, allow_nan=False, default=default).iterencode(doc):
        out.write(piece)
    return out.getvalue()


def machine(doc: object, output: str) -> str:
    """A document as JSON or YAML (`output` is json or yaml)."""
    if output == "json":
        return json_text(doc, default=str)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def _duration(seconds: float, minutes: bool = False) -> str:
    """20m, 1h 50m, 2d 1h (minutes too past two days with `minutes`); zero parts left out."""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 172800:
        parts = [(s // 3600, "h"), ((s % 3600) // 60, "m")]
    else:
        parts = [(s // 86400, "d"), ((s % 86400) // 3600, "h")]
        if minutes:
            parts.append(((s % 3600) // 60, "m"))
    return " ".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


def _duration_up(seconds: float) -> str:
    """Rounded up to the minute, minutes always shown (a bound must not be understated)."""
    unit = 1 if seconds < 120 else 60
    return _duration(math.ceil(seconds / unit) * unit, minutes=True)


def _amount(resource: str, value: float) -> str:
    """Human units: bytes as GiB for memory-like resources, GPUs as GPU-equivalents (the
    flavor, as in `h100:memory`, does not change the unit)."""
    resource = resource.rpartition(":")[2]
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
    """One-line why: the terms that add up to the planned priority, or what stopped it."""
    if d.leave_unchanged:
        first = d.problems[0] if d.problems else None
        return f"UNCHANGED: {first.field}={first.value!r}" if first else "UNCHANGED"
    b = d.breakdown
    if b is None:
        return ""
    if b.override is not None:
        return f"override {b.override}"
    if b.exposure is not None:
        e = b.exposure
        if e.reason is ExposureReason.RECLAIM:
            return (f"reclaimable: team {d.team} holds {e.over_entitlement:.2f}x its "
                    f"entitlement; {', '.join(e.for_teams)} (below theirs) may preempt it")
        return f"yielding: team {d.team}'s approved work may preempt it"
    if b.guard:
        return f"{b.priority_class.value} guard: no preemption by its class"
    base = f" + base {b.base_term}" if b.base_term else ""
    return (f"{b.priority_class.value} {b.class_term}{base} + fair {b.fairness_term}"
            f" + age {b.aging_term}")


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


def _finite(x: float) -> float:
    """Strict JSON has no NaN or Infinity (weights are bounded; this is the last guard)."""
    return round(x, 6) if math.isfinite(x) else 0.0


def decision_dict(d: WorkloadDecision, now: datetime) -> dict[str, Any]:
    b = d.breakdown
    out: dict[str, Any] = {
        "workload": d.key,
        "uid": d.uid,
        "clusterQueue": d.cluster_queue,
        "rank": d.rank,
        "position": None if d.admitted else d.rank + 1,
        "admitted": d.admitted,
        "team": d.team,
        "basePriority": d.base_priority,
        "currentPriority": d.current_priority,
        "currentBoost": d.current_boost,
        "currentEffective": current_effective(d),
        "targetBoost": d.target_boost,
        "targetPriority": d.target_priority,
        "leaveUnchanged": d.leave_unchanged,
        "reason": reason(d),
        "terms": d.terms,
    }
    if b is not None:
        out["breakdown"] = breakdown_dict(b, now)
    if d.hami is not None:
        out["hami"] = {
            "nodePolicy": d.hami.node_policy,
            "gpuPolicy": d.hami.gpu_policy,
            "gpucores": d.hami.gpucores,
            "gpumemPercentage": d.hami.gpumem_percentage,
            "changes": list(d.hami.changes),
            "reason": d.hami.reason,
        }
        if d.hami.fraction_blocked:
            out["hami"]["fractionBlocked"] = d.hami.fraction_blocked
    if d.problems:
        out["problems"] = [str(p) for p in d.problems]
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _plain(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return _finite(value)
    return value


def breakdown_dict(b: PriorityBreakdown, now: datetime) -> dict[str, Any]:
    """Every field of the breakdown, camelCase (`priority_class` as `class`), so a term the
    policy adds shows up without a change here; and a pending Workload's wait at `now`."""
    out = {"class" if f.name == "priority_class" else _camel(f.name): _plain(getattr(b, f.name))
           for f in dataclass_fields(b)}
    if not b.guard:
        out["waitSeconds"] = b.wait_seconds(now)
    return out


def team_dict(t: TeamShare) -> dict[str, Any]:
    return {
        "pool": t.pool,
        "usage": {k: _finite(float(v)) for k, v in t.usage.items()},
        "shares": {k: _finite(v) for k, v in t.shares.items()},
        "dominantResource": t.dominant_resource,
        "dominantShare": _finite(t.dominant_share),
        "fairnessLevel": t.level,
        "fairnessTerm": t.fairness_term,
    }


def plan_dict(plan: Plan) -> dict[str, Any]:
    return {
        "now": plan.now.isoformat(),
        "reference": plan.reference.isoformat() if plan.reference else None,
        "decisions": [decision_dict(d, plan.now) for d in plan.decisions],
        "teams": {name: team_dict(t) for name, t in sorted(plan.teams.items())},
        "poolShares": [
            {"team": team, **team_dict(t)} for (_pool, team), t in sorted(plan.pool_shares.items())
        ],
        "problems": [str(p) for p in plan.problems],
        "warnings": list(plan.warnings),
    }


TABLE_WIDTH = 120  # when the width of the terminal is unknown (output to a pipe or a file)
NOT_DECIDED = ("not a Workload this plan decides in this snapshot (it decides pending ones, and "
               "admitted ones where preemption can reach them)")
LEGEND = ("POS 1 = admitted next. SHARE = the team's weighted dominant share of its pool (0-1). "
          "* = changes. Exact terms: -o json|yaml, explain.")
GUARD_TEXT = ("Admitted workloads are guarded: their priority is raised above every pending "
              "workload of their class, so only a higher class can preempt them.")
_NOTE_MIN = 24  # a NOTE column narrower than this goes on its own line

# Keys of the priority-terms annotation the table shows in its own columns; any other key (a
# state, a reason the policy adds) is shown in NOTE as written, so new terms need no renderer.
_SHOWN_TERMS = frozenset({"version", "class", "team", "pool", "level", "fair", "since", "ref",
                          "base", "override", "priority", "wait"})


def terminal_width() -> int:
    """The terminal's width ($COLUMNS first), else TABLE_WIDTH."""
    return max(60, shutil.get_terminal_size((TABLE_WIDTH, 24)).columns)


def _fit(text: str, width: int) -> str:
    """Shorten in the middle (summary lines only; keys in tables are never cut)."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: keep - keep // 2] + "~" + text[len(text) - keep // 2:]


def _share(d: WorkloadDecision) -> str:
    return "-" if d.breakdown is None else f"{d.breakdown.dominant_share:.2f}"


def note(d: WorkloadDecision) -> str:
    """What the columns do not say, in words: guard, override, bad input, other terms."""
    parts: list[str] = []
    if d.leave_unchanged:
        fields_ = sorted({p.field for p in d.problems})
        parts.append("left unchanged, bad " + ", ".join(fields_) + " (see Problems)"
                     if fields_ else "left unchanged")
    b = d.breakdown
    if b is not None:
        if b.guard:
            parts.append("guarded")
        if b.override is not None:
            parts.append(f"priority set by an admin (override {b.override})")
        if b.base_term:
            parts.append(f"base priority {b.base}")
        if b.clamped:
            parts.append(f"clamped: {b.clamped}")
    terms = parse_terms(d.terms)
    for key, value in terms.items():
        if key in _SHOWN_TERMS or (key == "state" and value == "admitted"):
            continue
        parts.append(value if key == "state" else f"{key} {value}")
    if d.problems and not d.leave_unchanged:
        parts.append(f"{len(d.problems)} problem(s), see Problems")
    return "; ".join(parts)


def _decision_rows(decisions: list[WorkloadDecision], now: datetime) -> list[list[str]]:
    """One row per decision; the TEAM column only when some team is not the namespace."""
    with_team = any(d.team != d.key.partition("/")[0] for d in decisions)
    rows = [["POS", "WORKLOAD", *(["TEAM"] if with_team else []), "CLASS", "WAITED", "SHARE",
             "PRIORITY NOW -> PLAN", "NOTE"]]
    for d in decisions:
        b = d.breakdown
        now_eff = current_effective(d)
        changed = "" if (now_eff == d.target_priority or d.leave_unchanged) else " *"
        waited = "admitted" if d.admitted else (_duration(b.wait_seconds(now)) if b else "-")
        rows.append([
            "-" if d.admitted else str(d.rank + 1), d.key, *([d.team] if with_team else []),
            b.priority_class.value if b else "-", waited, _share(d),
            f"{now_eff} -> {d.target_priority}{changed}", note(d),
        ])
    return rows


def _layout(rows: list[list[str]], width: int) -> str:
    """Columns as wide as their widest cell, never cut; the last column wraps at word
    boundaries into what is left of `width`, or goes on its own lines when too little is."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    indent = sum(widths) + 2 * len(widths)
    room = width - indent
    lines = []
    for r in rows:
        head = "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True))
        last = r[-1]
        if not last:
            lines.append(head.rstrip())
        elif room >= _NOTE_MIN or len(last) <= room:
            wrapped = textwrap.wrap(last, max(room, _NOTE_MIN), break_long_words=False,
                                    break_on_hyphens=False)
            lines.append(head + "  " + wrapped[0])
            lines += [" " * indent + more for more in wrapped[1:]]
        else:
            lines.append(head.rstrip())
            lines += textwrap.wrap(last, width, initial_indent="      ",
                                   subsequent_indent="      ", break_long_words=False,
                                   break_on_hyphens=False)
    return "\n".join(lines)


def _when(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_table(plan: Plan, settings: Settings | None = None, width: int | None = None) -> str:
    width = width or terminal_width()
    pending = [d for d in plan.decisions if not d.admitted]
    guarded = [d for d in plan.decisions if d.admitted]
    out = [_wrap(f"Plan at {_when(plan.now)}: {len(pending)} pending workload(s), in the order "
                 "Kueue will admit them per ClusterQueue", "", width), _wrap(LEGEND, "", width)]
    if guarded:
        out.append(_wrap(GUARD_TEXT, "", width))
    by_queue: dict[str, list[WorkloadDecision]] = {}
    for d in [*pending, *guarded]:
        by_queue.setdefault(d.cluster_queue or "-", []).append(d)
    if not by_queue:
        out.append("(no pending workloads)")
    for queue in sorted(by_queue):
        ds = by_queue[queue]
        n_pending = sum(1 for d in ds if not d.admitted)
        out.append("")
        out.append(f"ClusterQueue {queue}: {n_pending} pending, {len(ds) - n_pending} admitted")
        out.append(_layout(_decision_rows(ds, plan.now), width))
        for d in ds:
            h = hami_short(d)
            if h != "-":
                out.append(_wrap(f"HAMi {d.key}: {h}", "  ", width))
    if plan.pool_shares:
        out.append("")
        levels = settings.fairness_levels if settings else None
        out.append(_wrap("Teams (weighted dominant share of each pool; the fairness level, of "
                         f"{levels if levels else '?'}, is what the share earns):", "", width))
        trows = [["TEAM", "POOL", "SHARE", "OF ITS ENTITLEMENT", "FAIRNESS LEVEL",
                  "LARGEST RESOURCE"]]
        for (pool, team), t in sorted(plan.pool_shares.items(),
                                      key=lambda kv: (kv[0][0], kv[1].dominant_share, kv[0][1])):
            trows.append([team, pool, f"{t.dominant_share:.2f}",
                          f"{t.usage_over_entitlement:.2f}x", f"{t.level}",
                          t.dominant_resource or "-"])
        out.append(_layout(trows, width))
    problems = [p for d in plan.decisions for p in d.problems] + list(plan.problems)
    if problems:
        out.append("")
        out.append(f"Problems ({len(problems)}):")
        out += [_wrap(f"- {p}", "  ", width) for p in problems]
    if plan.warnings:
        out.append("")
        out.append("Warnings:")
        out += [_wrap(f"- {w}", "  ", width) for w in plan.warnings]
    if settings is not None:
        out.append("")
        out.append(_wrap(f"Starvation bound: {settings.starvation_bound(_duration_up)}", "",
                         width))
        stand_ins = ", ".join(f"wdrf-{c.value} {settings.stand_in_value(c)}"
                              for c in PriorityClass)
        out.append(_wrap("Class stand-ins while the controller is down (WorkloadPriorityClass "
                         f"values, manifests/admission/class-priority.yaml): {stand_ins}.", "",
                         width))
    return "\n".join(out)


def _wrap(text: str, indent: str = "  ", width: int = TABLE_WIDTH) -> str:
    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def render(plan: Plan, output: str, settings: Settings | None = None,
           width: int | None = None) -> str:
    if output == "json":
        return json_text(plan_dict(plan))
    if output == "yaml":
        return yaml.safe_dump(plan_dict(plan), sort_keys=False, default_flow_style=False)
    return render_table(plan, settings, width)


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


def explain(plan: Plan, key: str, settings: Settings, width: int | None = None) -> str:
    """The breakdown for one workload and why it ranks where it does against its neighbours."""
    d = find_decision(plan, key)
    if d is None:
        return f"{key}: {NOT_DECIDED}"
    lines = [f"Workload {d.key} (uid {d.uid or '-'})"]
    lines.append(f"  ClusterQueue:   {d.cluster_queue or '(unknown LocalQueue)'}  "
                 + ("admitted" if d.admitted else f"planned position {d.rank + 1}"))
    lines.append(f"  Team:           {d.team}")
    t = plan.pool_shares.get((d.breakdown.pool, d.team)) if d.breakdown else None
    t = t or plan.teams.get(d.team)
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
    elif b.guard:
        lines.append(f"  Admitted, class {b.priority_class.value}: guard {b.priority} - above "
                     "every pending Workload that must not preempt it (its own class"
                     + ("" if b.priority_class.value != "normal" or
                        settings.approved_preempts_normal else ", and approved") + ")")
    else:
        lines.append(f"  Class:          {b.priority_class.value} {b.class_term} (weight "
                     f"{b.class_weight} x {settings.priority_class_unit})")
        if b.base_term:
            lines.append(f"  Base:           {b.base_term} (base priority {b.base} counted "
                         f"within +-{settings.base_priority_cap}, shifted by the cap)")
        lines.append(f"  Fairness:       {b.fairness_term} = level {b.fairness_level} of "
                     f"{settings.fairness_levels} (pool {b.pool}; lower share -> more points)")
        waited = b.wait_seconds(plan.now)
        capped = " (capped)" if waited >= settings.max_aging_time else ""
        rebase = b.reference + timedelta(seconds=settings.rebase_period)
        counted = (rebase - b.queued_since).total_seconds()
        lines.append(f"  Aging:          {b.aging_term} = {settings.aging_coefficient:g}/s x "
                     f"{_duration(counted, minutes=True)} from queued ({_when(b.queued_since)}, "
                     f"waited {_duration(waited)}{capped}) to the next rebase "
                     f"{_when(rebase)}: every pending workload counts to the same instant, so "
                     "the order is by wait and the value does not move with the clock")
        if b.override is not None:
            lines.append(f"  Override:       {b.override} (wdrf.x-k8s.io/priority-override)")
        lines.append(f"  Priority:       {d.target_priority} (now {current_effective(d)}); "
                     f"boost mode writes {d.target_boost} over base {d.base_priority}")
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
        if d.hami.fraction_blocked:
            lines.append(f"    GPU fraction not written: {d.hami.fraction_blocked}")
    same = [x for x in plan.decisions if x.cluster_queue == d.cluster_queue and not x.admitted]
    if d.admitted:
        return _wrap_lines(lines, width)
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
    return _wrap_lines(lines, width)


def _wrap_lines(lines: list[str], width: int | None) -> str:
    """Each line wrapped at word boundaries to `width`, continuations indented past it."""
    width = width or terminal_width()
    out: list[str] = []
    for line in lines:
        lead = " " * (len(line) - len(line.lstrip()) + 4)
        out += textwrap.wrap(line, width, subsequent_indent=lead, break_long_words=False,
                             break_on_hyphens=False, drop_whitespace=True) or [""]
    return "\n".join(out)


def explain_dict(plan: Plan, key: str) -> Mapping[str, Any] | None:
    d = find_decision(plan, key)
    return None if d is None else decision_dict(d, plan.now)
