"""What the docs say equals what the code does: generated blocks are current, and the facts
docs restate by hand (defaults, objects, bounds, times) are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from controller.config import SETTING_FIELDS, Settings, load_settings
from controller.plan import PriorityClass
from controller.render import _duration_up
from tools import gen_chart, gen_docs

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_generated_block_is_current() -> None:
    assert gen_docs.main(["--check"]) == 0, "run python tools/gen_docs.py and commit"
    for name in gen_docs.BLOCKS:  # every generator is used somewhere
        assert f"<!-- generated: {name} -->" in README + "".join(
            p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md")), name


def test_the_readme_recommends_the_setup_the_evaluation_ranks_first() -> None:
    ranked = gen_docs.ranked_headlines()
    best, worst = ranked[0][0], ranked[-1][0]
    assert ranked[0][1] / ranked[0][2] > ranked[-1][1] / ranked[-1][2]
    when = README.split("### When to use it", 1)[1].split("\n## ", 1)[0]
    assert f"- **{best}**: {ranked[0][1]} of {ranked[0][2]} goals met (recommended)" in when
    # the prose describes both setups, and its first paragraph after the generated headline is
    # the setup the headline ranks first, with the settings that setup was evaluated with
    prose = " ".join(when.split("<!-- /generated -->", 1)[1].split())
    first = when.split("<!-- /generated -->", 1)[1].strip().split("\n\n", 1)[0]
    assert "one ClusterQueue per team, all in one cohort, Fair Sharing on" in prose
    assert "**one shared ClusterQueue**" in prose
    if "one ClusterQueue" in best:
        assert "Fair Sharing" in worst and "cohort" in worst, worst
        assert "**one shared ClusterQueue**" in first, first
        assert "`RECLAIM_ENABLED: true`" in first and "`APPROVED_SCOPE: team`" in first, first
    else:
        assert "one ClusterQueue" in worst, worst
        assert "Fair Sharing" in first, first


def test_the_recommended_example_is_the_evaluated_setup() -> None:
    docs = [d for d in yaml.safe_load_all(
        (ROOT / "examples" / "recommended" / "queues.yaml").read_text()) if d]
    cqs = [d for d in docs if d["kind"] == "ClusterQueue"]
    lqs = [d for d in docs if d["kind"] == "LocalQueue"]
    assert len(cqs) >= 2 and len({c["spec"]["cohortName"] for c in cqs}) == 1
    for cq in cqs:  # one per team: each selects exactly its own namespace, one LocalQueue
        ns = cq["spec"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        assert [q["metadata"]["namespace"] for q in lqs
                if q["spec"]["clusterQueue"] == cq["metadata"]["name"]] == [ns]
        p = cq["spec"]["preemption"]
        assert p["reclaimWithinCohort"] == "Any" and p["withinClusterQueue"] == "LowerPriority"
        assert "weight" in cq["spec"]["fairSharing"]
        for flavor in cq["spec"]["resourceGroups"][0]["flavors"]:
            assert all("borrowingLimit" not in r for r in flavor["resources"])
    kueue = yaml.safe_load((ROOT / "examples" / "recommended" / "kueue-config.yaml").read_text())
    assert kueue["kind"] == "Configuration"
    from evaluation.kueue import FINAL_SHARE, INITIAL_SHARE

    # the strategies the evaluation models, in its order
    assert kueue["fairSharing"]["preemptionStrategies"] == [FINAL_SHARE, INITIAL_SHARE]


def test_documented_policy_defaults_are_the_codes() -> None:
    policy = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8")
    table = policy.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    checked = 0
    for key, cell in re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", table, re.M):
        parse = SETTING_FIELDS[key].metadata["parse"]
        try:
            documented = parse(cell.strip())
        except ValueError:
            continue  # a cell in words (several keys, a mapping): the README's table is checked
        assert documented == getattr(Settings(), SETTING_FIELDS[key].name), (key, cell)
        checked += 1
    assert checked >= 10, checked


def test_the_overtake_windows_are_said_the_same_everywhere() -> None:
    s = load_settings(ROOT / "config.yaml", env={})
    normal = _duration_up(s.overtake_window(PriorityClass.NORMAL))
    approved = _duration_up(s.overtake_window(PriorityClass.APPROVED))
    policy = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8")
    for text in (README, policy):
        assert normal in text and approved in text, (normal, approved)
        assert not re.search(r"\d d \d+ h|\d+ h \d+ min", text)  # one spelling of durations


def test_security_md_says_https_metrics_are_wired() -> None:
    security = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    assert "not yet switched on" not in security and "until wired" not in security
    assert "METRICS_CERT_FILE" in security


def test_the_example_snapshots_header_names_the_plans_clock() -> None:
    from controller.parse import load_snapshot

    path = ROOT / "examples" / "cluster-snapshot.yaml"
    observed = load_snapshot([path]).observed
    assert observed is not None
    header = path.read_text(encoding="utf-8").split("\napiVersion", 1)[0]
    assert f"({observed.strftime('%Y-%m-%dT%H:%M:%SZ')} here)" in header


def test_the_readme_names_every_object_manifests_install() -> None:
    table = README.split("What `manifests/` installs", 1)[1].split("\n\n", 2)[1]
    named = set(re.findall(r"`([a-z0-9-]+)(?:-<hash>)?`", table))
    for obj in gen_chart.kustomize(ROOT / "manifests"):
        name = obj["metadata"]["name"]
        if name.startswith(gen_chart.CONFIG_MAP_PREFIX):
            name = "wdrf-controller-config"
        assert name in named, f"README's object table lacks {obj['kind']} {name}"
