"""Settings: config.yaml, env, CLI precedence; every error listed at once."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from controller.config import (
    KEYS,
    SETTING_FIELDS,
    ConfigError,
    HamiRule,
    Settings,
    load_settings,
    with_overrides,
)
from controller.domain import PriorityClass, TeamSource
from controller.plan import PriorityMode

REPO = Path(__file__).resolve().parents[2]


def test_config_yaml_lists_every_key_with_the_defaults() -> None:
    doc = yaml.safe_load((REPO / "config.yaml").read_text())
    assert set(doc) == set(KEYS)
    loaded = load_settings(REPO / "config.yaml", env={})
    default = Settings()
    for name in Settings.__dataclass_fields__:
        a, b = getattr(loaded, name), getattr(default, name)
        assert (dict(a) == dict(b)) if hasattr(a, "items") else a == b, name


def test_precedence_file_env_cli(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("LOG_LEVEL: warning\nAGING_COEFFICIENT: 2\nLOOP_INTERVAL: 1m\n")
    s = load_settings(cfg, env={"AGING_COEFFICIENT": "3", "UNRELATED": "x"})
    assert (s.log_level, s.aging_coefficient, s.loop_interval) == ("WARNING", 3.0, 60.0)
    s = load_settings(cfg, env={"AGING_COEFFICIENT": "3"}, overrides={"AGING_COEFFICIENT": "0.5"})
    assert s.aging_coefficient == 0.5


def test_structured_env_values() -> None:
    s = load_settings(env={
        "PRIORITY_WEIGHTS": '{"urgent": 1000, "approved": 200, "normal": 1}',
        "TEAM_WEIGHTS": "{team-a: 2}",
        "TEAM_SOURCE": "label",
        "PRIORITY_MODE": "spec",
        "LEADER_ELECTION": "false",
        "HAMI_RULES": '[{"class": "urgent", "nodePolicy": "spread"}]',
        "MAX_AGING_TIME": "2d",
    })
    assert dict(s.priority_weights) == {"urgent": 1000, "approved": 200, "normal": 1}
    assert dict(s.team_weights) == {"team-a": 2.0}
    assert s.team_source is TeamSource.LABEL and s.priority_mode is PriorityMode.SPEC
    assert s.leader_election is False and s.max_aging_time == 172800.0
    assert s.hami_rules == (HamiRule(priority_class="urgent", node_policy="spread"),)


def test_kueue_fair_sharing_is_off_unless_set(tmp_path: Path) -> None:
    """Off by default (keep_order keeps each pool's order exact); on from the file, the
    environment or the command line."""
    assert Settings().kueue_fair_sharing is False
    assert load_settings(REPO / "config.yaml", env={}).kueue_fair_sharing is False
    cfg = tmp_path / "c.yaml"
    cfg.write_text("KUEUE_FAIR_SHARING: true\n")
    assert load_settings(cfg, env={}).kueue_fair_sharing is True
    assert load_settings(cfg, env={"KUEUE_FAIR_SHARING": "false"}).kueue_fair_sharing is False
    assert load_settings(env={}, overrides={"KUEUE_FAIR_SHARING": "true"}).kueue_fair_sharing


def test_every_error_at_once(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("AGING_COEFICIENT: 1\nLOG_FORMAT: xml\nMETRICS_PORT: 70000\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, env={"PRIORITY_WEIGHTS": "{urgent: 1, approved: 2, normal: 3}",
                                "USAGE_HALF_LIFE": "soon",
                                "HAMI_DEFAULT_GPU_POLICY": "fastest"},
                      overrides={"RESOURCE_WEIGHTS": "{cpu: -1}"})
    keys = [k for k, _, _ in err.value.issues]
    assert set(keys) == {"AGING_COEFICIENT", "LOG_FORMAT", "METRICS_PORT", "USAGE_HALF_LIFE",
                         "HAMI_DEFAULT_GPU_POLICY", "RESOURCE_WEIGHTS", "PRIORITY_WEIGHTS"}
    text = err.value.render()
    assert "LOG_FORMAT=xml" in text and "from environment" in text and "unknown key" in text


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"PRIORITY_WEIGHTS": "{urgent: 1, approved: 2, normal: 3}"}, "PRIORITY_WEIGHTS"),
        ({"FAIRNESS_POINTS": "148500"}, "FAIRNESS_POINTS"),  # = smallest gap x unit
        ({"APPROVED_PREEMPTS_NORMAL": "true"}, "APPROVED_PREEMPTS_NORMAL"),  # bands overlap
        ({"TEAM_WEIGHTS": "{a: 1e308}"}, "TEAM_WEIGHTS"),
        ({"TEAM_WEIGHTS": "{a: 1e-9}"}, "TEAM_WEIGHTS"),
        ({"RESOURCE_WEIGHTS": "{cpu: 1e300}"}, "RESOURCE_WEIGHTS"),
        ({"RESOURCE_WEIGHTS": "{cpu: 0}"}, "RESOURCE_WEIGHTS"),
        ({"PRIORITY_REBASE_PERIOD": "10m"}, "PRIORITY_REBASE_PERIOD"),
        ({"BASE_PRIORITY_CAP": "-1"}, "BASE_PRIORITY_CAP"),
        ({"FAIRNESS_HYSTERESIS": "9"}, "FAIRNESS_HYSTERESIS"),
        ({"REQUEUE_TIMESTAMP": "later"}, "REQUEUE_TIMESTAMP"),
        ({"AGING_COEFFICIENT": "5000"}, "AGING_COEFFICIENT"),
        ({"TEAM_SOURCE": "label", "TEAM_LABEL_KEY": ""}, "TEAM_LABEL_KEY"),
        ({"TEAM_WEIGHTS": "{a: 0}"}, "TEAM_WEIGHTS"),
        ({"HAMI_RULES": "[{nodePolicy: fast}]"}, "HAMI_RULES"),
        ({"HAMI_RULES": "[{color: red, nodePolicy: spread}]"}, "HAMI_RULES"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
        ({"LEADER_ELECTION": "maybe"}, "LEADER_ELECTION"),
        ({"KUEUE_FAIR_SHARING": "maybe"}, "KUEUE_FAIR_SHARING"),
        ({"PRIORITY_MODE": "fast"}, "PRIORITY_MODE"),
    ],
)
def test_invalid_values(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env=env, config_path=REPO / "config.yaml")
    assert key in [k for k, _, _ in err.value.issues]


def test_unreadable_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("a: [\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(cfg, env={})
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.yaml", env={})


def test_overtake_window_and_warning() -> None:
    s = Settings()
    assert dict(s.priority_weights) == {"urgent": 1000, "approved": 100, "normal": 1}
    assert s.overtake_window(PriorityClass.NORMAL) == 100000 + 1
    assert s.overtake_window(PriorityClass.APPROVED) == 99 * 1500 + 100000 + 1
    assert math.isinf(s.overtake_window(PriorityClass.URGENT))  # urgent: by design, see docs
    assert not s.warnings()
    text = s.starvation_bound(lambda sec: f"{sec:.0f}s")
    assert "normal work arriving within 100001s" in text
    assert "approved work arriving within 248501s" in text
    assert "and by urgent work at any time" in text
    covered = with_overrides(s, max_aging_time=30 * 86400.0, priority_class_unit=2000)
    assert covered.overtake_window() == 999 * 2000 + 100000 + 1
    assert "at any time" not in covered.starvation_bound(str)
    weak = load_settings(env={"AGING_COEFFICIENT": "0.01"}, config_path=REPO / "config.yaml")
    assert math.isinf(weak.overtake_window()) and weak.warnings()


def test_bands_guards_and_the_urgent_preemption_warning() -> None:
    s = Settings()
    span = 100000 + 1 * (7 * 86400 + 7 * 86400)
    assert s.band_span() == span
    assert s.guard(PriorityClass.URGENT) == 1000 * 1500 + span + 1
    # approved's guard one above normal's: urgent preemption takes guarded normal work first
    assert s.guard(PriorityClass.APPROVED) - 1 == s.guard(PriorityClass.NORMAL) \
        == 100 * 1500 + span + 1
    assert s.urgent_preempts() and s.class_term(PriorityClass.URGENT) > s.guard(
        PriorityClass.APPROVED)
    narrow = with_overrides(s, priority_class_unit=1020)  # the v1 unit: bands overlap
    assert not narrow.urgent_preempts()
    assert any("urgent work cannot preempt" in w for w in narrow.warnings())
    apn = with_overrides(s, approved_preempts_normal=True, max_aging_time=86400.0,
                         rebase_period=86400.0, priority_class_unit=3000)
    assert apn.guard(PriorityClass.NORMAL) < apn.class_term(PriorityClass.APPROVED)


def test_deprecated_key_is_accepted_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("AGING_STEP: 5m\n")
    with caplog.at_level("WARNING"):
        load_settings(cfg, env={"AGING_STEP": "1h"})
    assert caplog.text.count("AGING_STEP") == 2 and "priority model v2" in caplog.text


def _errors(tmp_path: Path, text: str) -> str:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg, env={})
    return exc.value.render()


@pytest.mark.parametrize("text", ["LOOP_INTERVAL: 0", "LOOP_INTERVAL: 10ms",
                                  "RETRY_PERIOD: 0.1", "ONCE_TIMEOUT: 0"])
def test_intervals_have_lower_bounds(tmp_path: Path, text: str) -> None:
    key = text.split(":")[0]
    assert f"  {key}=" in _errors(tmp_path, text) and "must be >= " in _errors(tmp_path, text)


@pytest.mark.parametrize(("text", "value"), [
    ("FAIRNESS_POINTS: 1e5", 100000), ("FAIRNESS_POINTS: 1.0E+5", 100000),
    ("AGING_COEFFICIENT: .5e1", 5.0), ("GPU_MEMORY_MIB: 0o17", 15),
])
def test_numbers_as_yaml_1_2_reads_them(tmp_path: Path, text: str, value: float) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text + "\n")
    s = load_settings(cfg, env={})
    key = text.split(":")[0]
    assert getattr(s, SETTING_FIELDS[key].name) == value
    assert getattr(load_settings(None, env={key: text.split(": ")[1]}),
                   SETTING_FIELDS[key].name) == value  # the same from the environment


def test_the_changed_key_is_blamed(tmp_path: Path) -> None:
    text = _errors(tmp_path, "FAIRNESS_POINTS: 0\n")
    assert "  FAIRNESS_POINTS=0: FAIRNESS_LEVELS=50 must be <= FAIRNESS_POINTS" in text
    text = _errors(tmp_path, "FAIRNESS_LEVELS: 500\nFAIRNESS_POINTS: 100\n")
    assert "  FAIRNESS_LEVELS=500: must be <= FAIRNESS_POINTS" in text  # both changed: as is
    text = _errors(tmp_path, "RETRY_PERIOD: 12\n")
    assert "  RETRY_PERIOD=12: RENEW_DEADLINE=10.0 need 0 < RETRY_PERIOD" in text


@pytest.mark.parametrize("version", ["v3.0", "v2.4", "v1.9"])
def test_unknown_hami_releases_are_refused(tmp_path: Path, version: str) -> None:
    assert f"HAMI_VERSION={version}: unknown HAMi release" in _errors(
        tmp_path, f"HAMI_VERSION: {version}\n")


def test_unknown_keys_get_a_did_you_mean(tmp_path: Path) -> None:
    text = _errors(tmp_path, "AGING_COEFFICENT: 2\nloop_interval: 5\nNOTHING_LIKE_IT: 1\n")
    assert "did you mean AGING_COEFFICIENT?" in text and "did you mean LOOP_INTERVAL?" in text
    assert "NOTHING_LIKE_IT=1: unknown key in" in text
    assert text.count("did you mean") == 2
    with pytest.raises(ConfigError, match="did you mean WRITE_BUDGET"):
        load_settings(None, env={}, overrides={"WRITE_BUDGT": "3"})
