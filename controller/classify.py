"""The classify stage: what a Workload's own annotations (and its owner's) say about it.

Class (`wdrf.x-k8s.io/urgent|approved`), admin override, base priority and the boost Kueue sees
now. Pure functions over domain objects; bad values are `InputProblem`s, never exceptions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

from controller.config import MAX_OVERRIDE
from controller.domain import (
    APPROVED_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    CLASS_PRIORITY_CLASSES,
    INT32_MAX,
    INT32_MIN,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
    InputProblem,
    JobInfo,
    OwnerInfo,
    PriorityClass,
    Workload,
    fast_init,
)
from controller.workload import implied_base as implied_base  # policy imports it from here

if TYPE_CHECKING:
    from controller.config import PolicySettings

_UNSIGNED = re.compile(r"^[0-9]{1,10}$")
_SIGNED = re.compile(r"^-?[0-9]{1,10}$")
_CLASS_KEYS = (URGENT_ANNOTATION, APPROVED_ANNOTATION)
_OF_PRIORITY_CLASS = attrgetter("workload_priority_class")
# The annotations `classify` reads (on a Workload and its owner).
POLICY_KEYS = frozenset({
    URGENT_ANNOTATION, APPROVED_ANNOTATION, PRIORITY_OVERRIDE_ANNOTATION,
    BASE_PRIORITY_ANNOTATION, KUEUE_PRIORITY_BOOST_ANNOTATION,
})

def clamp_int32(value: int) -> int:
    return max(INT32_MIN, min(INT32_MAX, value))


# --------------------------------------------------------------------------------------------
# Annotations


Owner = JobInfo | OwnerInfo  # what users annotate: a batch/v1 Job or another integrated kind


def read_class(
    workload: Workload, job: Owner | None
) -> tuple[PriorityClass, list[InputProblem]]:
    """Class from `wdrf.x-k8s.io/urgent|approved` on the Workload and its owner Job: exactly
    "true" sets it, exactly "false" is the explicit default, anything else is a problem.
    The highest class any source sets wins."""
    problems: list[InputProblem] = []
    urgent = approved = False
    sources: list[Workload | Owner] = [workload] if job is None else [workload, job]
    for src in sources:
        ann = src.annotations
        for key in _CLASS_KEYS:
            val = ann.get(key)
            if val is None or val == "false":
                continue
            if val == "true":
                if key == URGENT_ANNOTATION:
                    urgent = True
                else:
                    approved = True
                continue
            problems.append(InputProblem(
                src.ref, f"metadata.annotations[{key}]", val,
                'expected exactly "true" (or "false"); the value is case- and space-sensitive',
            ))
    if urgent:
        return PriorityClass.URGENT, problems
    if approved:
        return PriorityClass.APPROVED, problems
    return PriorityClass.NORMAL, problems


def read_override(
    workload: Workload, job: Owner | None
) -> tuple[int | None, list[InputProblem]]:
    """`wdrf.x-k8s.io/priority-override`: a plain decimal integer 0..MAX_OVERRIDE (no sign,
    exponent or spaces), from the Workload, else the owner Job."""
    sources: list[Workload | Owner] = [workload] if job is None else [workload, job]
    for src in sources:
        val = src.annotations.get(PRIORITY_OVERRIDE_ANNOTATION)
        if val is None:
            continue
        if _UNSIGNED.match(val) and int(val) <= MAX_OVERRIDE:
            return int(val), []
        return None, [InputProblem(
            src.ref, f"metadata.annotations[{PRIORITY_OVERRIDE_ANNOTATION}]", val,
            f"expected a plain integer 0..{MAX_OVERRIDE} (no sign, exponent or spaces)",
        )]
    return None, []


def read_base(workload: Workload) -> tuple[int, list[InputProblem]]:
    """Base priority, see `implied_base`. An invalid base annotation is a problem: without the
    true base, writing spec priority would compound boosts."""
    base = implied_base(workload.priority, workload.annotations)
    if base is None:
        return (workload.priority or 0), [InputProblem(
            workload.ref, f"metadata.annotations[{BASE_PRIORITY_ANNOTATION}]",
            workload.annotations[BASE_PRIORITY_ANNOTATION],
            "expected a signed int32 integer",
        )]
    return base, []


def ranked_base(workload: Workload, base: int) -> int:
    """The base the formula counts: 0 for a Workload whose WorkloadPriorityClass is a class
    stand-in (`CLASS_PRIORITY_CLASSES`: its value says the class, which the annotations
    already give), else its base. The base itself stays what spec.priority holds without
    this controller: boost and spec writes are computed from it."""
    if workload.workload_priority_class and workload.priority_class_name in CLASS_PRIORITY_CLASSES:
        return 0
    return base


def stand_in(workload: Workload) -> tuple[str, int | None] | None:
    """The class stand-in a Workload's WorkloadPriorityClass is (`CLASS_PRIORITY_CLASSES`),
    with the base Kueue gave it (`implied_base`: spec.priority without this controller; None
    when unreadable); None for any other class."""
    name = workload.priority_class_name
    if not workload.workload_priority_class or name not in CLASS_PRIORITY_CLASSES:
        return None
    return name, implied_base(workload.priority, workload.annotations)


def stand_in_values(settings: PolicySettings) -> dict[str, int]:
    """Each class stand-in's name -> the value these settings need
    (`PolicySettings.stand_in_value`)."""
    return {f"wdrf-{c.value}": settings.stand_in_value(c) for c in PriorityClass}


StandIns = dict[int, tuple[Workload, "tuple[str, int | None] | None"]]


def stand_in_warnings(workloads: Iterable[Workload], settings: PolicySettings,
                      known: StandIns | None = None) -> list[str]:
    """One warning per class stand-in whose value, as Kueue gave it to a Workload (its base:
    spec.priority without this controller), is not what these settings need
    (`PolicySettings.stand_in_value`): the classes would not hold, or approved work would
    preempt normal work, while the controller is down. The first such Workload is named.
    `known`: each Workload's `stand_in` by id, kept from one call to the next (replaced by
    this call's)."""
    want = stand_in_values(settings)
    seen: dict[str, tuple[int, str]] = {}
    kept: StandIns = {}
    for w in filter(_OF_PRIORITY_CLASS, workloads):  # (filtered in C: every Workload)
        if known is None:
            found = stand_in(w)
        else:
            hit = known.get(id(w))
            if hit is None or hit[0] is not w:
                hit = (w, stand_in(w))
            kept[id(w)] = hit
            found = hit[1]
        if found is None or found[0] in seen:
            continue
        name, base = found
        if base is not None and base != want[name]:
            seen[name] = (base, w.key)
    if known is not None:
        known.clear()
        known.update(kept)
    return stand_in_report(seen, settings)


def stand_in_report(first: Mapping[str, tuple[int, str]], settings: PolicySettings) -> list[str]:
    """`stand_in_warnings` from, per stand-in name, the value and key of the first Workload
    whose value is not the one these settings need."""
    want = stand_in_values(settings)
    return [f"WorkloadPriorityClass {name} has value {value} (Workload {key}); with these "
            f"settings the class stand-in must be {want[name]} "
            "(manifests/admission/class-priority.yaml), or the class order does not hold "
            "while the controller is down" for name, (value, key) in sorted(first.items())]


def read_current_boost(workload: Workload) -> tuple[int | None, list[InputProblem]]:
    val = workload.annotations.get(KUEUE_PRIORITY_BOOST_ANNOTATION)
    if val is None:
        return None, []
    if _SIGNED.match(val) and INT32_MIN <= int(val) <= INT32_MAX:
        return int(val), []
    return None, [InputProblem(
        workload.ref, f"metadata.annotations[{KUEUE_PRIORITY_BOOST_ANNOTATION}]", val,
        "expected a signed int32 integer (Kueue's webhook should have rejected this)",
    )]




@fast_init
@dataclass(frozen=True, slots=True)
class Classified:
    """What one Workload's annotations say, and what was wrong with them."""

    priority_class: PriorityClass
    override: int | None
    base: int  # spec.priority without this controller: what boost and spec writes start from
    ranked: int  # the base the formula counts (`ranked_base`)
    current_boost: int | None
    problems: tuple[InputProblem, ...]
    blocking: bool  # a problem in what the policy reads: leave the Workload unchanged



def reads_no_annotation(workload: Workload, job: Owner | None) -> bool:
    """Whether neither the Workload nor its owner has an annotation `classify` reads: then its
    result depends only on the Workload's priority fields (the defaults)."""
    ann = workload.annotations
    return (not ann or ann.keys().isdisjoint(POLICY_KEYS)) and (
        job is None or not job.annotations or job.annotations.keys().isdisjoint(POLICY_KEYS))


def classify(workload: Workload, job: Owner | None) -> Classified:
    if reads_no_annotation(workload, job):  # hot path: nothing to read, all defaults
        base = workload.priority or 0
        return Classified(PriorityClass.NORMAL, None, base, ranked_base(workload, base), None,
                          (), False)
    cls, p1 = read_class(workload, job)
    override, p2 = read_override(workload, job)
    base, p3 = read_base(workload)
    boost, p4 = read_current_boost(workload)
    blocking = bool(p1 or p2 or p3)
    return Classified(cls, override, base, ranked_base(workload, base), boost,
                      (*p1, *p2, *p3, *p4), blocking)
