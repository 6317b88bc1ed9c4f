"""The Kueue Workload on the wire: everything the controller reads from a Workload object as the
API server holds it, and every patch it writes to one.

One owner for the format (as Kueue's own `pkg/workload` is for Kueue): the observed Workload
(`WorkloadInfo`: the object with its parsed value, once per resourceVersion), the condition checks,
the controller owner, the effective priority Kueue orders by, the base-priority rule, the
`wdrf.x-k8s.io/priority-terms` annotation (`Terms`), the priority patch and the undo patch.
`controller.parse` turns a Workload into the domain value `compute_plan` reads; the live diff,
`why`, `reset`, the prompt-cycle check and the evaluation's model use the functions here.
What the annotations mean is in docs/policy.md.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.domain import (
    APPLIED_PRIORITY_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    INT32_MAX,
    INT32_MIN,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    PriorityMode,
    Workload,
    is_batch_job,
)

JSON = dict[str, Any]
Ops = list[JSON]

# Kueue's condition types (status.conditions[].type) the controller reads.
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
FINISHED = "Finished"

# The annotations only the controller writes on a Workload (reset removes exactly these).
CONTROLLER_ANNOTATIONS = (
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    APPLIED_PRIORITY_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
)


# -- reading a raw object ---------------------------------------------------------------------


def meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """`metadata`, or {} when missing or malformed."""
    m = obj.get("metadata") if obj else None
    return m if isinstance(m, Mapping) else {}


def annotations_of(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    ann = meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    """The `status.conditions` entry of that type, if any."""
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions or []:
        if isinstance(c, Mapping) and c.get("type") == ctype:
            return c
    return None


def condition_true(obj: Mapping[str, Any], ctype: str) -> bool:
    c = condition(obj, ctype)
    return c is not None and c.get("status") == "True"


def is_quota_reserved(obj: Mapping[str, Any]) -> bool:
    return condition_true(obj, QUOTA_RESERVED)


def is_admitted(obj: Mapping[str, Any]) -> bool:
    return condition_true(obj, ADMITTED)


def is_finished(obj: Mapping[str, Any]) -> bool:
    return condition_true(obj, FINISHED)


def is_pending(obj: Mapping[str, Any]) -> bool:
    """Kueue's meaning: no QuotaReserved=True and no Finished=True (there is no Pending type);
    the same rule as `domain.Workload.pending`."""
    return not is_quota_reserved(obj) and not is_finished(obj)


def is_active(obj: Mapping[str, Any]) -> bool:
    """`spec.active` (default true): false when a user or Kueue deactivated the Workload."""
    spec = obj.get("spec")
    return not isinstance(spec, Mapping) or spec.get("active", True) is not False


def controller_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with `controller: true` (a Job, a JobSet...; none for pod groups)."""
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def owner_uids(obj: Mapping[str, Any]) -> list[str]:
    """The UIDs of every owner reference (a pod group's Workload is owned by its pods)."""
    return [str(ref.get("uid")) for ref in meta(obj).get("ownerReferences") or []
            if isinstance(ref, Mapping)]


def job_key(namespace: str, name: str) -> str:
    """How the Job informer keys a Job: "namespace/name"."""
    return f"{namespace}/{name}"


def owner_job_key(obj: Mapping[str, Any]) -> str | None:
    """The informer key of the batch/v1 Job that controls this Workload, if one does."""
    ref = controller_owner(obj)
    if ref is None or not is_batch_job(ref.get("apiVersion"), ref.get("kind")):
        return None
    return job_key(str(meta(obj).get("namespace") or ""), str(ref.get("name")))


def owner_job_key_of(workload: Workload) -> str | None:
    """`owner_job_key` for a parsed Workload."""
    if workload.owner is not None and workload.owner.is_batch_job:
        return job_key(workload.namespace, workload.owner.name)
    return None


def owner_key(namespace: str, kind: str, name: str) -> str:
    """How an owner of another integrated kind (JobSet, RayJob...) is looked up."""
    return f"{namespace}/{kind}/{name}"


def effective_priority(obj: Mapping[str, Any]) -> int:
    """spec.priority + kueue.x-k8s.io/priority-boost: what Kueue orders by (lenient: what
    cannot be read counts as 0)."""
    spec = obj.get("spec")
    try:
        prio = int((spec.get("priority") if isinstance(spec, Mapping) else None) or 0)
    except (TypeError, ValueError):
        prio = 0
    return prio + (parse_int32(annotations_of(obj).get(KUEUE_PRIORITY_BOOST_ANNOTATION)) or 0)


def spec_priority(obj: Mapping[str, Any]) -> int | None:
    """spec.priority as an integer, None when absent or not an integer."""
    spec = obj.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# -- one observed Workload ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """One Workload as a cycle observed it: the object the API server returned (what every
    patch is computed and compare-and-swapped against) with the domain value the plan read
    from it and its owners, built once per resourceVersion by the snapshot builder."""

    obj: Mapping[str, Any]
    workload: Workload
    owner_job_key: str | None  # the informer key of its controlling batch/v1 Job, if any
    owner_job_uid: str  # that Job's UID as the reference names it ("" without one)
    owner_uids: tuple[str, ...]  # every owner reference's UID (a pod group's pods)

    @classmethod
    def of(cls, obj: Mapping[str, Any], workload: Workload) -> WorkloadInfo:
        job = owner_job_key_of(workload)
        uid = str((controller_owner(obj) or {}).get("uid") or "") if job is not None else ""
        return cls(obj, workload, job, uid, tuple(owner_uids(obj)))

    @property
    def key(self) -> str:
        return self.workload.key


# -- the base priority ------------------------------------------------------------------------

_SIGNED = re.compile(r"^-?[0-9]{1,10}$")


def parse_int32(text: str | None) -> int | None:
    """A plain signed decimal int32 ("-5", "100"; no spaces, sign "+" or exponent), else None."""
    if text is not None and _SIGNED.match(text) and INT32_MIN <= int(text) <= INT32_MAX:
        return int(text)
    return None


def implied_base(priority: int | None, annotations: Mapping[str, str]) -> int | None:
    """The base priority a Workload's spec.priority and annotations imply; None when
    `wdrf.x-k8s.io/base-priority` is present but invalid.

    Without a (valid) base annotation: spec.priority, else 0. With one, and a valid
    `wdrf.x-k8s.io/applied-priority` (the spec.priority this controller last wrote):
    spec.priority == applied -> ours, the base annotation; == base -> Kueue reset it to the
    class value, the base annotation; anything else -> someone set a new base (a changed
    WorkloadPriorityClass, an admin), spec.priority. Without a valid applied annotation the
    base annotation wins, as it did before that annotation existed."""
    val = annotations.get(BASE_PRIORITY_ANNOTATION)
    if val is None:
        return priority or 0
    base = parse_int32(val)
    if base is None:
        return None
    applied = parse_int32(annotations.get(APPLIED_PRIORITY_ANNOTATION))
    if applied is None or priority is None or priority in (applied, base):
        return base
    return priority


# -- the priority-terms annotation ------------------------------------------------------------

TERMS_VERSION = "v2"
VERSION_KEY = "version"
_WORD_SEPARATORS = re.compile(r"[;\s]+")


class Terms(Mapping[str, str]):
    """`wdrf.x-k8s.io/priority-terms`: why a Workload has the priority the controller wrote,
    as `v2 class=normal team=a pool=cq/gpu level=12/50 ...` (docs/policy.md, "Priority
    terms"). An ordered mapping of `key=value` words with the version under "version".

    `parse` is tolerant, so every reader (the policy's hysteresis, the write order, `why`)
    reads what any version wrote: words may be separated by spaces or `;`, a first word without
    `=` is the version, unknown keys are kept in their order, malformed words are dropped.
    Values never contain spaces or `;`."""

    # Compact, because the parse memo holds one per distinct annotation (50,000 at Kueue's
    # large scale): the key order and positions are shared by every Terms of the same keys,
    # and words are interned (a few hundred distinct values repeat across all Workloads).
    __slots__ = ("_index", "_values")

    def __init__(self, words: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        pairs = dict(words)
        self._index: Mapping[str, int] = _index_of(tuple(pairs))
        self._values: tuple[str, ...] = tuple(
            sys.intern(v) if type(v) is str else v for v in pairs.values())

    @classmethod
    def parse(cls, text: str | None) -> Terms:
        if not text:
            return cls()
        if cls is Terms:  # immutable, so one parse per distinct text (every plan reads them all)
            return _parse_terms_cached(text)
        return cls(_words_of(text))

    @classmethod
    def of(cls, **words: str) -> Terms:
        """Terms of the current version; keyword order is the written order (`class_` for the
        `class` key)."""
        return cls({VERSION_KEY: TERMS_VERSION, **{k.rstrip("_"): v for k, v in words.items()}})

    def format(self) -> str:
        """The annotation value: the version word, then `key=value` in order."""
        words = [self[VERSION_KEY]] if VERSION_KEY in self._index else []
        words += [f"{k}={v}" for k, v in self.items() if k != VERSION_KEY]
        return " ".join(words)

    @property
    def version(self) -> str:
        return self.get(VERSION_KEY, "")

    @property
    def current(self) -> bool:
        """Written in the version this controller writes (older terms are not compared)."""
        return self.version == TERMS_VERSION

    def __getitem__(self, key: str) -> str:
        return self._values[self._index[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Terms({self.format()!r})"


def _words_of(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, word in enumerate(w for w in _WORD_SEPARATORS.split(text.strip()) if w):
        key, sep, value = word.partition("=")
        if sep and key:
            out[key.strip()] = value.strip()
        elif i == 0 and not sep:
            out[VERSION_KEY] = word
    return out


_INDEXES: dict[tuple[str, ...], Mapping[str, int]] = {}
_MAX_SHAPES = 1024  # key orders are few (one per kind of terms and version); a flood of
# annotations with made-up keys gets an index of its own each, not a place in the table


def _index_of(keys: tuple[str, ...]) -> Mapping[str, int]:
    """Each key's position, one shared mapping per key order."""
    index = _INDEXES.get(keys)
    if index is None:
        index = {sys.intern(k) if type(k) is str else k: i for i, k in enumerate(keys)}
        if len(_INDEXES) < _MAX_SHAPES:
            _INDEXES[keys] = index
    return index


@functools.lru_cache(maxsize=1 << 16)
def _parse_terms_cached(text: str) -> Terms:
    return Terms(_words_of(text))


def terms_of(obj: Mapping[str, Any]) -> Terms:
    """The terms on a raw Workload ({} when it has none)."""
    return Terms.parse(annotations_of(obj).get(PRIORITY_TERMS_ANNOTATION))


# -- patches ----------------------------------------------------------------------------------


def pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901) from raw path segments. Interned: a cycle's patches name the
    same few paths tens of thousands of times (every deferred change is held until written)."""
    return sys.intern("".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts))


def uid_test(obj: Mapping[str, Any]) -> Ops:
    """`test /metadata/uid`: the patch applies only to the very object it was computed for."""
    uid = meta(obj).get("uid")
    return [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []


_MISSING = object()


def _tokens(path: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def read_at(obj: Any, path: str) -> tuple[str, Any]:
    """The value at a JSON pointer as read, or where the path stops existing: (the pointer
    of the first missing key, None). A JSON-patch `test` with value null passes for a missing
    key whose parent exists (kube-apiserver's JSON patch), so the pair is always testable."""
    node = obj
    for i, token in enumerate(_tokens(path)):
        if isinstance(node, Mapping):
            child = node.get(token, _MISSING)
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            child = node[int(token)]
        else:
            child = _MISSING
        if child is _MISSING:
            return pointer(*_tokens(path)[: i + 1]), None
        node = child
    return path, node


def compare_and_swap(obj: Mapping[str, Any], ops: Ops) -> Ops:
    """`ops` made a compare-and-swap against the object as read: the UID test, the tests in
    `ops`, a `test` of the current value (or absence) of every path an op adds, replaces or
    removes, then the changes. A write computed from a stale read fails as a whole (422)
    instead of overwriting what another writer (a newer leader, Kueue, an admin) put there
    since."""
    tested = {op["path"] for op in ops if op.get("op") == "test"}
    tests: Ops = []
    for op in ops:
        if op.get("op") not in ("add", "replace", "remove"):
            continue
        path, value = read_at(obj, str(op["path"]))
        if path not in tested:
            tested.add(path)
            tests.append({"op": "test", "path": path, "value": value})
    given = [op for op in ops if op.get("op") == "test" and op.get("path") != "/metadata/uid"]
    changes = [op for op in ops if op.get("op") != "test"]
    return uid_test(obj) + given + tests + changes


def annotation_ops(obj: Mapping[str, Any], set_: Mapping[str, str],
                   remove: Sequence[str]) -> Ops:
    """JSON patch ops setting and removing annotations (only those that differ)."""
    ann = annotations_of(obj)
    ops: Ops = []
    adds = {k: v for k, v in set_.items() if ann.get(k) != v}
    if adds and not isinstance(meta(obj).get("annotations"), Mapping):
        ops.append({"op": "add", "path": pointer("metadata", "annotations"), "value": {}})
    for k, v in adds.items():
        ops.append({"op": "add", "path": pointer("metadata", "annotations", k), "value": v})
    for k in remove:
        if k in ann:
            ops.append({"op": "remove", "path": pointer("metadata", "annotations", k)})
    return ops


@dataclass(frozen=True, slots=True)
class PriorityTarget:
    """What the plan wants a Workload's priority to be (from a `WorkloadDecision`)."""

    base: int  # the priority before this controller touched it
    priority: int  # the effective priority Kueue should see
    boost: int  # boost mode: the priority-boost annotation value
    terms: str = ""  # the priority-terms annotation to write with it ("" = none)
    # Planned for a Workload that held no quota: written only while it still holds none.
    pending: bool = False


_ANNOTATIONS = pointer("metadata", "annotations")


@dataclass(frozen=True, slots=True)
class PriorityPatch:
    ops: Ops
    summary: str  # human text for the log and the success Event
    old_terms: str | None  # the terms annotation before this write

    def annotations_after(self, before: Mapping[str, str]) -> dict[str, str]:
        """The annotations once the patch applied to an object that had `before` (read from
        the ops themselves: the evaluation's model writes exactly what the API server would)."""
        out = dict(before)
        for op in self.ops:
            path = str(op["path"])
            if op["op"] == "test" or not path.startswith(_ANNOTATIONS + "/"):
                continue
            key = _tokens(path)[-1]
            if op["op"] == "remove":
                out.pop(key, None)
            else:
                out[key] = str(op["value"])
        return out


# What people act on, with the value a Workload has when nothing was asked for it: a class,
# an override, a reclaim (the guard's state and the team it is lowered for). The rest of the
# terms is the encoding (fairness level, aging, the pool's reference), recorded by the
# annotation alone. An admitted Workload's plain guard is not news either: Kueue says it was
# admitted.
_NOTABLE_DEFAULTS = {"class": "normal", "override": "-", "state": "", "for": ""}
_PLAIN_STATES = frozenset({"", "admitted"})


def change_is_eventful(old_terms: str | None, new_terms: str) -> bool:
    """Whether writing `new_terms` over `old_terms` deserves an Event: a class, override or
    reclaim change (a first write counts from a normal Workload with no override), not an
    encoding change (fairness level, aging, a rebase)."""
    return _notable(_current(old_terms)) != _notable(_current(new_terms))


def _current(text: str | None) -> Mapping[str, str]:
    terms = Terms.parse(text)
    return terms if terms.current else {}


def _notable(terms: Mapping[str, str]) -> dict[str, str]:
    out = {k: terms.get(k, default) or default for k, default in _NOTABLE_DEFAULTS.items()}
    if out["state"] in _PLAIN_STATES:
        out["state"] = ""
    return out


def _terms_alone(old: str | None, new: str) -> bool:
    """Terms are written with the priority; alone only when what people act on changed while
    the value did not (an exposed Workload that Kueue preempted and whose pending value happens
    to be the one it had: its terms must not go on saying `state=reclaimable`)."""
    return bool(new) and old is not None and change_is_eventful(old, new)


def priority_patch(wl: Mapping[str, Any], mode: PriorityMode,
                   target: PriorityTarget) -> PriorityPatch | None:
    """The JSON patch (if any) that brings one Workload's priority to the target.

    * boost mode: `kueue.x-k8s.io/priority-boost` only (removed when the boost is 0). A base
      priority left behind by spec mode is restored in the same patch.
    * spec mode: `test`s the `spec.priority` it read, sets the target, and keeps the base in
      `wdrf.x-k8s.io/base-priority` and the target it wrote in `wdrf.x-k8s.io/applied-priority`
      (both dropped once the priority is back at the base). A boost annotation left behind by
      boost mode is removed.
    * In both modes the terms go in the same patch whenever the priority is written; every
      patch is a `compare_and_swap`: the UID and the read value of every field it replaces
      are tested first.
    * A pending target is written only while the Workload holds no quota (a `test` of
      `status.admission` as read; none once it has one): Kueue may admit it between the read
      and the write, and a pending value - lower than the one Kueue admitted it at - would
      let a Workload of its own class preempt it before the next plan guards it."""
    if target.pending and (wl.get("status") or {}).get("admission"):
        return None  # admitted since the plan read it: the next plan sees it admitted
    if mode is PriorityMode.BOOST:
        return _boost_patch(wl, target)
    if mode is PriorityMode.SPEC:
        return _spec_patch(wl, target)
    raise ValueError(f"priority mode {mode} must be resolved before diffing")


def _still_pending(wl: Mapping[str, Any], target: PriorityTarget) -> Ops:
    """For a pending target: a `test` that the Workload still holds no quota, as read."""
    if not target.pending:
        return []
    path, value = read_at(wl, "/status/admission")
    return [{"op": "test", "path": path, "value": value}]


def _boost_patch(wl: Mapping[str, Any], target: PriorityTarget) -> PriorityPatch | None:
    ann = annotations_of(wl)
    want = str(target.boost) if target.boost != 0 else None
    have = ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION)
    set_: dict[str, str] = {}
    remove: list[str] = []
    if have != want:
        if want is None:
            remove.append(KUEUE_PRIORITY_BOOST_ANNOTATION)
        else:
            set_[KUEUE_PRIORITY_BOOST_ANNOTATION] = want
    # Left over from spec mode: put the base priority back and forget it.
    spec_ops: Ops = []
    remove += [k for k in (APPLIED_PRIORITY_ANNOTATION, BASE_PRIORITY_ANNOTATION) if k in ann]
    if BASE_PRIORITY_ANNOTATION in ann and spec_priority(wl) != target.base:
        spec_ops.append({"op": "add", "path": pointer("spec", "priority"),
                         "value": target.base})
    old_terms = ann.get(PRIORITY_TERMS_ANNOTATION)
    if not set_ and not remove and not _terms_alone(old_terms, target.terms):
        return None
    if target.terms:
        set_[PRIORITY_TERMS_ANNOTATION] = target.terms
    ops = compare_and_swap(wl, _still_pending(wl, target) + spec_ops
                           + annotation_ops(wl, set_, remove))
    summary = f"priority boost {have or 0} -> {want or 0}"
    if spec_ops:
        summary += f", spec.priority restored to base {target.base}"
    return PriorityPatch(ops, summary, ann.get(PRIORITY_TERMS_ANNOTATION))


def _spec_patch(wl: Mapping[str, Any], target: PriorityTarget) -> PriorityPatch | None:
    ann = annotations_of(wl)
    have = spec_priority(wl)
    if BASE_PRIORITY_ANNOTATION in ann and implied_base(have, ann) != target.base:
        # Someone set a new base since the plan was made (seen when re-reading after a failed
        # `test`): never overwrite it with the old base; the next cycle plans from it.
        return None
    want = target.priority
    keep_base = want != target.base
    ann_ops: Ops = []
    if keep_base:
        # The base, and the value written here (so a later spec.priority that is neither tells
        # a new base from Kueue's reset and from our own write; see `implied_base`).
        for key, text in ((BASE_PRIORITY_ANNOTATION, str(target.base)),
                          (APPLIED_PRIORITY_ANNOTATION, str(want))):
            if ann.get(key) != text:
                ann_ops.append({"op": "add", "path": pointer("metadata", "annotations", key),
                                "value": text})
        if ann_ops and ("annotations" not in meta(wl) or meta(wl).get("annotations") is None):
            ann_ops.insert(0, {"op": "add", "path": pointer("metadata", "annotations"),
                               "value": {}})
    else:
        for key in (BASE_PRIORITY_ANNOTATION, APPLIED_PRIORITY_ANNOTATION):
            if key in ann:
                ann_ops.append({"op": "remove", "path": pointer("metadata", "annotations", key)})
    # Left over from boost mode: spec.priority now carries the whole target.
    if KUEUE_PRIORITY_BOOST_ANNOTATION in ann:
        ann_ops.append({"op": "remove", "path": pointer(
            "metadata", "annotations", KUEUE_PRIORITY_BOOST_ANNOTATION)})
    if have == want and not ann_ops and not _terms_alone(
            ann.get(PRIORITY_TERMS_ANNOTATION), target.terms):
        return None
    terms = target.terms
    if terms and ann.get(PRIORITY_TERMS_ANNOTATION) != terms:
        if not any(op["path"] == pointer("metadata", "annotations") for op in ann_ops) and (
                not isinstance(meta(wl).get("annotations"), Mapping)):
            ann_ops.insert(0, {"op": "add", "path": pointer("metadata", "annotations"),
                               "value": {}})
        ann_ops.append({"op": "add", "path": pointer(
            "metadata", "annotations", PRIORITY_TERMS_ANNOTATION), "value": terms})
    ops: Ops = _still_pending(wl, target)
    if have is not None:
        # Only if nobody changed it since we read it (Kueue, a user), even when unchanged.
        ops.append({"op": "test", "path": pointer("spec", "priority"), "value": have})
    if have != want:
        ops.append({"op": "add", "path": pointer("spec", "priority"), "value": want})
    ops = compare_and_swap(wl, ops + ann_ops)
    summary = f"spec.priority {have} -> {want} (base {target.base})"
    return PriorityPatch(ops, summary, ann.get(PRIORITY_TERMS_ANNOTATION))


@dataclass
class UndoPatch:
    """What undoing the controller's writes on one Workload takes (`reset`)."""

    namespace: str
    name: str
    remove: list[str] = field(default_factory=list)  # controller annotations to remove
    priority_from: int | None = None
    priority_to: int | None = None  # the base spec.priority goes back to
    kept_priority: str = ""  # why spec.priority is left as it is
    ops: Ops = field(default_factory=list)


def undo_patch(wl: Mapping[str, Any]) -> UndoPatch | None:
    """The JSON patch that undoes the controller's writes on one Workload (None: nothing).

    Removes the annotations only the controller writes and, in spec mode, puts spec.priority
    back to the base, unless spec.priority is neither the value the controller applied nor
    the base (someone else set it since; it stays). The base and applied values are read by
    the same strict rule as the controller's (`parse_int32`): an annotation the controller
    would reject is not trusted to restore a priority either. Each value relied on is
    `test`ed first."""
    m = meta(wl)
    ann = annotations_of(wl)
    undo = UndoPatch(str(m.get("namespace", "")), str(m.get("name", "")))
    present = [k for k in CONTROLLER_ANNOTATIONS if k in ann]
    base = parse_int32(ann.get(BASE_PRIORITY_ANNOTATION))
    applied = parse_int32(ann.get(APPLIED_PRIORITY_ANNOTATION))
    raw_prio = (wl.get("spec") or {}).get("priority")
    prio = raw_prio if isinstance(raw_prio, int) and not isinstance(raw_prio, bool) else None
    if base is not None and prio is not None and prio != base:
        if applied is None or prio == applied:
            undo.priority_from, undo.priority_to = prio, base
        else:
            undo.kept_priority = (f"spec.priority {prio} kept (neither the applied {applied} "
                                  f"nor the base {base}: set by someone else since)")
    if not present and undo.priority_to is None:
        return None
    ops: Ops = []
    if undo.priority_to is not None:
        ops.append({"op": "test", "path": "/spec/priority", "value": prio})
        ops.append({"op": "replace", "path": "/spec/priority", "value": undo.priority_to})
    for key in present:
        path = pointer("metadata", "annotations", key)
        ops.append({"op": "test", "path": path, "value": ann[key]})
        ops.append({"op": "remove", "path": path})
    undo.remove = present
    undo.ops = ops
    return undo
