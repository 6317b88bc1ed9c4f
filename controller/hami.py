"""HAMi decisions for a pending workload: node / GPU scheduling policy and GPU fraction.

Sources, first valid one wins per policy:
  1. the workload's own `hami.io/{node,gpu}-scheduler-policy` annotations (Workload, owner Job,
     or pod template) - kept as they are when valid;
  2. `wdrf.x-k8s.io/scheduling-policy` (Workload, then owner Job);
  3. HAMI_RULES (by class, LocalQueue, ClusterQueue, fractional), then HAMI_DEFAULT_*.
HAMi silently falls back on unknown values (docs/policy.md, "HAMi decisions"), so every value
is validated here and a bad one is an InputProblem: the workload is left unchanged, nothing
invalid is ever written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, NamedTuple

from controller.accounting import gpu_summary
from controller.domain import (
    GPU,
    GPU_FRACTION_ANNOTATION,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    HAMI_GPU_POLICY_ANNOTATION,
    HAMI_NODE_POLICY_ANNOTATION,
    SCHEDULING_POLICY_ANNOTATION,
    ClusterQueue,
    Container,
    InputProblem,
    JobInfo,
    ObjectRef,
    PodSet,
    PriorityClass,
    QuotaCheck,
    Workload,
)
from controller.hami_values import NODE_POLICIES, valid_gpu_policy
from controller.plan import HamiDecision

if TYPE_CHECKING:
    from controller.config import HamiSettings

_FRACTION = re.compile(r"^(?:0(?:\.[0-9]+)?|1(?:\.0*)?|\.[0-9]+)$")


class _Source(NamedTuple):
    """One place annotations can come from; the ref is built only for messages (hot path)."""

    owner: Workload | JobInfo
    field_prefix: str
    annotations: Mapping[str, str]

    @property
    def ref(self) -> ObjectRef:
        return self.owner.ref


_META = "metadata.annotations"


def _sources(workload: Workload, job: JobInfo | None) -> list[_Source]:
    out = [_Source(workload, _META, workload.annotations)]
    if job is not None:
        out.append(_Source(job, _META, job.annotations))
        out.append(_Source(job, "spec.template.metadata.annotations", job.template_annotations))
    for ps in workload.pod_sets:
        if ps.annotations:
            out.append(_Source(
                workload, f"spec.podSets[{ps.name}].template.metadata.annotations",
                ps.annotations,
            ))
    return out


def parse_fraction(value: str) -> int | None:
    """"0.5" -> 50 (percent). None when not a decimal in (0, 1] with whole-percent precision."""
    if not _FRACTION.match(value):
        return None
    try:
        pct = Decimal(value) * 100
    except InvalidOperation:  # pragma: no cover - regex guarantees a decimal
        return None
    if pct <= 0 or pct > 100 or pct != pct.to_integral_value():
        return None
    return int(pct)


def parse_scheduling_policy(value: str, hami_version: str) -> tuple[str | None, str | None] | None:
    """`wdrf.x-k8s.io/scheduling-policy`: "binpack" / "spread" (node and GPU), a GPU-only
    policy ("topology-aware", "binpack,numa"), or "node=<p>;gpu=<p>" (either part optional).
    None when invalid."""
    if not value or value != value.strip():
        return None
    if "=" not in value:
        node = value if value in NODE_POLICIES else None
        gpu = value if valid_gpu_policy(value, hami_version) else None
        return (node, gpu) if (node or gpu) else None
    node_p: str | None = None
    gpu_p: str | None = None
    for part in value.split(";"):
        key, sep, val = part.partition("=")
        if not sep or not val:
            return None
        if key == "node" and node_p is None and val in NODE_POLICIES:
            node_p = val
        elif key == "gpu" and gpu_p is None and valid_gpu_policy(val, hami_version):
            gpu_p = val
        else:
            return None
    return node_p, gpu_p


def decide_hami(
    workload: Workload,
    job: JobInfo | None,
    priority_class: PriorityClass,
    cluster_queue: str | None,
    settings: HamiSettings,
    card_memory_mib: float | None,
    cache: dict[tuple[object, ...], HamiDecision | None] | None = None,
) -> tuple[HamiDecision | None, list[InputProblem]]:
    """The HAMi decision for one pending workload, or None when it asks for no GPU.

    `cache` (one dict per plan, for one settings) shares decisions between workloads that
    mention no HAMi annotation anywhere: theirs depend only on the rules that match their
    class, queues and fractional-ness."""
    problems: list[InputProblem] = []
    wants_gpu, fractional = gpu_summary(workload.pod_sets, card_memory_mib)
    node: str | None = None
    gpu: str | None = None
    reasons: list[str] = []
    cores: int | None = None
    mem: int | None = None
    if mentions_hami(workload, job):
        node, gpu, cores, problems = _from_annotations(
            _sources(workload, job), wants_gpu, settings.hami_version, reasons
        )
        mem = cores
    elif not wants_gpu:
        return None, problems
    elif cache is not None:  # hot path
        return decide_by_rules(workload, job, priority_class, cluster_queue, settings,
                               fractional, cache), problems
    if problems or not wants_gpu:
        return None, problems
    decision = _by_rules(workload, job, priority_class, cluster_queue, settings, fractional,
                         node, gpu, cores, mem, reasons)
    return decision, problems


def decide_by_rules(
    workload: Workload,
    job: JobInfo | None,
    priority_class: PriorityClass,
    cluster_queue: str | None,
    settings: HamiSettings,
    fractional: bool,
    cache: dict[tuple[object, ...], HamiDecision | None],
) -> HamiDecision | None:
    """The decision for a Workload that asks for a GPU and mentions no HAMi annotation
    (`mentions_hami` is false): HAMI_RULES and the defaults alone decide, from its class,
    queues and fractional-ness, so Workloads alike share one decision through `cache` (one
    dict per plan, for one settings), and the same changes (none of theirs is annotated)."""
    key = (priority_class, workload.queue_name, cluster_queue, fractional)
    if key in cache:
        return cache[key]
    # Workloads that match the same rules get the same decision.
    cls_name = priority_class.value
    matched = ("rules", *(i for i, rule in enumerate(settings.hami_rules) if rule.matches(
        cls_name, workload.queue_name, cluster_queue, fractional)))
    if matched in cache:
        decision = cache[matched]
    else:
        decision = cache[matched] = _by_rules(
            workload, job, priority_class, cluster_queue, settings, fractional, None, None,
            None, None, [])
    cache[key] = decision
    return decision


def _by_rules(
    workload: Workload,
    job: JobInfo | None,
    priority_class: PriorityClass,
    cluster_queue: str | None,
    settings: HamiSettings,
    fractional: bool,
    node: str | None,
    gpu: str | None,
    cores: int | None,
    mem: int | None,
    reasons: list[str],
) -> HamiDecision | None:
    """Step 3: HAMI_RULES (first match per policy), then the defaults."""
    fractional = fractional or (cores is not None and cores < 100)
    # 3. Rules, then defaults.
    if node is None or gpu is None:
        cls_name = priority_class.value
        for i, rule in enumerate(settings.hami_rules):
            if not rule.matches(cls_name, workload.queue_name, cluster_queue, fractional):
                continue
            if node is None and rule.node_policy:
                node = rule.node_policy
                reasons.append(f"node policy from HAMI_RULES[{i}]")
            if gpu is None and rule.gpu_policy:
                gpu = rule.gpu_policy
                reasons.append(f"gpu policy from HAMI_RULES[{i}]")
    if node is None and settings.hami_default_node_policy:
        node = settings.hami_default_node_policy
        reasons.append("node policy from HAMI_DEFAULT_NODE_POLICY")
    if gpu is None and settings.hami_default_gpu_policy:
        gpu = settings.hami_default_gpu_policy
        reasons.append("gpu policy from HAMI_DEFAULT_GPU_POLICY")

    if node is None and gpu is None and cores is None:
        return None
    decision = HamiDecision(node, gpu, cores, mem, "; ".join(reasons))
    return replace(decision, changes=_changes(workload, job, decision))


def mentions_hami(workload: Workload, job: JobInfo | None) -> bool:
    """Whether any annotation read by steps 1-2 (or the fraction) is present anywhere."""
    keys = HAMI_KEYS
    a = workload.annotations
    if a and not a.keys().isdisjoint(keys):
        return True
    for ps in workload.pod_sets:
        if ps.annotations and not ps.annotations.keys().isdisjoint(keys):
            return True
    if job is None:
        return False
    return bool(
        (job.annotations and not job.annotations.keys().isdisjoint(keys))
        or (job.template_annotations and not job.template_annotations.keys().isdisjoint(keys))
    )


# The annotations `decide_hami` reads (on a Workload, its pod sets, its owner Job and its
# template) besides the pod resources.
HAMI_KEYS = frozenset({
    HAMI_NODE_POLICY_ANNOTATION, HAMI_GPU_POLICY_ANNOTATION, SCHEDULING_POLICY_ANNOTATION,
    GPU_FRACTION_ANNOTATION,
})


def _from_annotations(
    sources: list[_Source], wants_gpu: bool, hami_version: str, reasons: list[str]
) -> tuple[str | None, str | None, int | None, list[InputProblem]]:
    """Sources 1 and 2 and the GPU fraction: (node, gpu, fraction %, problems)."""
    problems: list[InputProblem] = []
    node: str | None = None
    gpu: str | None = None

    # 1. The workload's own HAMi annotations.
    for src in sources:
        for key, is_node in (
            (HAMI_NODE_POLICY_ANNOTATION, True),
            (HAMI_GPU_POLICY_ANNOTATION, False),
        ):
            val = src.annotations.get(key)
            if val is None:
                continue
            ok = val in NODE_POLICIES if is_node else valid_gpu_policy(val, hami_version)
            if not ok:
                allowed = (
                    ", ".join(NODE_POLICIES) if is_node
                    else "binpack, spread, topology-aware"
                    f" (+ mutex, numa, chains from v2.10; configured {hami_version})"
                )
                problems.append(InputProblem(
                    src.ref, f"{src.field_prefix}[{key}]", val,
                    f"not a value HAMi accepts (expected {allowed}); HAMi would silently "
                    "fall back to its default",
                ))
                continue
            if is_node and node is None:
                node = val
                reasons.append(f"node policy from {src.ref} {key}")
            elif not is_node and gpu is None:
                gpu = val
                reasons.append(f"gpu policy from {src.ref} {key}")

    # 2. wdrf.x-k8s.io/scheduling-policy (Workload, then Job).
    for src in sources[:2]:
        val = src.annotations.get(SCHEDULING_POLICY_ANNOTATION)
        if val is None:
            continue
        parsed = parse_scheduling_policy(val, hami_version)
        if parsed is None:
            problems.append(InputProblem(
                src.ref, f"{src.field_prefix}[{SCHEDULING_POLICY_ANNOTATION}]", val,
                "expected binpack, spread, a HAMi GPU policy, "
                "or node=<binpack|spread>;gpu=<policy>",
            ))
            continue
        n, g = parsed
        if n and node is None:
            node = n
            reasons.append(f"node policy from {SCHEDULING_POLICY_ANNOTATION}")
        if g and gpu is None:
            gpu = g
            reasons.append(f"gpu policy from {SCHEDULING_POLICY_ANNOTATION}")
        break

    # GPU fraction (Workload, then Job).
    cores: int | None = None
    for src in sources[:2]:
        val = src.annotations.get(GPU_FRACTION_ANNOTATION)
        if val is None:
            continue
        pct = parse_fraction(val)
        if pct is None:
            problems.append(InputProblem(
                src.ref, f"{src.field_prefix}[{GPU_FRACTION_ANNOTATION}]", val,
                "expected a decimal fraction of one GPU in (0, 1] with at most two decimals, "
                "e.g. 0.25 or 0.5",
            ))
        elif not wants_gpu:
            problems.append(InputProblem(
                src.ref, f"{src.field_prefix}[{GPU_FRACTION_ANNOTATION}]", val,
                f"the workload requests no {GPU}: a GPU fraction has nothing to apply to",
            ))
        else:
            cores = pct
            reasons.append(f"gpucores/gpumem-percentage {pct} from {GPU_FRACTION_ANNOTATION}={val}")
        break
    return node, gpu, cores, problems


def _template_annotations(workload: Workload, job: JobInfo | None) -> Mapping[str, str]:
    """Where HAMi reads policies: the pod template (Job template, else the pod sets')."""
    if job is not None:
        return job.template_annotations
    if len(workload.pod_sets) == 1:
        return workload.pod_sets[0].annotations
    merged: dict[str, str] = {}
    for ps in workload.pod_sets:
        merged.update(ps.annotations)
    return merged


def template_annotation_changes(have: Mapping[str, str],
                                hami: HamiDecision) -> dict[str, str]:
    """The HAMi annotations the decision sets that a pod template (or a pod) lacks or has
    otherwise: annotation -> the value to write."""
    return {k: v for k, v in hami.annotations.items() if have.get(k) != v}


def fraction_values(hami: HamiDecision) -> dict[str, str]:
    """The container resources the decision's GPU fraction sets: resource -> quantity."""
    want: dict[str, str] = {}
    if hami.gpucores is not None:
        want[GPUCORES] = str(hami.gpucores)
    if hami.gpumem_percentage is not None:
        want[GPUMEM_PERCENTAGE] = str(hami.gpumem_percentage)
    return want


def resource_changes(have: Mapping[str, object], want: Mapping[str, str]) -> dict[str, str]:
    """The fraction resources a GPU container's resources (merged, or one of its `limits` and
    `requests`) lack or have otherwise: resource -> the quantity to write."""
    return {k: v for k, v in want.items() if str(have.get(k)) != v}


def _changes(workload: Workload, job: JobInfo | None, hami: HamiDecision) -> tuple[str, ...]:
    """Human-readable differences between the decision and what pods would get now."""
    tmpl = _template_annotations(workload, job)
    out = [f"{key}: {tmpl.get(key) or '(unset)'} -> {want}"
           for key, want in template_annotation_changes(tmpl, hami).items()]
    gpu = _gpu_containers(workload.pod_sets)
    for name, want in fraction_values(hami).items():
        if not gpu or any(resource_changes(c.resources, {name: want}) for c in gpu):
            haves = sorted({str(c.resources.get(name, "unset")) for c in gpu})
            out.append(f"{name}: {','.join(haves) or 'unset'} -> {want}")
    return tuple(out)


def _gpu_containers(pod_sets: Sequence[PodSet]) -> list[Container]:
    return [c for ps in pod_sets for c in ps.containers if GPU in c.resources]


def check_fraction(
    hami: HamiDecision | None, cq: ClusterQueue | None, quota: QuotaCheck | None
) -> HamiDecision | None:
    """The decision with `fraction_blocked` set when writing its GPU fraction would hurt:
    the Workload's ClusterQueue does not cover gpucores / gpumem-percentage and Kueue's
    quotaCheckStrategy is BlockUndeclared (its default), so Kueue would never admit it.
    Unchanged when Kueue's configuration is unknown (`quota` None: an offline snapshot)."""
    if hami is None or quota is None:
        return hami
    wanted = [r for r, v in ((GPUCORES, hami.gpucores),
                             (GPUMEM_PERCENTAGE, hami.gpumem_percentage)) if v is not None]
    have = {q.resource for q in cq.quotas} if cq is not None else set()
    missing = [r for r in wanted if not quota.accepts(r, have)]
    if not missing:
        return hami
    name = cq.name if cq is not None else "-"
    return replace(hami, fraction_blocked=(
        f"ClusterQueue {name} does not cover {', '.join(missing)}; with Kueue's "
        "quotaCheckStrategy BlockUndeclared the Workload could never be admitted. Cover it in "
        "the ClusterQueue, or configure Kueue's resource transformations or IgnoreUndeclared."))
