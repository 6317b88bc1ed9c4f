"""Who wrote a change, read from the Workload's managedFields (the plane tests' second witness
of one writer at a time, tests/plane/live_history.py)."""

from __future__ import annotations

from typing import Any

from controller.domain import KUEUE_PRIORITY_BOOST_ANNOTATION
from tests.plane.live_history import attribute

A, B, KUEUE = "wdrf-controller/a_1", "wdrf-controller/b_2", "kueue-admission"
BOOST = f"f:{KUEUE_PRIORITY_BOOST_ANNOTATION}"


def wl(rv: int, boost: int | None, *managers: tuple[str, str, list[str]]) -> dict[str, Any]:
    ann = {KUEUE_PRIORITY_BOOST_ANNOTATION: str(boost)} if boost is not None else {}
    return {"metadata": {
        "name": "w", "uid": "u", "resourceVersion": str(rv), "annotations": ann,
        "managedFields": [
            {"manager": m, "operation": "Update", "time": t,
             "fieldsV1": {"f:metadata": {"f:annotations": {f: {} for f in fields}}}}
            for m, t, fields in managers]}, "spec": {}}


def test_a_new_entry_names_its_writer() -> None:
    before = wl(5, None, (KUEUE, "2026-01-01T00:00:01Z", ["f:x"]))
    after = wl(6, 10, (KUEUE, "2026-01-01T00:00:01Z", ["f:x"]), (A, "2026-01-01T00:00:02Z",
                                                                   [BOOST]))
    c = attribute("MODIFIED", before, after)
    assert (c.rv, c.replicas(), c.controller_fields, c.inferred) == (6, {"a_1"}, True, False)


def test_a_restamped_entry_names_its_writer_and_a_shrunk_one_does_not() -> None:
    """B takes the boost from A: A's entry loses the field (B wrote, not A)."""
    before = wl(6, 10, (A, "2026-01-01T00:00:02Z", [BOOST, "f:t"]))
    after = wl(9, 20, (A, "2026-01-01T00:00:02Z", ["f:t"]), (B, "2026-01-01T00:00:09Z", [BOOST]))
    assert attribute("MODIFIED", before, after).replicas() == {"b_2"}
    later = wl(12, 30, (A, "2026-01-01T00:00:02Z", ["f:t"]), (B, "2026-01-01T00:00:11Z", [BOOST]))
    assert attribute("MODIFIED", after, later).replicas() == {"b_2"}


def test_a_same_second_rewrite_goes_to_the_latest_stamped_replica_or_is_ambiguous() -> None:
    before = wl(6, 10, (A, "2026-01-01T00:00:02Z", ["f:t"]), (B, "2026-01-01T00:00:09Z", [BOOST]))
    again = wl(7, 11, (A, "2026-01-01T00:00:02Z", ["f:t"]), (B, "2026-01-01T00:00:09Z", [BOOST]))
    c = attribute("MODIFIED", before, again)
    assert (c.replicas(), c.inferred, c.ambiguous) == ({"b_2"}, True, False)
    tied = wl(6, 10, (A, "2026-01-01T00:00:09Z", ["f:t"]), (B, "2026-01-01T00:00:09Z", [BOOST]))
    both = wl(7, 11, (A, "2026-01-01T00:00:09Z", ["f:t"]), (B, "2026-01-01T00:00:09Z", [BOOST]))
    c = attribute("MODIFIED", tied, both)
    assert (c.replicas(), c.ambiguous) == (frozenset(), True)


def test_changes_of_other_fields_are_not_given_to_a_replica() -> None:
    before = wl(6, 10, (A, "2026-01-01T00:00:02Z", [BOOST]), (KUEUE, "2026-01-01T00:00:02Z", []))
    status = wl(7, 10, (A, "2026-01-01T00:00:02Z", [BOOST]), (KUEUE, "2026-01-01T00:00:05Z", []))
    c = attribute("MODIFIED", before, status)
    assert (c.writers, c.controller_fields) == ({KUEUE}, False)
    assert attribute("DELETED", status, status).writers == frozenset()
