"""What the informer cache keeps of a Workload, and the subtrees cached objects share.

The projection (`cache.WORKLOAD_FIELDS`) must keep everything a reader uses: the parser, the
prompt-cycle check, the owner lookups and the priority patch give the same from the projected
object as from the whole one."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.domain import PriorityMode
from controller.live.api import JOBS, WORKLOADS
from controller.live.cache import (
    WORKLOAD_FIELDS,
    Informer,
    Shared,
    WatchSpec,
    object_key,
    project,
    resource_version,
    slim,
)
from controller.live.metrics import Metrics
from controller.live.snapshot import class_annotations, needs_prompt_cycle
from controller.parse import parse_workload
from controller.workload import (
    PriorityTarget,
    WorkloadInfo,
    is_quota_reserved,
    owner_job_key,
    priority_patch,
)
from tests.support.builders import V1B1, json_paths, set_at, workload_dict
from tests.support.fake import FakeApi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _real_workloads() -> list[dict[str, Any]]:
    out = []
    for name in ("real-snapshot.yaml", "real-snapshot-v1beta1.yaml"):
        doc = yaml.safe_load((FIXTURES / name).read_text())
        out += [i for i in doc["items"] if i.get("kind") == "Workload"]
    return out


def _with_everything(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with what a Workload of a real cluster carries beyond what the controller reads."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    meta["managedFields"] = [{"manager": "kueue", "fieldsV1": {"f:status": {}}}]
    meta["finalizers"] = ["kueue.x-k8s.io/resource-in-use"]
    meta["generation"] = 3
    for ps in obj["spec"]["podSets"]:
        tmpl = ps["template"]
        tmpl.setdefault("metadata", {})["labels"] = {"batch.kubernetes.io/job-name": "j"}
        tmpl["metadata"].setdefault("annotations", {"hami.io/gpu-scheduler-policy": "binpack"})
        pod = tmpl["spec"]
        pod.update(restartPolicy="Never", schedulerName="default-scheduler",
                   volumes=[{"name": "data", "emptyDir": {}}],
                   initContainers=[{"name": "init", "image": "busybox"}])
        for c in pod["containers"]:
            c.update(image="registry/train:1.2", command=["python", "train.py"],
                     env=[{"name": "EPOCHS", "value": "3"}])
        ps["topologyRequest"] = {"podIndexLabel": "batch.kubernetes.io/job-completion-index"}
    status = obj.setdefault("status", {})
    status["resourceRequests"] = [{"name": "main", "resources": {"cpu": "1"}}]
    status["requeueState"] = {"count": 1}
    for c in status.get("conditions", []):
        c.update(message="a long message from Kueue " * 4, observedGeneration=3)
    return obj


BASES: list[dict[str, Any]] = [
    workload_dict("plain"),
    workload_dict("urgent", annotations={"wdrf.x-k8s.io/urgent": "true"}, owner_job="j",
                  labels={"kueue.x-k8s.io/queue-name": "default"}),
    workload_dict("adm", admitted_to="cq", count=2, limits={"nvidia.com/gpu": "1"},
                  owner=("JobSet", "js"), priority_class="high"),
    workload_dict("v1b1", api=V1B1, priority_class="low", active=False, priority=None),
    workload_dict("done", admitted_to="cq", finished=True),
    workload_dict("evicted", admitted_to="cq", conditions=[
        {"type": "Evicted", "status": "True", "reason": "Preempted",
         "message": "Preempted to accommodate a workload (UID: p-uid, JobUID: j-uid) due to "
                    "prioritization in the ClusterQueue; preemptor path: /cq",
         "lastTransitionTime": "2025-11-20T11:00:00Z"},
        {"type": "Preempted", "status": "False", "reason": "QuotaReserved",
         "lastTransitionTime": "2025-11-20T11:10:00Z"},
        {"type": "Requeued", "status": "True", "reason": "Backoff",
         "lastTransitionTime": "2025-11-20T11:05:00Z"}]),
    workload_dict("written", annotations={
        "wdrf.x-k8s.io/base-priority": "0", "wdrf.x-k8s.io/applied-priority": "1200",
        "wdrf.x-k8s.io/priority-terms": "v2 class=normal team=a",
        "kueue.x-k8s.io/priority-boost": "5"}, priority=1200),
    {**workload_dict("only-requests"), "status": {"resourceRequests": []}},
    *_real_workloads(),
]
OBJECTS = BASES + [_with_everything(o) for o in BASES]
TARGETS = [PriorityTarget(0, 1500, 1500, "v2 class=urgent team=a", pending=True),
           PriorityTarget(0, 1200, 1200, "v2 class=normal team=a"),
           PriorityTarget(0, 0, 0, "")]


def _call(f: Callable[..., Any], *args: Any) -> Any:
    """What `f` returns, or the type of what it raises (the same from both objects)."""
    try:
        return f(*args)
    except Exception as e:
        return type(e)


def readings(obj: dict[str, Any]) -> list[Any]:
    """Everything the controller reads from a cached Workload."""
    workload, problems = parse_workload(obj)
    out: list[Any] = [workload, problems, _call(is_quota_reserved, obj),
                      _call(class_annotations, obj), _call(owner_job_key, obj),
                      _call(resource_version, obj), _call(object_key, obj)]
    if workload is not None:
        info = WorkloadInfo.of(obj, workload)
        out += [info.owner_job_key, info.owner_job_uid, info.owner_uids]
        out += [_call(priority_patch, obj, mode, t)
                for mode in (PriorityMode.SPEC, PriorityMode.BOOST) for t in TARGETS]
    never = lambda _key: None  # noqa: E731
    out += [_call(needs_prompt_cycle, "Workload", old, obj, never)
            for old in (None, {}, workload_dict("x", admitted_to="cq"))]
    return out


def test_the_projection_keeps_everything_the_controller_reads() -> None:
    for obj in OBJECTS:
        full = json.loads(json.dumps(obj))
        assert readings(project(full, WORKLOAD_FIELDS)) == readings(full), obj["metadata"]


def test_the_projection_drops_what_nobody_reads() -> None:
    obj = project(_with_everything(BASES[2]), WORKLOAD_FIELDS)
    meta, pod_set = obj["metadata"], obj["spec"]["podSets"][0]
    assert "managedFields" not in meta and "finalizers" not in meta and "generation" not in meta
    assert set(pod_set) == {"name", "count", "template"}
    assert set(pod_set["template"]["metadata"]) == {"annotations"}
    assert set(pod_set["template"]["spec"]) == {"containers"}
    assert set(pod_set["template"]["spec"]["containers"][0]) == {"name", "resources"}
    assert set(obj["status"]) == {"admission", "conditions"}
    assert all("message" not in c and "observedGeneration" not in c
               for c in obj["status"]["conditions"])
    # Of the messages, the Evicted condition's only: it names the preemptor.
    evicted = project(decoded(BASES[5]), WORKLOAD_FIELDS)
    assert [c["type"] for c in evicted["status"]["conditions"] if "message" in c] == ["Evicted"]
    w, _ = parse_workload(evicted)
    assert w is not None and w.preempted_for == "p-uid"
    # Only a status with nothing the controller reads: still there (a patch tests its absence).
    assert project(_with_everything(BASES[0]), WORKLOAD_FIELDS)["status"] == {}


def test_slim_projects_workloads_only() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "n"},
           "spec": {"suspend": True, "template": {"spec": {"containers": [
               {"name": "c", "image": "i", "resources": {}}]}}}}
    assert slim(copy.deepcopy(job), JOBS, Shared()) == job
    kept = slim(_with_everything(BASES[0]), WORKLOADS, Shared())
    assert "image" not in kept["spec"]["podSets"][0]["template"]["spec"]["containers"][0]


scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False),
                    st.text(max_size=6), st.sampled_from(["True", "1", "QuotaReserved", "uid"]))
junk = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(OBJECTS) - 1), st.data(), junk)
def test_the_projection_keeps_what_the_controller_reads_of_malformed_workloads(
        which: int, data: st.DataObject, value: Any) -> None:
    obj = copy.deepcopy(OBJECTS[which])
    set_at(obj, data.draw(st.sampled_from(json_paths(obj))), value)
    full = json.loads(json.dumps(obj))
    assert readings(project(full, WORKLOAD_FIELDS)) == readings(full)


def decoded(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def test_equal_subtrees_of_separately_decoded_objects_are_one_object() -> None:
    shared = Shared()
    a = slim(decoded(workload_dict("a", admitted_to="cq")), WORKLOADS, shared)
    b = slim(decoded(workload_dict("b", admitted_to="cq")), WORKLOADS, shared)
    assert a["spec"] is b["spec"]
    assert a["status"]["admission"] is b["status"]["admission"]
    assert a["status"]["conditions"] is b["status"]["conditions"]
    # Each object's own: its metadata (it has a uid), and so the object itself.
    assert a["metadata"] is not b["metadata"] and a is not b
    assert a == decoded(project(workload_dict("a", admitted_to="cq"), WORKLOAD_FIELDS))
    # With another table (another informer's), only the strings are shared.
    c = slim(decoded(workload_dict("c", admitted_to="cq")), WORKLOADS, Shared())
    assert c["spec"] is not a["spec"] and c["spec"] == a["spec"]
    assert c["spec"]["queueName"] is a["spec"]["queueName"]


def test_subtrees_with_a_uid_are_not_shared() -> None:
    shared = Shared()
    a = slim(decoded(workload_dict("a", owner_job="j")), WORKLOADS, shared)
    b = slim(decoded(workload_dict("a", owner_job="j")), WORKLOADS, shared)
    assert a["metadata"]["ownerReferences"] is not b["metadata"]["ownerReferences"]
    assert a["metadata"]["ownerReferences"] == b["metadata"]["ownerReferences"]


def test_values_equal_in_python_but_not_in_json_are_not_shared() -> None:
    shared = Shared()
    values: list[Any] = [True, 1, 1.0, False, 0, None, "1", "true", [1], {"a": 1}]
    out = [shared([{"v": v}, [v]]) for v in values]
    for v, (d, lst) in zip(values, out, strict=True):
        assert type(d["v"]) is type(v) and d["v"] == v
        assert type(lst[0]) is type(v)
    assert shared([{"v": True}, [True]])[0] is out[0][0]  # equal content and types: shared


def test_key_order_is_kept() -> None:
    shared = Shared()
    a = shared({"x": {"p": 1, "q": 2}})
    b = shared({"x": {"q": 2, "p": 1}})
    assert list(a["x"]) == ["p", "q"] and list(b["x"]) == ["q", "p"]


def test_prune_forgets_what_no_cached_object_holds() -> None:
    shared = Shared()
    keep = [shared({"a": {"b": [i, {"c": i}]}}) for i in range(3)]
    for i in range(3, 10):
        shared({"a": {"b": [i, {"c": i}]}})
    assert len(shared) == 10 * 4
    shared.prune()
    assert len(shared) == 3 * 4
    again = shared({"a": {"b": [1, {"c": 1}]}})
    assert again is keep[1]


def test_the_informer_forgets_old_subtrees_after_a_relist_and_while_watching() -> None:
    api = FakeApi()
    for i in range(5):
        api.put_object(WORKLOADS.item(f"w{i}", "ns"), workload_dict(f"w{i}", "ns", queue=f"q{i}"))
    inf = Informer(api, WatchSpec(WORKLOADS), Metrics())
    inf.relist()
    first = len(inf._shared)
    assert first > 0
    for i in range(5):  # each to another queue: new subtrees, the old ones held by nothing
        api.put_object(WORKLOADS.item(f"w{i}", "ns"), workload_dict(f"w{i}", "ns", queue=f"r{i}"))
    inf.relist()
    assert len(inf._shared) == first
    assert {o["spec"]["queueName"] for o in inf.items()} == {f"r{i}" for i in range(5)}
    for n in range(3000):  # watch events, each moving a Workload to a queue of its own
        obj = workload_dict(f"w{n % 5}", "ns", queue=f"s{n}")
        obj["metadata"]["resourceVersion"] = str(100 + n)
        inf.apply_event({"type": "MODIFIED", "object": obj})
    assert len(inf._shared) <= 1000 + first  # not one entry per event: pruned on the way
    assert {o["spec"]["queueName"] for o in inf.items()} == {f"s{n}" for n in range(2995, 3000)}


def test_a_shared_subtree_is_held_once_in_memory() -> None:
    shared = Shared()
    objs = [slim(decoded(workload_dict(f"w{i}", admitted_to="cq")), WORKLOADS, shared)
            for i in range(100)]
    specs = {id(o["spec"]) for o in objs}
    assert len(specs) == 1
    assert sys.getrefcount(objs[0]["spec"]) > 100
