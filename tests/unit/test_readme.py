"""README.md is true: the quick start runs as written, every config key, flag, metric,
annotation and path it names exists, and the worked example's numbers are what the policy
computes.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest
import yaml

from tests.support.kube import render_kustomize

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert m, f"README has no section '## {title}'"
    return m.group(1)


def code_blocks(text: str, lang: str = "sh") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def commands(block: str) -> list[str]:
    """Shell commands of a block, comments stripped."""
    out = []
    for line in block.splitlines():
        cmd = line.split("#", 1)[0].strip()
        if cmd:
            out.append(cmd)
    return out


# ---------------------------------------------------------------------------------------------
# Quick start


def test_quick_start_is_one_make_command_and_the_suite_is_make_test() -> None:
    (block,) = code_blocks(section("Quick start"))
    assert commands(block) == ["make dry-run"]
    assert "make test" in section("Development")
    # What the README says `make dry-run` runs is what the Makefile runs.
    said = re.search(r"make dry-run\s+# installs click \+ PyYAML \(pinned in requirements\.lock\) "
                     r"into \.venv-dry-run, then: (.*)", block)
    assert said, block
    make = shutil.which("make")
    assert make, "make is needed for the quick start"
    dry = subprocess.run([make, "-n", "dry-run"], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip().splitlines()
    run_line = [ln for ln in dry if "-m controller" in ln]
    assert len(run_line) == 1, dry
    assert shlex.split(run_line[0])[1:] == shlex.split(said.group(1))[1:], (run_line, said[1])
    # `make test` is what CI runs.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^exec make test$", ci, re.M), ci
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    test_rule = re.search(r"^test: (.*)$", makefile, re.M)
    assert test_rule and "venv" in test_rule.group(1) and "tools" in test_rule.group(1)


def test_make_dry_run_works_as_written() -> None:
    make = shutil.which("make")
    assert make
    env = dict(os.environ)
    env.pop("MAKEFLAGS", None)
    r = subprocess.run([make, "dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=env, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"Plan at .*: \d+ pending workload", r.stdout), r.stdout[:2000]
    snapshot = ROOT / "examples" / "cluster-snapshot.yaml"
    assert snapshot.exists()


# ---------------------------------------------------------------------------------------------
# References


def test_every_config_key_is_in_the_readme() -> None:
    from controller.config import KEYS, Settings, describe

    ref = section("Configuration reference")
    from controller.cli import FLAG_ALIASES

    found = re.findall(r"^\| `([A-Z_]+)` \| `(--[a-z-]+)`(?: or `(--[a-z-]+)`)? \| ([^|]*) \|",
                       ref, re.M)
    rows = {m[0]: (m[1], m[3]) for m in found}
    assert {m[0]: m[2] for m in found if m[2]} == FLAG_ALIASES
    assert set(rows) == set(KEYS), (set(KEYS) - set(rows), set(rows) - set(KEYS))
    top = ROOT / "config.yaml"
    assert top.exists(), "config.yaml is missing at the repository top"
    doc = yaml.safe_load(top.read_text(encoding="utf-8")) or {}
    assert set(doc) <= set(rows), set(doc) - set(rows)
    opts, _ = _cli_options()
    for key, (flag, _default) in rows.items():
        assert flag == "--" + key.lower().replace("_", "-") and flag in opts, (key, flag)
    # Defaults in the table agree with the code for the scalar settings.
    for key, value, _ in describe(Settings()):
        default = rows[key][1]
        if isinstance(value, bool):
            assert f"`{str(value).lower()}`" in default, (key, default)
        elif isinstance(value, int | float):
            assert f"`{value:g}`" in default, (key, value, default)
        elif isinstance(value, str) and value:
            assert f"`{value}`" in default, (key, value, default)
        elif isinstance(value, str):
            assert default.strip() == "empty", (key, default)


def _cli_options() -> tuple[set[str], set[str]]:
    from controller.cli import main

    ctx = click.Context(main)
    opts = {o for p in main.params for o in p.opts} | set(ctx.help_option_names)
    subcommands = set(main.list_commands(ctx))  # type: ignore[attr-defined]
    for name in subcommands:  # `why -o json`, `reset --yes`: the subcommands' own options
        sub = main.get_command(ctx, name)  # type: ignore[attr-defined]
        opts |= {o for p in getattr(sub, "params", ()) for o in getattr(p, "opts", ())}
    return opts, subcommands


def test_every_flag_and_subcommand_the_readme_names_exists() -> None:
    opts, subcommands = _cli_options()
    used = re.findall(r"python -m controller((?: [^`\n|]+)?)", README)
    assert used
    for args in used:
        for tok in args.split():
            if tok.startswith("-"):
                assert tok.split("=")[0] in opts, tok
    for sub in re.findall(r"python -m controller (\w+)", README):
        assert sub in subcommands, sub
    development = section("Development")
    for flag in re.findall(r"`(--[a-z-]+)`", README.replace(development, "")):
        assert flag in opts, flag
    # Flags in the Development section also belong to `make cluster` (tests.support.cluster).
    import argparse
    from unittest import mock

    from tests.support import cluster

    with mock.patch.object(argparse.ArgumentParser, "parse_args", lambda self, a=None: self):
        parser = cluster._parse([])
    cluster_opts = {o for act in parser._actions for o in act.option_strings}
    # (bench scripts' flags are checked in test_bench_commands_in_the_readme_exist)
    without_bench = re.sub(r"bench/\w+\.py(?: --[a-z-]+)*", "", development)
    bench_opts = {f for b in (ROOT / "bench").glob("*.py")
                  for f in re.findall(r'"(--[a-z][a-z-]+)"', b.read_text(encoding="utf-8"))}
    for flag in re.findall(r"(--[a-z][a-z-]+)", without_bench):
        assert flag in cluster_opts | opts | bench_opts, flag
    assert "--no-priority-boost" in cluster_opts and "--gpu-nodes" in cluster_opts
    assert 'CLUSTER_ARGS' in (ROOT / "Makefile").read_text(encoding="utf-8")


def test_every_metric_in_the_readme_exists_and_every_metric_is_documented() -> None:
    from controller.live.metrics import Metrics

    m = Metrics()
    m.cycles.labels("ok").inc()
    m.patches.labels("Workload", "applied").inc()
    m.api_errors.labels("500").inc()
    m.watch_restarts.labels("workloads", "closed").inc()
    m.relists.labels("workloads").inc()
    m.events.labels("BadAnnotation", "created").inc()
    exported = {
        f"{fam.name}_total" if fam.type == "counter" else fam.name
        for fam in m.registry.collect()
    }
    ref = section("Metrics reference")
    documented = set(re.findall(r"^\| `(wdrf_\w+)` \|", ref, re.M))
    assert documented == exported, (exported - documented, documented - exported)


def test_annotation_reference_uses_the_real_keys() -> None:
    from controller import domain

    ref = section("Annotation reference")
    documented = set(re.findall(r"^\| `([\w./-]+)` \|", ref, re.M))
    keys = {v for k, v in vars(domain).items() if k.endswith("_ANNOTATION") and isinstance(v, str)}
    keys.discard(domain.HAMI_NODE_REGISTER_ANNOTATION)  # HAMi's own, read-only
    assert keys <= documented, keys - documented


def test_kustomize_paths_and_local_links_exist() -> None:
    for path in re.findall(r"kubectl apply -k (\S+)", README):
        assert (ROOT / path).is_dir() and (ROOT / path / "kustomization.yaml").exists(), path
    for link in re.findall(r"\]\((?!https?://|#)([^)]+)\)", README):
        assert (ROOT / link).exists(), f"README links to missing {link}"
    for anchor in re.findall(r"\]\(#([^)]+)\)", README):
        titles = re.findall(r"^#+ (.*)$", README, re.M)
        slugs = {re.sub(r"[^\w\- ]", "", t).strip().lower().replace(" ", "-") for t in titles}
        assert anchor in slugs, anchor


def test_admission_messages_in_readme_match_the_policy() -> None:
    policy = (ROOT / "manifests" / "admission" / "policy.yaml").read_text(encoding="utf-8")
    assert "may only be set, changed or removed by members of the groups" in policy
    assert "may only be set, changed or removed by members of the groups" in README
    params = yaml.safe_load(
        (ROOT / "manifests" / "admission" / "params.yaml").read_text(encoding="utf-8"))
    for key, value in params["data"].items():
        assert f'{key}: "{value}"' in README, key


# ---------------------------------------------------------------------------------------------
# Worked example


def test_worked_example_numbers_are_what_the_policy_computes() -> None:
    """The README's example, run through `compute_plan` itself: a 16-GPU ClusterQueue, three
    teams of weight 1, observed on a Thursday 12:00 UTC (the builders' NOW)."""
    from controller.config import Settings
    from controller.domain import (
        APPROVED_ANNOTATION,
        GPUCORES,
        GPUMEM_PERCENTAGE,
        URGENT_ANNOTATION,
    )
    from controller.policy import compute_plan
    from tests.support.builders import NOW, snapshot, wl

    s = Settings()
    example = section("How a priority is computed")
    assert NOW.strftime("%A %H:%M") == "Thursday 12:00"
    quarter = {GPUCORES: "25", GPUMEM_PERCENTAGE: "25"}
    workloads = [
        wl("run", "a", gpu="4", admitted=True, wait=86400),  # A runs 4 whole GPUs
        *(wl(f"quarter-{i}", "b", resources=quarter, admitted=True, wait=86400)
          for i in range(4)),  # B runs four 25 % jobs
        wl("pretrain", "a", wait=10 * 60, annotations={URGENT_ANNOTATION: "true"}),
        wl("finetune", "b", wait=2 * 3600, annotations={APPROVED_ANNOTATION: "true"}),
        wl("eval", "c", wait=3 * 3600),
        wl("sweep", "a", wait=3 * 3600),
    ]
    plan = compute_plan(snapshot(workloads, gpus=16, teams=("a", "b", "c")), s, NOW)
    fair = {t: plan.teams[t].fairness_term for t in ("a", "b", "c")}
    assert fair == {"a": 58000, "b": 86000, "c": 100000}, fair
    for t in fair:
        assert f"**{fair[t]}**" in example, t
    order = [(d.key, d.target_priority) for d in plan.pending]
    assert order == [("a/pretrain", 1861000), ("b/finetune", 545600), ("c/eval", 414700),
                     ("a/sweep", 366700)], order
    for d in plan.pending:
        b = d.breakdown
        assert b is not None
        row = next(line for line in example.splitlines()
                   if line.startswith(f"| {d.key[0].upper()}{d.key[1:]} |"))
        assert f"{b.class_term} + {b.fairness_term} + {b.aging_term}" in row, row
        assert row.endswith(f"**{d.target_priority}** |"), row
    assert "(\N{MINUS SIGN}3s)" in example and "\N{MULTIPLICATION SIGN} 1500" in example
    assert s.priority_class_unit == 1500 and s.fairness_points == 100000
    assert dict(s.priority_weights) == {"urgent": 1000, "approved": 100, "normal": 1}


@pytest.mark.parametrize("cmd", ["make dry-run", "make test"])
def test_make_targets_exist(cmd: str) -> None:
    target = cmd.split()[1]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target


def test_the_opt_out_kustomization_in_the_readme_drops_only_the_binding(tmp_path: Path) -> None:
    (snippet,) = [b for b in code_blocks(README, "yaml") if "$patch: delete" in b]
    (tmp_path / "wdrf").symlink_to(ROOT / "manifests")
    (tmp_path / "kustomization.yaml").write_text(
        snippet.replace("path/to/wdrf/manifests", "wdrf"), encoding="utf-8")
    docs = render_kustomize(tmp_path)
    kinds = [d["kind"] for d in docs]
    bindings = {d["metadata"]["name"] for d in docs
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert "wdrf-class-annotations" not in bindings
    assert "wdrf-controller-writes" in bindings  # the controller's own limits stay
    assert "Deployment" in kinds and "ValidatingAdmissionPolicy" in kinds


def test_bench_commands_in_the_readme_exist() -> None:
    for script, flags in re.findall(r"\.venv/bin/python (bench/\w+\.py)((?: --[a-z-]+)*)", README):
        path = ROOT / script
        assert path.exists(), script
        text = path.read_text(encoding="utf-8")
        for flag in flags.split():
            assert f'"{flag}"' in text, (script, flag)
