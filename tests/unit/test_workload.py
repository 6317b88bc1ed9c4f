"""The Workload's wire format (controller/workload.py): the priority terms, the base-priority
rule as reset and the controller both read it, conditions, owners, the effective priority."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controller.config import Settings
from controller.domain import (
    APPLIED_PRIORITY_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
)
from controller.parse import load_snapshot
from controller.plan import change_is_eventful, parse_terms
from controller.policy import compute_plan
from controller.workload import (
    TERMS_VERSION,
    Terms,
    effective_priority,
    implied_base,
    is_active,
    is_admitted,
    is_pending,
    is_quota_reserved,
    owner_job_key,
    owner_uids,
    parse_int32,
    terms_of,
    undo_patch,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def wl(ann: dict[str, str] | None = None, prio: int | None = None,
       conditions: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "w", "namespace": "ns", "uid": "u1", **meta},
                           "spec": {}, "status": {"conditions": conditions or []}}
    if ann is not None:
        obj["metadata"]["annotations"] = ann
    if prio is not None:
        obj["spec"]["priority"] = prio
    return obj


# -- terms --------------------------------------------------------------------------------------


def test_every_terms_value_of_a_real_plan_round_trips() -> None:
    snapshot = load_snapshot([ROOT / "examples" / "cluster-snapshot.yaml"])
    plan = compute_plan(snapshot, Settings(), NOW)
    written = [d.terms for d in plan.decisions if d.terms]
    assert len(written) > 5
    assert any("state=admitted" in t for t in written)  # guards and pending terms both
    for text in written:
        terms = Terms.parse(text)
        assert terms.current and terms.version == TERMS_VERSION
        assert terms.format() == text
        assert parse_terms(text) == dict(terms)


def test_unknown_keys_are_kept_in_order_and_written_back() -> None:
    text = "v2 class=normal team=a pool=cq/gpu state=exposed for=team-b why=reclaim priority=7"
    terms = Terms.parse(text)
    assert list(terms) == ["version", "class", "team", "pool", "state", "for", "why", "priority"]
    assert terms["for"] == "team-b" and terms.format() == text
    # A change in an unknown key is news; a change in the eventless ones alone is not.
    assert change_is_eventful(text, text.replace("for=team-b", "for=team-c"))
    assert not change_is_eventful(text, text.replace("priority=7", "priority=8"))


def test_terms_of_builds_the_current_version_in_keyword_order() -> None:
    terms = Terms.of(class_="urgent", team="a", pool="cq/x")
    assert terms.format() == "v2 class=urgent team=a pool=cq/x"
    assert Terms.parse(terms.format()) == terms


def test_terms_of_another_version_are_not_compared() -> None:
    assert parse_terms("v1 class=normal") == {}
    assert Terms.parse("v1 class=normal")["class"] == "normal"  # why still shows them
    assert terms_of(wl({PRIORITY_TERMS_ANNOTATION: "v2 class=approved"}))["class"] == "approved"
    assert terms_of(wl()) == {}


@given(st.dictionaries(st.from_regex(r"[a-z][a-z-]{0,8}", fullmatch=True).filter(
    lambda k: k != "version"), st.from_regex(r"[A-Za-z0-9/.:+-]{0,12}", fullmatch=True),
    max_size=8))
def test_format_then_parse_is_identity(words: dict[str, str]) -> None:
    terms = Terms({"version": TERMS_VERSION, **words})
    assert Terms.parse(terms.format()) == terms



def test_terms_of_one_key_order_share_their_layout_and_words() -> None:
    """The parse memo holds one Terms per distinct annotation (tens of thousands at scale):
    Terms of the same keys in the same order share one key index, and equal words are one
    string, so each costs its values' tuple, not a dict and strings of its own."""
    texts = [f"{TERMS_VERSION} class=normal team=t{i % 3} pool=cq/gpu priority={100 + i}"
             for i in range(6)]
    parsed = [Terms.parse("".join(t)) for t in texts]  # distinct str objects, equal or not
    assert len({id(t._index) for t in parsed}) == 1
    assert len({id(t["class"]) for t in parsed}) == 1
    assert len({id(t["team"]) for t in parsed if t["team"] == "t0"}) == 1
    assert [t["priority"] for t in parsed] == [str(100 + i) for i in range(6)]
    assert list(parsed[0]) == ["version", "class", "team", "pool", "priority"]
    other = Terms.parse(f"{TERMS_VERSION} team=t0 class=normal")  # another order: its own
    assert list(other) == ["version", "team", "class"] and other._index is not parsed[0]._index
    assert other.format() == f"{TERMS_VERSION} team=t0 class=normal"


def test_made_up_keys_do_not_grow_the_layout_table_without_bound() -> None:
    from controller import workload

    for i in range(workload._MAX_SHAPES + 50):
        terms = Terms({f"k{i}": "v"})
        assert terms[f"k{i}"] == "v" and list(terms) == [f"k{i}"]
    assert len(workload._INDEXES) <= workload._MAX_SHAPES


# -- the base priority --------------------------------------------------------------------------


def test_int32_is_strict() -> None:
    assert parse_int32("-5") == -5 and parse_int32("2147483647") == 2**31 - 1
    for bad in (" +5", "+5", "5 ", "1e3", "2147483648", "", None, "0x10"):
        assert parse_int32(bad) is None, bad


def test_implied_base_tells_our_write_from_kueues_reset_and_a_new_base() -> None:
    ann = {BASE_PRIORITY_ANNOTATION: "100", APPLIED_PRIORITY_ANNOTATION: "5000"}
    assert implied_base(5000, ann) == 100  # ours
    assert implied_base(100, ann) == 100  # Kueue reset it
    assert implied_base(300, ann) == 300  # someone set a new base
    assert implied_base(7, {}) == 7 and implied_base(None, {}) == 0
    assert implied_base(7, {BASE_PRIORITY_ANNOTATION: " +5"}) is None


def test_undo_reads_the_base_as_strictly_as_the_controller() -> None:
    """A base the controller would reject is not used to restore spec.priority either: only
    the controller's annotations are removed."""
    loose = wl({BASE_PRIORITY_ANNOTATION: " +5", APPLIED_PRIORITY_ANNOTATION: "5000"}, prio=5000)
    undo = undo_patch(loose)
    assert undo is not None and undo.priority_to is None
    assert undo.remove == [BASE_PRIORITY_ANNOTATION, APPLIED_PRIORITY_ANNOTATION]
    strict = wl({BASE_PRIORITY_ANNOTATION: "5", APPLIED_PRIORITY_ANNOTATION: "5000"}, prio=5000)
    undo = undo_patch(strict)
    assert undo is not None and undo.priority_to == 5


# -- conditions, owners, effective priority -----------------------------------------------------


def test_conditions_in_kueues_meaning() -> None:
    reserved = [{"type": "QuotaReserved", "status": "True"}]
    assert is_pending(wl()) and not is_quota_reserved(wl())
    assert is_quota_reserved(wl(conditions=reserved)) and not is_pending(wl(conditions=reserved))
    assert not is_pending(wl(conditions=[{"type": "Finished", "status": "True"}]))
    assert is_admitted(wl(conditions=[{"type": "Admitted", "status": "True"}]))
    assert not is_admitted(wl(conditions=[{"type": "Admitted", "status": "False"}]))
    off = wl()
    off["spec"]["active"] = False
    assert is_active(wl()) and not is_active(off)


def test_owner_keys() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j1",
           "controller": True}
    pod = {"kind": "Pod", "name": "p", "uid": "p1"}
    assert owner_job_key(wl(ownerReferences=[pod, job])) == "ns/train"
    assert owner_job_key(wl(ownerReferences=[{**job, "controller": False}])) is None
    assert owner_job_key(wl(ownerReferences=[{**job, "kind": "JobSet"}])) is None
    # Only exactly batch/v1 Job, as Kueue matches owners (a forged "batch/v2 Job" is not one).
    for api in ("batch/v2", "example.com/v1", ""):
        assert owner_job_key(wl(ownerReferences=[{**job, "apiVersion": api}])) is None
    assert owner_uids(wl(ownerReferences=[pod, job])) == ["p1", "j1"]


def test_effective_priority_is_what_kueue_orders_by() -> None:
    assert effective_priority(wl({KUEUE_PRIORITY_BOOST_ANNOTATION: "250"}, prio=100)) == 350
    assert effective_priority(wl({KUEUE_PRIORITY_BOOST_ANNOTATION: "x"}, prio=100)) == 100
    assert effective_priority(wl()) == 0


def test_pool_names_round_trip_for_people() -> None:
    from controller.domain import pool_key, pool_label

    assert pool_key("gpu") == "cq/gpu" and pool_key("gpu", "all") == "cohort/all"
    assert pool_label(pool_key("gpu")) == "ClusterQueue gpu"
    assert pool_label(pool_key("gpu", "all")) == "cohort all"
    assert pool_label("") == "the pool"


def test_terms_alone_are_written_when_what_people_act_on_changed() -> None:
    """A preempted victim whose pending value equals the value it had exposed: the terms must
    stop saying it is reclaimable, though the priority stays."""
    from controller.domain import PriorityMode
    from controller.workload import PriorityTarget, priority_patch

    old = ("v2 class=normal team=a pool=cq/cq state=reclaimable for=b over=2.00 override=- "
           "priority=29500")
    new = ("v2 class=normal team=a pool=cq/cq level=20/50 fair=40000 since=2026-01-01T00:00:00Z "
           "ref=2025-12-29T00:00:00Z base=0 override=- priority=29500 reclaimed-for=b")
    wl = {"metadata": {"name": "w", "namespace": "a", "uid": "u", "annotations": {
        "kueue.x-k8s.io/priority-boost": "29500", "wdrf.x-k8s.io/priority-terms": old}},
        "spec": {"priority": 0}}
    patch = priority_patch(wl, PriorityMode.BOOST, PriorityTarget(0, 29500, 29500, new))
    assert patch is not None
    assert any(op.get("value") == new for op in patch.ops)
    # only the encoding changed: nothing is written
    wl["metadata"]["annotations"]["wdrf.x-k8s.io/priority-terms"] = new
    assert priority_patch(wl, PriorityMode.BOOST, PriorityTarget(
        0, 29500, 29500, new.replace("level=20/50", "level=21/50"))) is None


_ANNOTATION_VALUES = st.one_of(st.none(), st.sampled_from(["0", "5", "29500", "-3", "x"]))


@given(
    boost=_ANNOTATION_VALUES, base=_ANNOTATION_VALUES, applied=_ANNOTATION_VALUES,
    terms=st.sampled_from([None, "v2 class=normal team=a", "v2 class=urgent team=a"]),
    prio=st.one_of(st.none(), st.integers(-5, 5)),
    target=st.tuples(st.integers(-5, 5), st.integers(-5, 40000), st.integers(-5, 40000),
                     st.sampled_from(["", "v2 class=normal team=a", "v2 class=approved team=b"])),
    spec_mode=st.booleans(),
)
def test_annotations_after_a_patch_are_what_the_api_server_makes_of_it(
        boost: str | None, base: str | None, applied: str | None, terms: str | None,
        prio: int | None, target: tuple[int, int, int, str], spec_mode: bool) -> None:
    """The evaluation's model writes `PriorityPatch.annotations_after`: the same annotations
    as the JSON patch applied by an API server."""
    from controller.domain import PriorityMode
    from controller.workload import PriorityTarget, priority_patch
    from tests.support.fake import json_patch

    ann = {k: v for k, v in ((KUEUE_PRIORITY_BOOST_ANNOTATION, boost),
                             (BASE_PRIORITY_ANNOTATION, base),
                             (APPLIED_PRIORITY_ANNOTATION, applied),
                             (PRIORITY_TERMS_ANNOTATION, terms)) if v is not None}
    obj = wl(ann or None, prio)
    mode = PriorityMode.SPEC if spec_mode else PriorityMode.BOOST
    patch = priority_patch(obj, mode, PriorityTarget(*target))
    if patch is None:
        return
    written = json_patch(obj, patch.ops)
    assert patch.annotations_after(ann) == written["metadata"].get("annotations", {})
