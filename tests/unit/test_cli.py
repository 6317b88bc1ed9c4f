"""The CLI: offline dry run, outputs, explain, exit codes, lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from controller.cli import main
from tests.support.builders import as_list, cluster_queue_dict, local_queue_dict, workload_dict

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "cluster-snapshot.yaml")


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(REPO)  # ./config.yaml is the default config
    return CliRunner()


def test_dry_run_table(runner: CliRunner) -> None:
    r = runner.invoke(main, ["--dry-run", "--from-file", EXAMPLE])
    assert r.exit_code == 0, r.output
    assert "team-nlp/job-llama-pretrain-77aa1" in r.output
    assert "Starvation bound" in r.output and "Problems (1)" in r.output


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_machine_outputs(runner: CliRunner, fmt: str) -> None:
    r = runner.invoke(main, ["--from-file", EXAMPLE, "--output", fmt])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output) if fmt == "json" else yaml.safe_load(r.output)
    keys = [d["workload"] for d in doc["decisions"] if not d["admitted"]]
    assert len(keys) == 10 and doc["teams"]
    # a100-batch preempts within itself: its admitted Workload gets its class guard. What
    # h100-shared admitted only a100-batch's reclaim (Any) reaches, whatever the priority:
    # no guard would protect it, so none is written
    assert [(d["workload"], d["clusterQueue"]) for d in doc["decisions"] if d["admitted"]] == [
        ("team-research/job-ppo-sweep-c0ffe", "a100-batch")]
    prios = [d["targetPriority"] for d in doc["decisions"] if d["clusterQueue"] == "h100-shared"
             and not d["leaveUnchanged"] and not d["admitted"]]
    assert prios == sorted(prios, reverse=True)


def test_now_flag_changes_aging(runner: CliRunner) -> None:
    a = json.loads(runner.invoke(main, ["--from-file", EXAMPLE, "-o", "json"]).output)
    b = json.loads(runner.invoke(main, ["--from-file", EXAMPLE, "-o", "json",
                                        "--now", "2025-11-30T00:00:00Z"]).output)
    assert a["now"] != b["now"]
    assert sum(d["targetPriority"] for d in b["decisions"]) > sum(
        d["targetPriority"] for d in a["decisions"])


def test_environment_sets_config_keys_under_their_own_names_only(runner: CliRunner) -> None:
    r = runner.invoke(main, ["--from-file", EXAMPLE, "-o", "json"],
                      env={"AGING_COEFFICIENT": "2", "WDRF_OUTPUT": "yaml"})
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)  # WDRF_OUTPUT is no setting: json stays json
    base = json.loads(runner.invoke(main, ["--from-file", EXAMPLE, "-o", "json"]).output)
    assert doc["decisions"][0]["breakdown"]["agingTerm"] == 2 * base["decisions"][0][
        "breakdown"]["agingTerm"]


@pytest.mark.parametrize("args", [[], ["explain", "team-nlp/llama-pretrain"]])
def test_a_bad_log_level_in_the_environment_is_a_config_error(
    runner: CliRunner, args: list[str]
) -> None:
    r = runner.invoke(main, ["--from-file", EXAMPLE, *args], env={"LOG_LEVEL": "trace"})
    assert r.exit_code == 2
    assert "1 configuration error(s):" in r.output
    assert "LOG_LEVEL=trace: expected one of DEBUG" in r.output and "(from environment)" in r.output


def test_explain(runner: CliRunner) -> None:
    r = runner.invoke(main, ["--from-file", EXAMPLE, "explain",
                             "team-research/job-notebook-batch-2f3e4"])
    assert r.exit_code == 0, r.output
    for word in ("Class:", "Fairness:", "Aging:", "Priority:", "Behind",
                 "share a100:nvidia.com/gpu"):
        assert word in r.output
    r = runner.invoke(main, ["explain", "team-nlp/job-llama-pretrain-77aa1", "--from-file",
                             EXAMPLE, "-o", "json"])
    assert r.exit_code == 0 and json.loads(r.output)["breakdown"]["class"] == "urgent"


def test_explain_bad_input_and_unknown(runner: CliRunner) -> None:
    r = runner.invoke(main, ["explain", "team-speech/job-tts-demo-1f2e3", "--from-file", EXAMPLE])
    assert r.exit_code == 0 and "LEFT UNCHANGED" in r.output and "'yes'" in r.output
    r = runner.invoke(main, ["explain", "nope/nothing", "--from-file", EXAMPLE])
    assert r.exit_code == 1
    r = runner.invoke(main, ["explain", "a/b/c", "--from-file", EXAMPLE])
    assert r.exit_code == 2


@pytest.mark.parametrize("name", ["team-nlp/llama-pretrain", "team-nlp/job-llama-pretrain-77aa1",
                                  "llama-pretrain --namespace team-nlp",
                                  "team-nlp/llama-pretrain --kind job"])
def test_explain_takes_a_jobs_name_or_the_workloads(runner: CliRunner, name: str) -> None:
    r = runner.invoke(main, ["--from-file", EXAMPLE, "explain", *name.split(), "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["workload"] == "team-nlp/job-llama-pretrain-77aa1"
    r = runner.invoke(main, ["--from-file", EXAMPLE, "explain", "team-nlp/llama-pretrain",
                             "--kind", "jobset"])
    assert r.exit_code == 1  # no JobSet of that name


def test_version_and_the_same_output_formats_everywhere(runner: CliRunner) -> None:
    from controller import __version__
    from controller.reset import kubectl_plugin

    r = runner.invoke(main, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output
    assert __version__ in runner.invoke(kubectl_plugin, ["--version"]).output
    for args in ([], ["explain"], ["why"], ["reset"]):
        text = runner.invoke(main, [*args, "--help"]).output
        assert "-o, --output table|json|yaml" in text, args
    r = runner.invoke(main, ["--from-file", EXAMPLE, "explain", "team-nlp/llama-pretrain",
                             "-o", "yaml"])
    assert r.exit_code == 0 and yaml.safe_load(r.output)["position"] == 1


@pytest.mark.parametrize("args", [[], ["why"], ["reset"], ["agent"]])
def test_kubeconfig_and_context_on_every_command(runner: CliRunner, args: list[str]) -> None:
    text = runner.invoke(main, [*args, "--help"]).output
    assert "--kubeconfig" in text and "--context" in text, args
    assert "--kubeconfig-path" in text, args  # the old flag stays, as an alias


def test_unparseable_file_exits_2_and_says_where(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("apiVersion: v1\nitems: [\n  {kind: Workload\n")
    r = runner.invoke(main, ["--dry-run", "--from-file", str(bad)])
    assert r.exit_code == 2
    assert "broken.yaml:" in r.output


def test_broken_object_does_not_crash(runner: CliRunner, tmp_path: Path) -> None:
    broken = workload_dict("broken")
    del broken["spec"]["podSets"]
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(as_list(broken, workload_dict("ok"), cluster_queue_dict(),
                                        local_queue_dict("team-a"))))
    r = runner.invoke(main, ["--from-file", str(f)])
    assert r.exit_code == 0, r.output
    assert "team-a/ok" in r.output and "Workload team-a/broken: spec.podSets" in r.output


def test_config_errors_exit_2_listing_all(runner: CliRunner) -> None:
    r = runner.invoke(main, ["--from-file", EXAMPLE, "--set", "AGING_COEFFICIENT=x",
                             "--set", "LOG_FORMAT=xml"])
    assert r.exit_code == 2
    assert "AGING_COEFFICIENT=x" in r.output and "LOG_FORMAT=xml" in r.output


def test_missing_config_file_exits_2(runner: CliRunner) -> None:
    r = runner.invoke(main, ["--config", "/nonexistent.yaml", "--from-file", EXAMPLE])
    assert r.exit_code == 2 and "not found" in r.output


def test_live_mode_without_module_is_a_clear_error(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "controller.live.main", None)  # import fails
    r = runner.invoke(main, ["--once"])
    assert r.exit_code == 1 and "live mode unavailable" in r.output


def test_health_check_without_module_is_a_clear_error(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "controller.live.health", None)
    r = runner.invoke(main, ["--health-check"])
    assert r.exit_code == 1 and "health check unavailable" in r.output


def test_agent_is_listed_lazily(runner: CliRunner) -> None:
    r = runner.invoke(main, ["--help"])
    assert r.exit_code == 0 and "agent" in r.output and "explain" in r.output


def test_offline_run_imports_no_kubernetes() -> None:
    code = (
        "import sys\n"
        "from controller.cli import main\n"
        "try:\n"
        f"    main(['--dry-run', '--from-file', {EXAMPLE!r}], standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kubernetes', 'prometheus_client', 'urllib3'))\n"
        "print('IMPORTED', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert "IMPORTED []" in out.stdout, out.stdout[-500:] + out.stderr[-2000:]


def test_every_config_key_has_a_flag(runner: CliRunner) -> None:
    from controller.config import KEYS

    r = runner.invoke(main, ["--help"])
    for key in KEYS:
        assert "--" + key.lower().replace("_", "-") in r.output, key


def test_config_flag_beats_env(runner: CliRunner) -> None:
    args = ["--from-file", EXAMPLE, "-o", "json", "--now", "2025-11-20T12:00:00Z"]
    base = json.loads(runner.invoke(main, args).output)
    env = runner.invoke(main, args, env={"AGING_COEFFICIENT": "2"})
    flag = runner.invoke(main, [*args, "--aging-coefficient", "0.5"],
                         env={"AGING_COEFFICIENT": "2"})
    assert env.exit_code == flag.exit_code == 0, env.output + flag.output

    def aging(doc: dict) -> int:  # type: ignore[type-arg]
        return sum(d["breakdown"]["agingTerm"] for d in doc["decisions"] if "breakdown" in d)

    assert aging(json.loads(env.output)) == 2 * aging(base)
    assert aging(json.loads(flag.output)) <= aging(base) // 2 + len(base["decisions"])


def test_snapshot_from_stdin(runner: CliRunner) -> None:
    text = Path(EXAMPLE).read_text()
    r = runner.invoke(main, ["--from-file", "-", "-o", "json"], input=text)
    assert r.exit_code == 0, r.output
    assert len([d for d in json.loads(r.output)["decisions"] if not d["admitted"]]) == 10


def test_dry_run_table_says_the_guard_once_in_words(runner: CliRunner) -> None:
    r = runner.invoke(main, ["--dry-run", "--from-file", EXAMPLE], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert r.output.count("only a higher class can preempt them") == 1
    admitted = [line for line in r.output.splitlines() if line.startswith("- ")]
    assert len(admitted) == 1 and all(line.split()[-1] == "guarded" for line in admitted)
    assert "1459601" in r.output.split("ClusterQueue a100-batch")[1]  # the value, not a term
    assert max(len(line) for line in r.output.splitlines()) > 120  # the terminal's width


@pytest.mark.parametrize(("cmd", "prog", "var"), [
    ("main", "wdrf-controller", "_WDRF_CONTROLLER_COMPLETE"),
    ("kubectl_plugin", "kubectl-wdrf", "_KUBECTL_WDRF_COMPLETE"),
])
def test_shell_completion_as_the_readme_says(cmd: str, prog: str, var: str) -> None:
    import tomllib

    from controller import reset

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert prog in scripts
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f'eval "$({var}=bash_source {prog})"' in readme
    command = main if cmd == "main" else reset.kubectl_plugin
    r = CliRunner().invoke(command, [], prog_name=prog, env={var: "bash_source"})
    assert r.exit_code == 0 and "complete -o nosort -F" in r.output, r.output


def test_unavailable_subcommand_says_why_in_its_help() -> None:
    from controller.cli import _unavailable

    cmd = _unavailable("agent", "controller.agent.cli", ImportError("No module named 'pynvml'"))
    r = CliRunner().invoke(cmd, ["--help"])
    assert "cannot be imported" in r.output and "pynvml" in r.output


@pytest.mark.parametrize(("text", "found"), [
    ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n", "1 Deployment (apps/v1)"),
    ("apiVersion: v1\nkind: List\nitems: oops\n", "1 List whose items is not a list"),
    ("- 1\n- two\n", "1 int (not an object), 1 str (not an object)"),
])
def test_a_snapshot_without_kueue_objects_is_refused(
    runner: CliRunner, tmp_path: Path, text: str, found: str
) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    r = runner.invoke(main, ["--from-file", str(f)])
    assert r.exit_code == 2
    assert f"no Kueue objects (Workloads, ClusterQueues, LocalQueues) in {f}: found {found}" in (
        r.output)


def test_the_no_kubeconfig_hint_names_flags_every_cluster_command_has(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import re

    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("KUBECONFIG", "KUBECONFIG_PATH", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    r = runner.invoke(main, ["why", "team-a/x"])
    assert r.exit_code == 1 and "no kubeconfig" in r.output, r.output
    flags = set(re.findall(r"(--[a-z][a-z-]+)", r.output.split("no kubeconfig", 1)[1]))
    assert "--kubeconfig" in flags
    for args in ([], ["why"], ["reset"], ["explain"]):
        text = runner.invoke(main, [*args, "--help"]).output + runner.invoke(
            main, ["--help"]).output  # explain reads the main command's flags too
        assert all(f in text for f in flags), (args, flags)
