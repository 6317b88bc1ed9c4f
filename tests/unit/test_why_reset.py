"""`why` and `reset` against the in-memory apiserver (tests/support/fake.py); the real-plane
proofs (namespace-scoped token, Kueue's own conditions) are in tests/plane/test_why.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from controller import reset as reset_mod
from controller import why as why_mod
from controller.cli import main
from controller.reset import plan_undo, reset
from controller.why import WhyError, namespace_position, usage_over_entitlement, why
from controller.workload import Terms
from tests.support.builders import workload_dict
from tests.support.fake import FakeApi

V = "/apis/kueue.x-k8s.io/v1beta2"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
TERMS = ("v2 class=normal team=team-a pool=cq/cq-gpu level=12/50 fair=24000 "
         "since=2026-11-22T10:00:00Z ref=2026-11-22T11:55:00Z base=0 override=- priority=1050000")


def workload(name: str, ns: str = "team-a", *, queue: str = "lq", owner: tuple[str, str] | None
             = None, prio: int = 0, ann: dict[str, str] | None = None,
             conditions: list[dict[str, Any]] | None = None, created: str = "2026-11-22T10:00:00Z",
             active: bool = True) -> dict[str, Any]:
    """A Workload (tests/support/builders.py), pending by default, as `why` reads it."""
    return workload_dict(name, ns, queue=queue, owner=owner, priority=prio,
                         annotations=dict(ann or {}), created=created, active=active,
                         conditions=conditions if conditions is not None else [PENDING])


PENDING = {"type": "QuotaReserved", "status": "False", "reason": "Pending",
           "message": "couldn't assign flavors to pod set main: insufficient unused quota for "
                      "nvidia.com/gpu in flavor h100, 2 more needed"}


@pytest.fixture
def api() -> FakeApi:
    a = FakeApi()
    a.static["/apis/kueue.x-k8s.io"] = {"kind": "APIGroup", "name": "kueue.x-k8s.io",
                                        "versions": [{"version": "v1beta2"},
                                                     {"version": "v1beta1"}]}
    a.put_object(f"{V}/namespaces/team-a/localqueues/lq", {
        "metadata": {"name": "lq"}, "spec": {"clusterQueue": "cq-gpu"},
        "status": {"pendingWorkloads": 3}})
    return a


def put(api: FakeApi, wl: dict[str, Any]) -> None:
    meta = wl["metadata"]
    api.put_object(f"{V}/namespaces/{meta['namespace']}/workloads/{meta['name']}", wl)


# ---------------------------------------------------------------------------------------------
# terms


def test_parse_terms_is_tolerant() -> None:
    parse_terms = Terms.parse
    t = parse_terms(TERMS)
    assert t["version"] == "v2" and t["class"] == "normal" and t["level"] == "12/50"
    assert t["override"] == "-" and t["priority"] == "1050000"
    assert parse_terms("version=1;class=approved;team=x;new-key=7;junk;=;") == {
        "version": "1", "class": "approved", "team": "x", "new-key": "7"}
    assert parse_terms("") == {} and parse_terms(None) == {}


def test_usage_over_entitlement_band() -> None:
    low, high = usage_over_entitlement(25, 50) or (0, 0)
    assert low < 1.0 <= high + 1e-9  # level 25/50 is the fair share
    low, high = usage_over_entitlement(12, 50) or (0, 0)
    assert 1.9 < low < 2.0 < high < 2.1
    assert usage_over_entitlement(0, 50) == (pytest.approx(5.64, abs=0.01), float("inf"))
    assert usage_over_entitlement(51, 50) is None


# ---------------------------------------------------------------------------------------------
# why


def test_why_resolves_a_job_to_its_workload_and_explains(api: FakeApi) -> None:
    put(api, workload("job-train-abcde", owner=("Job", "train"), ann={
        "wdrf.x-k8s.io/priority-terms": TERMS, "kueue.x-k8s.io/priority-boost": "1050000"}))
    put(api, workload("job-other-12345", owner=("Job", "other"), prio=0,
                      ann={"kueue.x-k8s.io/priority-boost": "2000000"}))
    r = why(api, "team-a", "train", now=NOW)
    assert r.workload == "job-train-abcde" and r.owner == "Job/train"
    assert r.state == "pending" and r.kueue_reason == "Pending"
    assert "insufficient unused quota" in r.kueue_message
    assert r.cluster_queue == "cq-gpu" and r.queue_pending == 3
    assert r.priority == 1050000 and r.boost == 1050000
    assert r.waited_seconds == 2 * 3600
    # no visibility API in the fake: the namespace's own order, said so
    assert (r.position.local, r.position.of, r.position.source) == (2, 2, "namespace")
    text = why_mod.render_text(r)
    assert "Kueue says:     Pending: couldn't assign flavors" in text
    assert "2 of 2 in its LocalQueue" in text and why_mod.VISIBILITY_NOT_SERVED in text
    assert "kubectl annotate -n team-a job train wdrf.x-k8s.io/approved=true" in text
    assert "Team team-a uses about 1.9-2.1x its share of ClusterQueue cq-gpu" in text
    assert "no free quota" in text
    # only GETs, and nothing cluster-wide
    assert not api.writes()
    assert all("/namespaces/team-a/" in p or p == "/apis/kueue.x-k8s.io"
               for _, p in api.requests), api.requests


def test_why_uses_the_visibility_api_when_served(api: FakeApi) -> None:
    put(api, workload("job-train-abcde", owner=("Job", "train")))
    api.static["/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/team-a/localqueues/lq/"
               "pendingworkloads"] = {"items": [
                   {"metadata": {"name": "job-x-1"}, "positionInLocalQueue": 0,
                    "positionInClusterQueue": 3},
                   {"metadata": {"name": "job-train-abcde"}, "positionInLocalQueue": 1,
                    "positionInClusterQueue": 7}]}
    r = why(api, "team-a", "train", now=NOW)
    assert (r.position.local, r.position.cluster, r.position.source) == (2, 8, "visibility")
    assert "2 of 2 in its LocalQueue, 8 in ClusterQueue cq-gpu" in why_mod.render_text(r)


def test_why_says_when_the_visibility_api_is_forbidden(api: FakeApi) -> None:
    put(api, workload("job-train-abcde", owner=("Job", "train")))
    api.fail("GET", "/localqueues/lq/pendingworkloads", 403, times=2)  # v1beta2, then v1beta1
    r = why(api, "team-a", "train", now=NOW)
    assert (r.position.local, r.position.source) == (1, "namespace")
    assert r.position.note.endswith(why_mod.VISIBILITY_FORBIDDEN), r.position.note
    assert "localqueues/pendingworkloads" in why_mod.render_text(r)


def test_why_any_owner_kind_and_ambiguity(api: FakeApi) -> None:
    put(api, workload("rayjob-ft-1", owner=("RayJob", "ft")))
    assert why(api, "team-a", "ft", now=NOW).owner == "RayJob/ft"
    put(api, workload("job-ft-2", owner=("Job", "ft")))
    with pytest.raises(WhyError, match=r"several owners.*--kind"):
        why(api, "team-a", "ft", now=NOW)
    assert why(api, "team-a", "ft", kind="rayjob", now=NOW).workload == "rayjob-ft-1"
    assert why(api, "team-a", "ft", kind="job.batch", now=NOW).workload == "job-ft-2"
    with pytest.raises(WhyError, match="no Workload for nope in namespace team-a"):
        why(api, "team-a", "nope", now=NOW)


def test_why_states_and_advice(api: FakeApi) -> None:
    put(api, workload("held", active=False, ann={"wdrf.x-k8s.io/priority-terms": TERMS.replace(
        "class=normal", "class=approved").replace("level=12/50", "level=40/50")}))
    r = why(api, "team-a", "held", now=NOW)
    assert r.state == "held"
    text = why_mod.render_text(r)
    assert "deactivated" in text and "Only an admin can make it urgent" in text
    assert "uses less than its share" in text
    put(api, workload("running", conditions=[
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
        {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"}]))
    r = why(api, "team-a", "running", now=NOW)
    assert r.state == "admitted" and r.waited_seconds is None
    assert r.advice == ["It is admitted: Kueue reserved its quota and its pods may run."]
    put(api, workload("fresh"))
    r = why(api, "team-a", "fresh", now=NOW)
    assert any("has not published a priority breakdown" in a for a in r.advice)


def test_why_forbidden_is_one_clear_line(api: FakeApi) -> None:
    api.fail("GET", "/namespaces/team-b/workloads", 403, times=5)
    with pytest.raises(WhyError, match="not allowed to get workloads in namespace team-b"):
        why(api, "team-b", "x", now=NOW)


def test_namespace_position_orders_like_kueue() -> None:
    a = workload("a", prio=10, created="2026-11-22T10:00:00Z")
    b = workload("b", prio=0, ann={"kueue.x-k8s.io/priority-boost": "20"},
                 created="2026-11-22T11:00:00Z")
    c = workload("c", prio=10, created="2026-11-22T09:00:00Z")
    other_queue = workload("d", prio=99, queue="other")
    admitted = workload("e", prio=99, conditions=[
        {"type": "QuotaReserved", "status": "True"}])
    for i, w in enumerate((a, b, c, other_queue, admitted)):
        w["metadata"]["uid"] = f"u{i}"
    items = [a, b, c, other_queue, admitted]
    assert [namespace_position(items, w).local for w in (b, c, a)] == [1, 2, 3]


def test_why_cli_text_json_and_errors(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    put(api, workload("job-train-abcde", owner=("Job", "train"),
                      ann={"wdrf.x-k8s.io/priority-terms": TERMS}))
    monkeypatch.setattr(why_mod, "_transport", lambda *a: api)
    runner = CliRunner()
    r = runner.invoke(main, ["why", "team-a/train"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("team-a/job-train-abcde (for Job/train)")
    r = runner.invoke(main, ["why", "-o", "json", "-n", "team-a", "train"])
    assert r.exit_code == 0 and '"workload": "job-train-abcde"' in r.output
    r = runner.invoke(main, ["why", "team-a/missing"])
    assert r.exit_code == 1
    assert r.output.strip().count("\n") == 0 and r.output.startswith("error: no Workload")
    api.fail("GET", "/apis/kueue.x-k8s.io", 0, times=1, message="connection refused")
    r = runner.invoke(main, ["why", "team-a/train"])
    assert r.exit_code == 1 and r.output.startswith("error: cannot reach the Kubernetes API")
    assert "Traceback" not in r.output


# ---------------------------------------------------------------------------------------------
# reset


def test_plan_undo_boost_mode_removes_only_the_controllers_annotations() -> None:
    wl = workload("w", ann={"kueue.x-k8s.io/priority-boost": "1050000",
                            "wdrf.x-k8s.io/priority-terms": TERMS,
                            "wdrf.x-k8s.io/approved": "true"})
    undo = plan_undo(wl)
    assert undo is not None and undo.priority_to is None
    assert undo.remove == ["kueue.x-k8s.io/priority-boost", "wdrf.x-k8s.io/priority-terms"]
    assert undo.ops == [
        {"op": "test", "path": "/metadata/annotations/kueue.x-k8s.io~1priority-boost",
         "value": "1050000"},
        {"op": "remove", "path": "/metadata/annotations/kueue.x-k8s.io~1priority-boost"},
        {"op": "test", "path": "/metadata/annotations/wdrf.x-k8s.io~1priority-terms",
         "value": TERMS},
        {"op": "remove", "path": "/metadata/annotations/wdrf.x-k8s.io~1priority-terms"}]
    assert plan_undo(workload("clean", ann={"wdrf.x-k8s.io/urgent": "true"})) is None


def test_plan_undo_spec_mode_restores_the_base_unless_someone_else_set_it() -> None:
    spec = {"wdrf.x-k8s.io/base-priority": "100", "wdrf.x-k8s.io/applied-priority": "1050100"}
    undo = plan_undo(workload("w", prio=1050100, ann=spec))
    assert undo is not None and (undo.priority_from, undo.priority_to) == (1050100, 100)
    assert undo.ops[:2] == [{"op": "test", "path": "/spec/priority", "value": 1050100},
                            {"op": "replace", "path": "/spec/priority", "value": 100}]
    kept = plan_undo(workload("w", prio=500, ann=spec))  # e.g. Kueue reset it to a new class
    assert kept is not None and kept.priority_to is None and "kept" in kept.summary()


def test_reset_dry_run_writes_nothing_then_yes_cleans_everything(api: FakeApi) -> None:
    put(api, workload("a", ann={"kueue.x-k8s.io/priority-boost": "5",
                                "wdrf.x-k8s.io/priority-terms": TERMS}))
    put(api, workload("b", ns="team-b", prio=1050100, ann={
        "wdrf.x-k8s.io/base-priority": "100", "wdrf.x-k8s.io/applied-priority": "1050100",
        "wdrf.x-k8s.io/approved": "true"}))
    put(api, workload("c"))
    undos = reset(api, now=NOW)
    assert [u.key for u in undos] == ["team-a/a", "team-b/b"]
    assert not api.writes()
    assert "dry run: 2 Workloads to reset (1 spec.priority to restore)" in reset_mod.render(
        undos, False)
    undos = reset(api, write=True, now=NOW)
    assert [u.result for u in undos] == ["done", "done"]
    a = api.get_object(f"{V}/namespaces/team-a/workloads/a") or {}
    b = api.get_object(f"{V}/namespaces/team-b/workloads/b") or {}
    assert a["metadata"]["annotations"] == {}
    assert b["metadata"]["annotations"] == {"wdrf.x-k8s.io/approved": "true"}
    assert b["spec"]["priority"] == 100
    assert [m for m, _ in api.writes()] == ["PATCH", "PATCH"]
    assert reset(api, write=True, now=NOW) == []  # idempotent


def test_reset_retries_a_conflict_and_refuses_while_the_controller_runs(api: FakeApi) -> None:
    put(api, workload("a", ann={"kueue.x-k8s.io/priority-boost": "5"}))
    api.fail("PATCH", "/workloads/a", 422, times=1)
    assert [u.result for u in reset(api, write=True, now=NOW)] == ["done"]
    put(api, workload("a", ann={"kueue.x-k8s.io/priority-boost": "5"}))
    api.put_object("/apis/coordination.k8s.io/v1/namespaces/kueue-system/leases/wdrf-controller",
                   {"metadata": {"name": "wdrf-controller"},
                    "spec": {"holderIdentity": "pod-1", "leaseDurationSeconds": 15,
                             "renewTime": (NOW - timedelta(seconds=3)).isoformat()}})
    with pytest.raises(WhyError, match=r"controller is running.*pod-1"):
        reset(api, write=True, now=NOW)
    assert len(reset(api, write=False, now=NOW)) == 1  # a dry run is always allowed
    assert [u.result for u in reset(api, write=True, force=True, now=NOW)] == ["done"]


def test_reset_cli(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    put(api, workload("a", ann={"kueue.x-k8s.io/priority-boost": "5"}))
    monkeypatch.setattr(reset_mod, "_transport", lambda *a: api)
    runner = CliRunner()
    r = runner.invoke(main, ["reset"])
    assert r.exit_code == 0 and "dry run: 1 Workloads" in r.output and not api.writes()
    r = runner.invoke(reset_mod.kubectl_plugin, ["reset", "--yes"])
    assert r.exit_code == 0 and "team-a/a: remove kueue.x-k8s.io/priority-boost  [done]" in (
        r.output)
    api.fail("GET", "/workloads", 403, times=1)
    r = runner.invoke(main, ["reset", "--yes"])
    assert r.exit_code == 1 and r.output.startswith("error: not allowed to list workloads")


def test_why_says_when_the_clusterqueue_does_not_cover_a_resource(api: FakeApi) -> None:
    """Kueue's "unavailable in ClusterQueue" (BlockUndeclared) never clears by itself: no
    "wait for quota" advice, but what to change."""
    put(api, workload("frac", conditions=[{
        "type": "QuotaReserved", "status": "False", "reason": "Pending",
        "message": "couldn't assign flavors to pod set main: resource nvidia.com/gpucores "
                   "unavailable in ClusterQueue"}]))
    r = why(api, "team-a", "frac", now=NOW)
    text = why_mod.render_text(r)
    assert "will never admit it" in text and "cover that resource" in text
    assert "no free quota" not in text


def test_why_share_band_that_rounds_to_one_value_is_said_once(api: FakeApi) -> None:
    level = next(n for n in range(50)
                 if (b := usage_over_entitlement(n, 50)) is not None and b[0] >= 1.0
                 and f"{b[0]:.1f}" == f"{b[1]:.1f}")
    put(api, workload("even", ann={"wdrf.x-k8s.io/priority-terms": TERMS.replace(
        "level=12/50", f"level={level}/50")}))
    text = why_mod.render_text(why(api, "team-a", "even", now=NOW))
    band = usage_over_entitlement(level, 50)
    assert band is not None
    assert f"uses about {band[0]:.1f}x its share" in text
    assert f"{band[0]:.1f}-{band[1]:.1f}x" not in text


def test_why_says_a_workload_is_reclaimable_or_was_reclaimed(api: FakeApi) -> None:
    admitted = [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                 "message": ""},
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"}]
    put(api, workload("held-long", conditions=admitted, ann={
        "wdrf.x-k8s.io/priority-terms": "v2 class=normal team=team-a pool=cq/cq-gpu "
        "state=reclaimable for=team-b over=2.00 override=- priority=1500"}))
    r = why(api, "team-a", "held-long", now=NOW)
    assert r.advice[1] == ("Team team-a holds 2.00x its entitlement in ClusterQueue cq-gpu and "
                           "this Workload ran past MIN_RUNTIME: Kueue may preempt it for waiting "
                           "work of team(s) team-b (same class, below their entitlement) - a "
                           "reclaim.")
    put(api, workload("taken", ann={"wdrf.x-k8s.io/priority-terms": TERMS + (
        " reclaimed-for=team-b")}))
    r = why(api, "team-a", "taken", now=NOW)
    assert any("for waiting work of team(s) team-b (a reclaim)" in a for a in r.advice)


def test_why_says_a_workload_is_held_behind_the_one_kueue_is_taking_quota_for(
        api: FakeApi) -> None:
    put(api, workload("second", ann={"wdrf.x-k8s.io/priority-terms": TERMS + " behind=first"}))
    r = why(api, "team-a", "second", now=NOW)
    assert any("Kueue is taking quota for first of the same team and class" in a
               for a in r.advice), r.advice
