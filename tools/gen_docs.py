"""Regenerate the parts of the docs that restate the code or a generated result.

    python tools/gen_docs.py            # rewrite the marked blocks
    python tools/gen_docs.py --check    # exit 1 and name the blocks that are out of date

A block is the text between `<!-- generated: NAME -->` and `<!-- /generated -->` in README.md
and docs/*.md; NAME says what fills it:

| name | from |
|---|---|
| headline | docs/evaluation.md's generated goal check: each evaluated setup and its goals met |
| dry-run | `--dry-run --from-file examples/cluster-snapshot.yaml`, 100 columns wide |
| rbac | controller/live/rbac.py, every feature on, each conditional row saying when |
| owner-kinds | controller.domain.OWNER_KINDS, the kinds whose objects carry class annotations |

tests/unit/test_docs_agree.py fails while a block is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's controller package, not an installed one
    sys.path.insert(0, str(ROOT))

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- generated: ([a-z-]+) -->\n)(.*?)(<!-- /generated -->)", re.S)
DRY_RUN_WIDTH = 100
_HEADLINE = re.compile(r"^\*\*(?P<setup>[^*]+)\*\* — (?P<text>.*?)\*\*(?P<met>\d+) of "
                       r"(?P<of>\d+) goals met\*\*", re.M | re.S)


def headlines() -> list[tuple[str, int, int]]:
    """(setup, goals met, goals) for each setup of docs/evaluation.md's "Headlines" section."""
    text = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    section = text.split("\n## Headlines", 1)[1].split("\n## ", 1)[0]
    found = [(m["setup"], int(m["met"]), int(m["of"])) for m in _HEADLINE.finditer(section)]
    if not found:
        sys.exit("gen_docs: docs/evaluation.md's Headlines section names no setup")
    return found


_GOAL = re.compile(r"^- (?P<goal>[^\n]*?): \*\*(?P<verdict>met|NOT met)\*\*", re.M)


def goals(setup: str) -> list[tuple[str, str]]:
    """(goal, "met" | "NOT met") for one setup of the Headlines section, in its order."""
    text = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    section = text.split("\n## Headlines", 1)[1].split("\n## ", 1)[0]
    part = section.split(f"**{setup}** — ", 1)[1].split("\n**", 1)[0]
    return [(m["goal"], m["verdict"]) for m in _GOAL.finditer(part)]


def ranked_headlines() -> list[tuple[str, int, int]]:
    """The setups by the share of their own goals met, then by goals met: the setups have
    different goal lists (one ClusterQueue adds a disruption goal), so counts alone mislead."""
    return sorted(headlines(), key=lambda h: (-h[1] / h[2], -h[1]))


def headline_block() -> str:
    rows = ranked_headlines()
    lines = [f"- **{setup}**: {met} of {of} goals met" + (" (recommended)" if i == 0 else "")
             for i, (setup, met, of) in enumerate(rows)]
    best = rows[0][0]
    lines += ["", f"The goals, for {best}:", ""]
    lines += [f"- {goal}: **{verdict}**" for goal, verdict in goals(best)]
    return "\n".join(lines) + "\n"


def dry_run_block() -> str:
    from controller.cli import offline_plan
    from controller.config import load_settings
    from controller.render import render

    settings = load_settings(ROOT / "config.yaml", env={})
    plan = offline_plan((str(ROOT / "examples" / "cluster-snapshot.yaml"),), settings, None)
    return "```text\n" + render(plan, "table", settings, width=DRY_RUN_WIDTH) + "\n```\n"


_VERBS = ("get", "list", "watch", "create", "update", "patch")


def rbac_block() -> str:
    from controller.config import Settings, with_overrides
    from controller.live.rbac import Permission, permissions

    toggles = {
        "`USAGE_HALF_LIFE` > 0 (`components/usage-history`)": {"usage_half_life": 3600.0},
        "`METRICS_CERT_FILE` (`overlays/secure-metrics`)": {
            "metrics_cert_file": "tls.crt", "metrics_key_file": "tls.key"},
    }
    base = Settings()
    everything = with_overrides(base, **{k: v for t in toggles.values() for k, v in t.items()})
    plain = set(permissions(base))
    when: dict[Permission, str] = {}
    for label, change in toggles.items():
        for p in set(permissions(with_overrides(base, **change))) - plain:
            when[p] = label
    rows: dict[tuple[str, str, str, str, str], list[str]] = {}  # -> verbs
    for p in permissions(everything):
        where = f"`{p.namespace}`" if p.namespace else "cluster"
        note = when.get(p, "") or ("" if p.required else "optional")
        resource = f"{p.resource} `{p.name}`" if p.name else p.resource
        rows.setdefault((p.group, resource, where, p.why, note), []).append(p.verb)
    merged: dict[tuple[str, str, str, str, str], list[str]] = {}  # same verbs: one row
    for (group, resource, where, why, note), verbs in rows.items():
        vs = ", ".join(v for v in _VERBS if v in verbs)
        merged.setdefault((group, vs, where, why, note), []).append(resource)
    lines = ["| API group | resources | verbs | where | why | when |", "|---|---|---|---|---|---|"]
    for (group, verbs, where, why, note), resources in merged.items():
        lines.append(f"| {f'`{group}`' if group else 'core'} | {', '.join(resources)} | {verbs} "
                     f"| {where} | {why} | {note or 'always'} |")
    lines.append("| `authorization.k8s.io` | selfsubjectaccessreviews | create | cluster | "
                 "`--health-check` asks one for each row above | always |")
    return "\n".join(lines) + "\n"


def owner_kinds_block() -> str:
    from controller.domain import OWNER_KINDS

    kinds = ", ".join(f"{key.partition('/')[2]} (`{key.partition('/')[0]}`)"
                      for key in OWNER_KINDS)
    return f"batch/v1 Job, {kinds}\n"


BLOCKS: dict[str, Callable[[], str]] = {
    "headline": headline_block,
    "dry-run": dry_run_block,
    "rbac": rbac_block,
    "owner-kinds": owner_kinds_block,
}


def regenerate(text: str) -> str:
    def fill(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in BLOCKS:
            sys.exit(f"gen_docs: unknown block {name!r}")
        return m.group(1) + BLOCKS[name]() + m.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks")
    args = parser.parse_args(argv)
    stale = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        new = regenerate(text)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print("generated blocks out of date (run python tools/gen_docs.py): " + ", ".join(stale))
        return 1
    if not args.check:
        print(f"gen_docs: rewrote {len(stale)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
