"""Typed, validated settings: config.yaml, then environment variables, then CLI flags.

Every key is one `setting(...)` line on `Settings` (name, default, parser, help): adding a key is
a one-line change here plus its commented entry in config.yaml. Loading collects every error
(key, value, why) and raises them together in one `ConfigError`.
"""

from __future__ import annotations

import difflib
import enum
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from controller.domain import (
    CPU,
    GPU,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    MEMORY,
    ApprovedScope,
    CapacitySource,
    PriorityClass,
    PriorityMode,
    RequeueTimestamp,
    TeamSource,
)
from controller.hami_values import NODE_POLICIES, parse_hami_version, valid_gpu_policy

# Policy output range. Kueue priorities are int32; the boost stays well inside so base + boost
# cannot overflow for any sane base (WorkloadPriorityClass values are usually < 1e6).
MAX_BOOST = 1_000_000_000
MAX_OVERRIDE = 1_000_000_000  # wdrf.x-k8s.io/priority-override accepts 0..MAX_OVERRIDE
MAX_BASE_CAP = 100_000_000
# Weights are ratios: bounded so shares stay finite and printable (no NaN, no Infinity).
MIN_TEAM_WEIGHT, MAX_TEAM_WEIGHT = 1e-3, 1e6
MAX_RESOURCE_WEIGHT = 1e6
# Aging reference instants are EPOCH + k x PRIORITY_REBASE_PERIOD (a Monday, 00:00 UTC).
REBASE_EPOCH_ISO = "2026-01-05T00:00:00+00:00"

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(Exception):
    """All configuration errors found at once."""

    def __init__(self, issues: list[tuple[str, str, str]]) -> None:
        self.issues = issues
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{len(self.issues)} configuration error(s):"]
        lines += [f"  {key}={value}: {why}" if value else f"  {key}: {why}"
                  for key, value, why in self.issues]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Value parsers: raw value (YAML-typed, or a string from env/CLI) -> typed value, or ValueError.


def _from_text(raw: object) -> object:
    """Env vars and CLI flags are strings; read them as YAML scalars/mappings."""
    if isinstance(raw, str):
        try:
            return yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError as exc:
            raise ValueError(f"not valid YAML/JSON: {exc}") from exc
    return raw


def p_str(raw: object) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):
        raise ValueError("expected a string")
    return str(raw)


def p_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.strip().lower() in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


# YAML 1.2 (core schema) numbers that PyYAML, a YAML 1.1 reader, leaves as strings: 1e7,
# 1.5E+3, 0o17, .5e-3. Kubernetes and Helm read these as numbers.
_YAML12_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_YAML12_OCTAL = re.compile(r"^0o[0-7]+$")


def _yaml12_number(value: object) -> object:
    if isinstance(value, str):
        text = value.strip()
        if _YAML12_OCTAL.match(text):
            return int(text[2:], 8)
        if _YAML12_FLOAT.match(text):
            f = float(text)
            return int(f) if f.is_integer() and not re.search(r"[.eE]", text) else f
    return value


def _number(raw: object) -> float:
    value = _yaml12_number(_from_text(raw))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a number")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError("expected a finite number")
    return f


def p_nonneg_float(raw: object) -> float:
    f = _number(raw)
    if f < 0:
        raise ValueError("must be >= 0")
    return f


def p_pos_int(raw: object) -> int:
    f = _number(raw)
    if f != int(f) or f < 1:
        raise ValueError("expected a positive integer")
    return int(f)


def p_nonneg_int(raw: object) -> int:
    f = _number(raw)
    if f != int(f) or f < 0:
        raise ValueError("expected an integer >= 0")
    return int(f)


def p_pos_float(raw: object) -> float:
    f = _number(raw)
    if f <= 0:
        raise ValueError("must be > 0")
    return f


def p_fraction(raw: object) -> float:
    f = _number(raw)
    if not 0 <= f < 1:
        raise ValueError("must be >= 0 and < 1")
    return f


def p_hysteresis(raw: object) -> float:
    f = _number(raw)
    if not 0 <= f <= 5:
        raise ValueError("must be 0..5 (fairness levels)")
    return f


def p_base_cap(raw: object) -> int:
    n = p_nonneg_int(raw)
    if n > MAX_BASE_CAP:
        raise ValueError(f"must be <= {MAX_BASE_CAP}")
    return n


def p_rebase_period(raw: object) -> float:
    f = p_duration(raw)
    if f < 3600:
        raise ValueError("must be >= 1h (default 7d: every pending Workload is rewritten once "
                         "per period)")
    return f


def p_port(raw: object) -> int:
    n = p_nonneg_int(raw)
    if n > 65535:
        raise ValueError("port must be 0..65535 (0 = off)")
    return n


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def p_duration(raw: object) -> float:
    """Seconds: a number, or a string like 300, 90s, 5m, 2h, 7d."""
    if isinstance(raw, str):
        m = _DURATION.match(raw)
        if m is None:
            raise ValueError("expected a duration: seconds, or e.g. 90s, 5m, 2h, 7d")
        return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    return p_nonneg_float(raw)


_PACE = "each cycle lists, plans and writes; faster would only load the API server"


def duration_at_least(least: float, why: str) -> Callable[[object], float]:
    """A duration parser with a lower bound (`why` says what a smaller value would break)."""
    def parse(raw: object) -> float:
        f = p_duration(raw)
        if f < least:
            raise ValueError(f"must be >= {least:g}s ({why})")
        return f

    return parse


def _choice(*options: str) -> Callable[[object], str]:
    def parse(raw: object) -> str:
        if not isinstance(raw, str) or raw.strip().lower() not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return raw.strip().lower()

    return parse


def p_priority_mode(raw: object) -> PriorityMode:
    return PriorityMode(_choice(*(m.value for m in PriorityMode))(raw))


class RequeueTimestampSetting(enum.StrEnum):
    """REQUEUE_TIMESTAMP: Kueue's requeuingStrategy.timestamp as configured here, or auto."""

    AUTO = "auto"  # Kueue's configuration when the controller can read it, else eviction
    EVICTION = RequeueTimestamp.EVICTION.value
    CREATION = RequeueTimestamp.CREATION.value


class CapacitySourceSetting(enum.StrEnum):
    """CAPACITY_SOURCE: where GPU capacity comes from (`domain.CapacitySource`), or auto."""

    AUTO = "auto"  # per node: fresh agent inventory, else HAMi's register annotation
    AGENT = CapacitySource.AGENT.value
    HAMI = CapacitySource.HAMI.value
    QUOTA = CapacitySource.QUOTA.value


def p_requeue_timestamp(raw: object) -> RequeueTimestampSetting:
    return RequeueTimestampSetting(_choice(*RequeueTimestampSetting)(raw))


def p_capacity_source(raw: object) -> CapacitySourceSetting:
    return CapacitySourceSetting(_choice(*CapacitySourceSetting)(raw))


def p_approved_scope(raw: object) -> ApprovedScope:
    return ApprovedScope(_choice(*(s.value for s in ApprovedScope))(raw))


def p_reclaim_margin(raw: object) -> float:
    value = _number(raw)
    if not 0 <= value <= 10:
        raise ValueError("expected 0..10 (a fraction of the entitlement)")
    return value


def p_team_source(raw: object) -> TeamSource:
    return TeamSource(_choice(*(t.value for t in TeamSource))(raw))


def p_log_level(raw: object) -> str:
    if not isinstance(raw, str) or raw.strip().upper() not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
    return raw.strip().upper()


def _mapping(raw: object) -> Mapping[object, object]:
    value = _from_text(raw)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("expected a mapping (YAML or JSON object)")
    return value


def p_weights(raw: object) -> Mapping[str, float]:
    out: dict[str, float] = {}
    for k, v in _mapping(raw).items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"key {k!r} must be a non-empty string")
        try:
            w = _number(v)
        except ValueError as exc:
            raise ValueError(f"{k}: {exc}") from None
        if w < 0:
            raise ValueError(f"{k}: weight must be >= 0")
        out[k] = w
    return MappingProxyType(out)


# TEAM_WEIGHTS: auto - each team's weight is Kueue's fairSharing.weight of the ClusterQueue (or,
# with Admission Fair Sharing, the LocalQueue) that team alone uses; the identity of this empty
# mapping is the flag.
AUTO_TEAM_WEIGHTS: Mapping[str, float] = MappingProxyType({})


def p_team_weights(raw: object) -> Mapping[str, float]:
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return AUTO_TEAM_WEIGHTS
    out = p_weights(raw)
    for k, w in out.items():
        if not MIN_TEAM_WEIGHT <= w <= MAX_TEAM_WEIGHT:
            raise ValueError(
                f"{k}: team weight must be {MIN_TEAM_WEIGHT:g}..{MAX_TEAM_WEIGHT:g}"
            )
    return out


def p_team_namespaces(raw: object) -> Mapping[str, str]:
    out: dict[str, str] = {}
    for k, v in _mapping(raw).items():
        if not isinstance(k, str) or not k or not isinstance(v, str) or not v:
            raise ValueError(f"{k!r}: expected namespace: team (non-empty strings)")
        out[k] = v
    return MappingProxyType(out)


def p_priority_weights(raw: object) -> Mapping[str, int]:
    given = _mapping(raw)
    names = [c.value for c in PriorityClass]
    out: dict[str, int] = {}
    for k, v in given.items():
        if k not in names:
            raise ValueError(f"unknown class {k!r} (expected {', '.join(names)})")
        try:
            out[str(k)] = p_nonneg_int(v)
        except ValueError as exc:
            raise ValueError(f"{k}: {exc}") from None
    missing = [n for n in names if n not in out]
    if missing:
        raise ValueError(f"missing class(es): {', '.join(missing)}")
    return MappingProxyType(out)


def p_resource_weights(raw: object) -> Mapping[str, float]:
    out = p_weights(raw)
    if not out:
        raise ValueError("at least one resource needs a weight")
    for k, w in out.items():
        if w > MAX_RESOURCE_WEIGHT:
            raise ValueError(f"{k}: resource weight must be <= {MAX_RESOURCE_WEIGHT:g}")
    if not any(w > 0 for w in out.values()):
        raise ValueError("at least one resource needs a weight > 0")
    return out


def p_node_policy(raw: object) -> str:
    value = p_str(raw).strip()
    if value and value not in NODE_POLICIES:
        raise ValueError(f"expected empty or one of {', '.join(NODE_POLICIES)}")
    return value


def p_gpu_policy(raw: object) -> str:
    value = p_str(raw).strip()
    if value and not valid_gpu_policy(value, "v2.10"):
        raise ValueError("not a HAMi GPU scheduler policy (binpack, spread, topology-aware, ...)")
    return value


# The HAMi releases whose behaviour the controller knows (docs: Compatibility).
HAMI_OLDEST, HAMI_NEWEST = (2, 5), (2, 10)


def p_hami_version(raw: object) -> str:
    value = p_str(raw).strip()
    version = parse_hami_version(value)
    if version is None:
        raise ValueError("expected a HAMi version like v2.10 or v2.7.1")
    if version[0] != HAMI_OLDEST[0] or version < HAMI_OLDEST:
        raise ValueError(f"unknown HAMi release: known are v{HAMI_OLDEST[0]}.{HAMI_OLDEST[1]} to "
                         f"v{HAMI_NEWEST[0]}.{HAMI_NEWEST[1]} and later v2 releases (set the "
                         f"newest known, v{HAMI_NEWEST[0]}.{HAMI_NEWEST[1]}, for a newer v2)")
    return value


@dataclass(frozen=True, slots=True)
class HamiRule:
    """A HAMi policy rule: the first matching rule that sets a policy wins for that policy."""

    priority_class: str | None = None  # urgent | approved | normal
    local_queue: str | None = None
    cluster_queue: str | None = None
    fractional: bool | None = None  # True: some container asks for < 100 % of a GPU
    node_policy: str = ""
    gpu_policy: str = ""

    def matches(
        self, priority_class: str, local_queue: str, cluster_queue: str | None, fractional: bool
    ) -> bool:
        return (
            (self.priority_class is None or self.priority_class == priority_class)
            and (self.local_queue is None or self.local_queue == local_queue)
            and (self.cluster_queue is None or self.cluster_queue == cluster_queue)
            and (self.fractional is None or self.fractional == fractional)
        )


_RULE_KEYS = {"class", "localQueue", "clusterQueue", "fractional", "nodePolicy", "gpuPolicy"}


def p_hami_rules(raw: object) -> tuple[HamiRule, ...]:
    value = _from_text(raw)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError("expected a list of rules")
    rules: list[HamiRule] = []
    classes = [c.value for c in PriorityClass]
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ValueError(f"rule {i}: expected a mapping")
        unknown = set(item) - _RULE_KEYS
        if unknown:
            raise ValueError(f"rule {i}: unknown key(s) {sorted(map(str, unknown))}")
        cls = item.get("class")
        if cls is not None and cls not in classes:
            raise ValueError(f"rule {i}: class must be one of {', '.join(classes)}")
        frac = item.get("fractional")
        if frac is not None and not isinstance(frac, bool):
            raise ValueError(f"rule {i}: fractional must be true or false")
        try:
            node = p_node_policy(item.get("nodePolicy", ""))
            gpu = p_gpu_policy(item.get("gpuPolicy", ""))
        except ValueError as exc:
            raise ValueError(f"rule {i}: {exc}") from None
        if not node and not gpu:
            raise ValueError(f"rule {i}: sets neither nodePolicy nor gpuPolicy")
        lq, cq = item.get("localQueue"), item.get("clusterQueue")
        rules.append(
            HamiRule(
                priority_class=cls,
                local_queue=None if lq is None else str(lq),
                cluster_queue=None if cq is None else str(cq),
                fractional=frac,
                node_policy=node,
                gpu_policy=gpu,
            )
        )
    return tuple(rules)


# ---------------------------------------------------------------------------------------------


def setting(key: str, default: Any, parse: Callable[[object], Any], doc: str) -> Any:
    """Declare one config key (one line per key)."""
    meta = {"key": key, "parse": parse, "doc": doc}
    if isinstance(default, dict | list):
        frozen = (
            MappingProxyType(dict(default)) if isinstance(default, dict) else tuple(default)
        )
        return field(default_factory=lambda: frozen, metadata=meta)
    return field(default=default, metadata=meta)


_DEFAULT_PRIORITY_WEIGHTS = {"urgent": 1000, "approved": 100, "normal": 1}
_DEFAULT_RESOURCE_WEIGHTS = {CPU: 1.0, MEMORY: 1.0, GPU: 1.0, GPUCORES: 1.0, GPUMEM_PERCENTAGE: 1.0}
_DEFAULT_HAMI_RULES = (HamiRule(fractional=True, node_policy="binpack", gpu_policy="binpack"),)


@dataclass(frozen=True)
class LoggingSettings:
    """LOG_LEVEL and LOG_FORMAT: what `controller.logs.setup_logging` reads."""

    log_level: str = setting("LOG_LEVEL", "INFO", p_log_level, "DEBUG|INFO|WARNING|ERROR")
    log_format: str = setting("LOG_FORMAT", "text", _choice("text", "json"), "text|json")


@dataclass(frozen=True)
class HamiSettings:
    """What `controller.hami.decide_hami` reads: the HAMi release and the scheduling-policy
    defaults and rules (docs/policy.md, "HAMi decisions")."""

    hami_version: str = setting("HAMI_VERSION", "v2.10", p_hami_version, "HAMi release")
    hami_default_node_policy: str = setting(
        "HAMI_DEFAULT_NODE_POLICY", "", p_node_policy, "empty: leave HAMi's default"
    )
    hami_default_gpu_policy: str = setting(
        "HAMI_DEFAULT_GPU_POLICY", "", p_gpu_policy, "empty: leave HAMi's default"
    )
    hami_rules: tuple[HamiRule, ...] = setting(
        "HAMI_RULES", list(_DEFAULT_HAMI_RULES), p_hami_rules, "policy rules"
    )


@dataclass(frozen=True)
class PolicySettings(HamiSettings):
    """Everything `compute_plan` reads: the priority formula, reclaim, accounting and the
    HAMi decisions (docs/policy.md, "Configuration reference"), with the rules derived from
    them (class bands, guards, the starvation bound)."""

    # --- priority formula ---
    priority_weights: Mapping[str, int] = setting(
        "PRIORITY_WEIGHTS", _DEFAULT_PRIORITY_WEIGHTS, p_priority_weights, "class weights"
    )
    priority_class_unit: int = setting(
        "PRIORITY_CLASS_UNIT", 1500, p_pos_int, "priority points per unit of class weight"
    )
    fairness_points: int = setting(
        "FAIRNESS_POINTS", 100000, p_nonneg_int, "points for a team with zero usage"
    )
    fairness_levels: int = setting(
        "FAIRNESS_LEVELS", 50, p_pos_int, "fairness factor quantization levels"
    )
    fairness_hysteresis: float = setting(
        "FAIRNESS_HYSTERESIS", 2.0, p_hysteresis,
        "a team changes fairness level only this many levels (0..5) past it",
    )
    aging_coefficient: float = setting(
        "AGING_COEFFICIENT", 1.0, p_nonneg_float, "aging points per second waited"
    )
    max_aging_time: float = setting(
        "MAX_AGING_TIME", 604800.0, p_duration, "credited wait is capped here (at each rebase)"
    )
    rebase_period: float = setting(
        "PRIORITY_REBASE_PERIOD", 604800.0, p_rebase_period,
        "the aging reference moves (every pending Workload rewritten once) this often",
    )
    base_priority_cap: int = setting(
        "BASE_PRIORITY_CAP", 0, p_base_cap,
        "a Workload's own base priority counts at most +-this inside its class band",
    )
    approved_preempts_normal: bool = setting(
        "APPROVED_PREEMPTS_NORMAL", False, p_bool,
        "admitted normal Workloads may be preempted by approved ones (where the queue allows)",
    )
    approved_scope: ApprovedScope = setting(  # noqa: RUF009 - setting() returns a field
        "APPROVED_SCOPE", ApprovedScope.GLOBAL, p_approved_scope,
        "team: approval orders the team's own work, may preempt its own normal work and ranks "
        "at most at its team's head across teams; global: the approved band above all normal",
    )
    # --- reclaim inside a ClusterQueue (through Kueue's withinClusterQueue preemption) ---
    reclaim_enabled: bool = setting(
        "RECLAIM_ENABLED", False, p_bool,
        "lower the guard of an over-entitled team's Workloads so an under-served team's "
        "Workload of the same class can preempt them (ClusterQueues that preempt only)",
    )
    reclaim_margin: float = setting(
        "RECLAIM_MARGIN", 0.2, p_reclaim_margin,
        "a team is reclaimed from only above (1 + this) x its entitlement",
    )
    min_runtime: float = setting(
        "MIN_RUNTIME", 1800.0, p_duration,
        "an admitted Workload is reclaimable only after running this long",
    )
    reclaim_budget_per_hour: int = setting(
        "RECLAIM_BUDGET_PER_HOUR", 60, p_nonneg_int,
        "per pool: Workloads made reclaimable at once, less preemptions in the last hour",
    )
    requeue_timestamp: RequeueTimestampSetting = setting(  # noqa: RUF009
        "REQUEUE_TIMESTAMP", RequeueTimestampSetting.AUTO, p_requeue_timestamp,
        "where a requeued Workload's wait starts (auto: Kueue's config, else eviction)",
    )
    kueue_fair_sharing: bool = setting(
        "KUEUE_FAIR_SHARING", False, p_bool,
        "Kueue runs Fair Sharing (its config's fairSharing): across a cohort's ClusterQueues it "
        "orders by share, so a value is kept wherever its ClusterQueue's order stays exact",
    )
    # --- accounting ---
    resource_weights: Mapping[str, float] = setting(
        "RESOURCE_WEIGHTS", _DEFAULT_RESOURCE_WEIGHTS, p_resource_weights, "per-resource weight"
    )
    team_source: TeamSource = setting(  # noqa: RUF009 - setting() returns a field
        "TEAM_SOURCE", TeamSource.NAMESPACE, p_team_source, "namespace|label|localqueue"
    )
    team_label_key: str = setting("TEAM_LABEL_KEY", "wdrf.x-k8s.io/team", p_str, "label key")
    team_weights: Mapping[str, float] = setting(
        "TEAM_WEIGHTS", {}, p_team_weights,
        "team -> weight (default 1); auto: Kueue's fairSharing.weight of the ClusterQueue "
        "(or LocalQueue) the team alone uses",
    )
    team_namespaces: Mapping[str, str] = setting(
        "TEAM_NAMESPACES", {}, p_team_namespaces, "namespace -> team (default: the namespace)"
    )
    active_usage_cutoff: float = setting(
        "ACTIVE_USAGE_CUTOFF", 0.001, p_fraction,
        "a team with only decayed history counts in W while its share is above this",
    )
    usage_half_life: float = setting("USAGE_HALF_LIFE", 0.0, p_duration, "0 = current usage")
    capacity_source: CapacitySourceSetting = setting(  # noqa: RUF009
        "CAPACITY_SOURCE", CapacitySourceSetting.AUTO, p_capacity_source, "capacity source"
    )
    inventory_max_age: float = setting(
        "INVENTORY_MAX_AGE", 300.0, p_duration, "agent inventory older than this is ignored"
    )
    gpu_memory_mib: int = setting(
        "GPU_MEMORY_MIB", 0, p_nonneg_int, "card memory when no inventory (0 = unknown)"
    )

    def class_weight(self, cls: PriorityClass) -> int:
        return self.priority_weights[cls.value]

    def class_term(self, cls: PriorityClass) -> int:
        """The floor of a class's band."""
        return self.class_weight(cls) * self.priority_class_unit

    def team_scoped_approval(self) -> bool:
        return self.approved_scope is ApprovedScope.TEAM

    def pending_class_term(self, cls: PriorityClass) -> int:
        """The floor of the band a pending Workload of `cls` is written in: its class term,
        except team-scoped approval, which sits one point above the normal band's floor (it
        ranks at its team's head, docs/policy.md)."""
        if cls is PriorityClass.APPROVED and self.team_scoped_approval():
            return self.class_term(PriorityClass.NORMAL) + 1
        return self.class_term(cls)

    def weights_from_kueue(self) -> bool:
        return self.team_weights is AUTO_TEAM_WEIGHTS

    def aging_span(self) -> int:
        """Largest aging term: the cap plus one rebase period (docs/policy.md)."""
        return math.floor(self.aging_coefficient * (self.max_aging_time + self.rebase_period))

    def band_span(self) -> int:
        """Width of every class band: base, fairness and aging terms together."""
        return 2 * self.base_priority_cap + self.fairness_points + self.aging_span()

    def protected_class(self, cls: PriorityClass) -> PriorityClass:
        """The highest class of pending work that must not preempt admitted work of class
        `cls`: its own class; approved for normal unless APPROVED_PREEMPTS_NORMAL (global scope;
        with team-scoped approval a team's approved work reaches only its own normal work,
        through the plan's exposures)."""
        if cls is PriorityClass.NORMAL and (
            self.team_scoped_approval() or not self.approved_preempts_normal
        ):
            return PriorityClass.APPROVED
        return cls

    def guard(self, cls: PriorityClass) -> int:
        """Priority of an admitted Workload of class `cls` where preemption can reach it:
        strictly above every pending Workload that must not preempt it (`protected_class` and
        below), so aging and fairness never evict. Where normal work is protected from
        approved work, both guards would be equal; approved's is one higher, so an urgent
        Workload's preemption (Kueue takes the lowest priority first) takes guarded normal
        work before guarded approved work."""
        value = self.pending_class_term(self.protected_class(cls)) + self.band_span() + 1
        return value + 1 if cls is PriorityClass.APPROVED \
            and self.protected_class(PriorityClass.NORMAL) is PriorityClass.APPROVED else value

    def max_score(self) -> int:
        """Largest priority the policy writes (without override): the urgent guard."""
        return self.guard(PriorityClass.URGENT)

    def urgent_preempts(self) -> bool:
        """Does the freshest urgent Workload outrank every lower-class guard?"""
        return self.class_term(PriorityClass.URGENT) > self.guard(PriorityClass.APPROVED)

    def stand_in_value(self, cls: PriorityClass) -> int:
        """The value of the WorkloadPriorityClass stamped on a new Job of class `cls`
        (manifests/admission/class-priority.yaml), which orders it while the controller is down:
        urgent at its band's floor (above every lower guard when `urgent_preempts`, never above
        a value written for urgent work); approved at its floor only where approved work may
        preempt normal work, else normal's 0 (any value above that would let approved work
        preempt admitted normal work that has no guard); normal 0, the default base."""
        if cls is PriorityClass.URGENT:
            return self.class_term(cls)
        if cls is PriorityClass.APPROVED and self.approved_preempts_normal \
                and not self.team_scoped_approval():
            return self.class_term(cls)
        return 0

    def overtake_window(self, by: PriorityClass = PriorityClass.URGENT) -> float:
        """Seconds after which a normal workload ranks above every later arrival of class `by` or
        a lower class (math.inf if aging can never close that gap before MAX_AGING_TIME). The
        default, `by=URGENT`, bounds overtaking by all later arrivals. See docs/policy.md."""
        gap = (
            self.pending_class_term(by) - self.pending_class_term(PriorityClass.NORMAL)
            + self.fairness_points + 2 * self.base_priority_cap
        )
        if self.aging_coefficient <= 0:
            return math.inf
        window = math.ceil(gap / self.aging_coefficient) + 1
        return window if window <= self.max_aging_time else math.inf

    def starvation_bound(self, duration: Callable[[float], str]) -> str:
        """The starvation bound as one sentence, per overtaking class; `duration` formats
        seconds. Said plainly when a class can overtake a normal workload at any time."""
        parts: list[str] = []
        always: list[str] = []
        for cls in (PriorityClass.NORMAL, PriorityClass.APPROVED, PriorityClass.URGENT):
            window = self.overtake_window(cls)
            if math.isinf(window):
                always.append(cls.value)
                parts.append(f"{cls.value} work at any time")
            else:
                parts.append(f"{cls.value} work arriving within {duration(window)} after it")
        cap = f"MAX_AGING_TIME={duration(self.max_aging_time)}"
        if len(always) == len(parts):
            return (f"none: a normal workload can be overtaken by later work of every class, "
                    f"without limit (aging up to {cap} cannot close the gap).")
        text = (f"while it waits less than {cap}, a normal workload can be overtaken only by "
                "work that arrived before it, by " + ", by ".join(parts[:-1])
                + f" and by {parts[-1]}")
        if always:
            text += (f" (a fresh {always[-1]} workload outranks a normal one even at the aging "
                     "cap)")
        return text + "."

    def warnings(self) -> list[str]:
        out: list[str] = []
        if math.isinf(self.overtake_window(PriorityClass.NORMAL)):
            out.append(
                "no starvation bound: AGING_COEFFICIENT x MAX_AGING_TIME cannot close the "
                "fairness range; a normal workload can be overtaken indefinitely, even by later "
                "normal work"
            )
        elif math.isinf(self.overtake_window(PriorityClass.APPROVED)):
            out.append(
                "no starvation bound against approved work: AGING_COEFFICIENT x MAX_AGING_TIME "
                "cannot close the gap between approved and normal; a normal workload can be "
                "overtaken indefinitely by later approved work"
            )
        if self.approved_preempts_normal and self.team_scoped_approval():
            out.append(
                "APPROVED_PREEMPTS_NORMAL is ignored with APPROVED_SCOPE=team: approved work "
                "preempts its own team's normal work there, and no other team's"
            )
        odd = sorted(r for r in self.resource_weights if "/" not in r
                     and r not in ("cpu", "memory", "ephemeral-storage", "pods")
                     and not r.startswith("hugepages-"))
        if odd:
            out.append(f"RESOURCE_WEIGHTS names no Kubernetes resource: {', '.join(odd)} "
                       "(a typo? GPUs are nvidia.com/gpu); it never matches any usage")
        if not self.urgent_preempts():
            out.append(
                "urgent work cannot preempt: the urgent band starts at "
                f"{self.class_term(PriorityClass.URGENT)}, not above the approved guard "
                f"{self.guard(PriorityClass.APPROVED)}; raise PRIORITY_CLASS_UNIT or lower "
                "MAX_AGING_TIME / PRIORITY_REBASE_PERIOD / FAIRNESS_POINTS"
            )
        return out


@dataclass(frozen=True)
class LiveSettings:
    """What only the live controller reads: its loop, the API connection, the priority mode,
    leader election, metrics and health, Events, write budget and caches."""

    loop_interval: float = setting(
        "LOOP_INTERVAL", 10.0, duration_at_least(1, _PACE), "seconds between cycles"
    )
    kubeconfig_path: str = setting("KUBECONFIG_PATH", "", p_str, "empty: in-cluster/default")
    kubeconfig_context: str = setting(
        "KUBECONFIG_CONTEXT", "", p_str, "kubeconfig context (empty: its current context)"
    )
    priority_mode: PriorityMode = setting(  # noqa: RUF009 - setting() returns a field
        "PRIORITY_MODE", PriorityMode.AUTO, p_priority_mode, "auto|boost|spec"
    )
    multikueue_manager_kubeconfig: str = setting(
        "MULTIKUEUE_MANAGER_KUBECONFIG", "", p_str,
        "on a MultiKueue worker: the manager's kubeconfig; copies take their classes from it",
    )
    metrics_port: int = setting("METRICS_PORT", 8080, p_port, "Prometheus port (0 = off)")
    metrics_cert_file: str = setting(
        "METRICS_CERT_FILE", "", p_str,
        "PEM certificate: /metrics over HTTPS with TokenReview + SubjectAccessReview",
    )
    metrics_key_file: str = setting("METRICS_KEY_FILE", "", p_str, "its private key (PEM)")
    health_port: int = setting(
        "HEALTH_PORT", 8081, p_port, "plain-HTTP health port when /metrics is on HTTPS"
    )
    leader_election: bool = setting("LEADER_ELECTION", True, p_bool, "use a Lease")
    lease_name: str = setting("LEASE_NAME", "wdrf-controller", p_str, "Lease name")
    controller_namespace: str = setting(
        "CONTROLLER_NAMESPACE", "kueue-system", p_str, "namespace of Lease/ConfigMap"
    )
    kueue_namespace: str = setting("KUEUE_NAMESPACE", "kueue-system", p_str, "Kueue namespace")
    lease_duration: float = setting(
        "LEASE_DURATION", 15.0, duration_at_least(3, "a Lease must outlive a few renewals"),
        "Lease validity",
    )
    renew_deadline: float = setting(
        "RENEW_DEADLINE", 10.0, duration_at_least(2, "a renewal needs time to reach the API"),
        "leader stops writing",
    )
    retry_period: float = setting(
        "RETRY_PERIOD", 2.0, duration_at_least(1, "each try is a request to the API server"),
        "Lease acquire/renew period",
    )
    event_rate_limit: float = setting(
        "EVENT_RATE_LIMIT", 3600.0, p_duration, "one Event of a reason per object per this"
    )
    event_qps: float = setting(
        "EVENT_QPS", 10.0, p_nonneg_float, "Events per second at most, all objects (0 = no limit)"
    )
    api_retries: int = setting("API_RETRIES", 5, p_pos_int, "attempts per write and cycle")
    history_config_map: str = setting(
        "HISTORY_CONFIG_MAP", "wdrf-usage-history", p_str, "ConfigMap for decayed usage"
    )
    write_budget: int = setting(
        "WRITE_BUDGET", 1000, p_pos_int, "priority patches per cycle at most (head first)"
    )
    client_qps: float = setting("CLIENT_QPS", 50.0, p_pos_float, "apiserver requests/s")
    client_burst: int = setting("CLIENT_BURST", 100, p_pos_int, "request burst above CLIENT_QPS")
    cache_max_staleness: float = setting(
        "CACHE_MAX_STALENESS", 120.0, p_duration,
        "not ready and no writes while the Workload/ClusterQueue cache is older than this",
    )
    once_timeout: float = setting(
        "ONCE_TIMEOUT", 60.0, duration_at_least(1, "a cycle needs at least one LIST"),
        "--once gives up after this",
    )



@dataclass(frozen=True)
class Settings(LiveSettings, PolicySettings, LoggingSettings):
    """Every config key, in groups (as kopf's OperatorSettings): a function takes the group it
    reads (`compute_plan` a PolicySettings, `decide_hami` a HamiSettings, the log set-up a
    LoggingSettings), and a Settings is each of them. The config file keys and environment
    variables are the fields' `key`s, one per field, whatever the group."""

    @property
    def policy(self) -> PolicySettings:
        return self

    @property
    def hami(self) -> HamiSettings:
        return self

    @property
    def live(self) -> LiveSettings:
        return self

    @property
    def logging(self) -> LoggingSettings:
        return self


SETTING_FIELDS = {f.metadata["key"]: f for f in fields(Settings) if "key" in f.metadata}
# Keys older releases had: accepted with a warning (an upgrade must not fail on them).
DEPRECATED_KEYS = {
    "AGING_STEP": "ignored since priority model v2: priorities no longer move with the clock",
}
KEYS = tuple(SETTING_FIELDS)
_DEFAULTS = Settings()


def _cross_check(s: Settings) -> list[tuple[str, str, str]]:
    issues: list[tuple[str, str, str]] = []
    w = s.priority_weights
    u, a, n = w["urgent"], w["approved"], w["normal"]
    if not u > a > n:
        issues.append(
            ("PRIORITY_WEIGHTS", str(dict(w)), "must satisfy urgent > approved > normal")
        )
    else:
        gap = min(u - a, a - n) * s.priority_class_unit
        if gap <= s.fairness_points + 2 * s.base_priority_cap:
            issues.append((
                "FAIRNESS_POINTS", str(s.fairness_points),
                f"FAIRNESS_POINTS + 2 x BASE_PRIORITY_CAP must be < smallest class gap x "
                f"PRIORITY_CLASS_UNIT = {gap}, or shares could reorder classes",
            ))
        if s.approved_preempts_normal and not s.team_scoped_approval() and not (
            s.class_term(PriorityClass.APPROVED) > s.guard(PriorityClass.NORMAL)
        ):
            issues.append((
                "APPROVED_PREEMPTS_NORMAL", "true",
                f"needs the approved band ({s.class_term(PriorityClass.APPROVED)}) above the "
                f"normal guard ({s.guard(PriorityClass.NORMAL)}): raise PRIORITY_CLASS_UNIT or "
                "lower MAX_AGING_TIME, PRIORITY_REBASE_PERIOD or FAIRNESS_POINTS",
            ))
    if s.max_score() > MAX_BOOST:
        issues.append(
            (
                "AGING_COEFFICIENT",
                str(s.aging_coefficient),
                f"largest priority {s.max_score()} exceeds {MAX_BOOST} (int32 headroom); "
                "lower PRIORITY_WEIGHTS, PRIORITY_CLASS_UNIT, AGING_COEFFICIENT, MAX_AGING_TIME "
                "or PRIORITY_REBASE_PERIOD",
            )
        )
    if s.fairness_levels > max(1, s.fairness_points):
        issues.append(
            ("FAIRNESS_LEVELS", str(s.fairness_levels), "must be <= FAIRNESS_POINTS")
        )
    if not 0 < s.retry_period < s.renew_deadline < s.lease_duration:
        issues.append(("RENEW_DEADLINE", str(s.renew_deadline),
                       "need 0 < RETRY_PERIOD < RENEW_DEADLINE < LEASE_DURATION"))
    if bool(s.metrics_cert_file) != bool(s.metrics_key_file):
        issues.append(("METRICS_KEY_FILE", s.metrics_key_file,
                       "METRICS_CERT_FILE and METRICS_KEY_FILE go together (both or neither)"))
    if s.metrics_cert_file and s.metrics_port and s.health_port == s.metrics_port:
        issues.append(("HEALTH_PORT", str(s.health_port),
                       "must differ from METRICS_PORT when /metrics is served over HTTPS"))
    if s.team_source is TeamSource.LABEL and not s.team_label_key:
        issues.append(("TEAM_LABEL_KEY", "", "required when TEAM_SOURCE=label"))
    return issues


def load_settings(
    config_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    *,
    config_required: bool = False,
) -> Settings:
    """config.yaml (or `config_path`), then env vars named like the keys, then `overrides`
    (CLI flags, keyed by config key). Raises ConfigError listing every problem."""
    issues: list[tuple[str, str, str]] = []
    raw: dict[str, tuple[object, str]] = {}  # key -> (value, where)

    path = Path(config_path) if config_path else Path("config.yaml")
    if path.exists():
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError([(str(path), "", f"cannot read config file: {exc}")]) from None
        if doc is None:
            doc = {}
        if not isinstance(doc, Mapping):
            raise ConfigError([(str(path), "", "config file must be a mapping of KEY: value")])
        for k, v in doc.items():
            if k in DEPRECATED_KEYS:
                _warn_deprecated(str(k), str(path))
            elif k not in SETTING_FIELDS:
                issues.append((str(k), _show(v), f"unknown key in {path}{_did_you_mean(k)}"))
            else:
                raw[k] = (v, str(path))
    elif config_path is not None or config_required:
        raise ConfigError([(str(path), "", "config file not found")])

    env = os.environ if env is None else env
    for key in DEPRECATED_KEYS:
        if key in env:
            _warn_deprecated(key, "environment")
    for key in KEYS:
        if key in env:
            raw[key] = (env[key], "environment")
    for key, value in (overrides or {}).items():
        if key in DEPRECATED_KEYS:
            _warn_deprecated(key, "command line")
        elif key not in SETTING_FIELDS:
            issues.append((key, _show(value), f"unknown key (command line){_did_you_mean(key)}"))
        elif value is not None:
            raw[key] = (value, "command line")

    values: dict[str, Any] = {}
    for key, (value, where) in raw.items():
        f = SETTING_FIELDS[key]
        try:
            values[f.name] = f.metadata["parse"](value)
        except ValueError as exc:
            issues.append((key, _show(value), f"{exc} (from {where})"))
    settings = Settings(**values)
    issues += [_blame(issue, settings) for issue in _cross_check(settings)]
    if issues:
        raise ConfigError(issues)
    return settings


def _did_you_mean(key: object) -> str:
    close = difflib.get_close_matches(str(key).upper().replace("-", "_"), KEYS, n=1, cutoff=0.7)
    return f"; did you mean {close[0]}?" if close else ""


_KEY_WORD = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")


def _blame(issue: tuple[str, str, str], settings: Settings) -> tuple[str, str, str]:
    """A check between keys names one of them; when that one has its default and another key
    the message mentions does not, the changed key is the one to blame."""
    key, value, why = issue
    if key not in SETTING_FIELDS or _changed(key, settings):
        return issue
    for other in _KEY_WORD.findall(why):
        if other != key and other in SETTING_FIELDS and _changed(other, settings):
            current = getattr(settings, SETTING_FIELDS[other].name)
            shown = f"{current:g}" if isinstance(current, float) else _show(current)
            return other, shown, f"{key}={value} {why}" if value else why
    return issue


def _changed(key: str, settings: Settings) -> bool:
    name = SETTING_FIELDS[key].name
    return bool(getattr(settings, name) != getattr(_DEFAULTS, name))


def _warn_deprecated(key: str, where: str) -> None:
    logging.getLogger(__name__).warning("%s (from %s): %s; remove it", key, where,
                                        DEPRECATED_KEYS[key])


def _show(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def with_overrides(settings: Settings, **changes: Any) -> Settings:
    """A copy with some fields changed (tests, simulator); validated like a load."""
    s = replace(settings, **changes)
    issues = _cross_check(s)
    if issues:
        raise ConfigError(issues)
    return s


def describe(settings: Settings) -> Iterable[tuple[str, object, str]]:
    """(key, value, help) for every key, e.g. for `--show-config` or docs."""
    for key, f in SETTING_FIELDS.items():
        yield key, getattr(settings, f.name), f.metadata["doc"]
