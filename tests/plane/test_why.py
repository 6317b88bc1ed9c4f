"""Proof on the real plane: `why` works for an ordinary user with only namespace-scoped read
rights (a ServiceAccount token bound to a Role in one namespace), resolves a Job to its
Workload and shows Kueue's own state; with the shipped `wdrf-why-reader` ClusterRole bound in
the namespace it shows the queue position Kueue's visibility API reports (checked against the
admin's own read of that API), without it the namespace's own order, saying why; `reset` undoes
what the live controller wrote (spec mode: spec.priority back to the base, every controller
annotation gone), dry run first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from controller.domain import (
    APPLIED_PRIORITY_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
)
from controller.why import TERMS_ANNOTATION, VISIBILITY_FORBIDDEN
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.plane import VISIBILITY_GROUP, Plane

pytestmark = pytest.mark.plane

REPO = Path(__file__).resolve().parents[2]
CONTROLLER_ANNOTATIONS = {KUEUE_PRIORITY_BOOST_ANNOTATION, BASE_PRIORITY_ANNOTATION,
                          APPLIED_PRIORITY_ANNOTATION, TERMS_ANNOTATION}


def reader_kubeconfig(api: k8s.ApiClient, admin_kubeconfig: Path, ns: str, path: Path,
                      cluster_role: str | None = None) -> Path:
    """A kubeconfig for ServiceAccount `reader` in `ns`, context namespace `ns`, allowed only to
    read in `ns`: Workloads and LocalQueues (a Role), or what ``cluster_role`` grants (bound
    by a RoleBinding in `ns`)."""
    if cluster_role is None:
        kube.request(api, "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "kueue-reader"},
            "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"],
                       "verbs": ["get", "list"]}]}, "application/json")
    kube.request(api, "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "kueue-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole" if cluster_role else "Role",
                    "name": cluster_role or "kueue-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]},
        "application/json")
    token = kube.service_account_token(api, ns, "reader")
    kc: dict[str, Any] = yaml.safe_load(admin_kubeconfig.read_text())
    kc["users"] = [{"name": "reader", "user": {"token": token}}]
    kc["contexts"] = [{"name": "reader", "context": {
        "cluster": kc["clusters"][0]["name"], "user": "reader", "namespace": ns}}]
    kc["current-context"] = "reader"
    path.write_text(yaml.safe_dump(kc))
    return path


def cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run([sys.executable, "-m", "controller", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_why_as_a_namespace_reader_then_reset(
    api: k8s.ApiClient, kubeconfig: Path, tmp_path: Path
) -> None:
    ns = kube.create_namespace(api)
    cq, lq = kube.create_queues(api, ns, {"cpu": 1})
    try:
        h.create_job(api, ns, "running", lq)
        kube.wait_for_workload_condition(api, ns, h.job_workload(api, ns, "running"),
                                         "QuotaReserved")
        h.create_job(api, ns, "train", lq)
        train = h.job_workload(api, ns, "train")
        h.wait_pending(api, ns, train)
        time.sleep(1.1)  # a later creation time: train is ahead of later
        h.create_job(api, ns, "later", lq)
        later = h.job_workload(api, ns, "later")
        h.wait_pending(api, ns, later)

        c = h.new_controller(kubeconfig, h.live_settings(PRIORITY_MODE="spec"))
        with h.started(c):
            h.converge(c)
        written = kube.get_workload(api, ns, train)
        assert written["spec"]["priority"] > 0
        assert BASE_PRIORITY_ANNOTATION in written["metadata"]["annotations"]

        reader = reader_kubeconfig(api, kubeconfig, ns, tmp_path / "reader.kubeconfig")
        # the reader really is namespace-scoped
        denied = cli(reader, "reset")
        assert denied.returncode == 1
        assert denied.stderr.strip() == ("error: not allowed to list workloads in all "
                                         "namespaces: reset needs an admin (list and patch "
                                         "workloads.kueue.x-k8s.io)"), denied.stderr

        out = cli(reader, "why", "train")  # namespace from the kubeconfig context
        assert out.returncode == 0, out.stdout + out.stderr
        text = out.stdout
        assert text.startswith(f"{ns}/{train} (for Job/train)"), text
        assert f"state:          pending in LocalQueue {lq} -> ClusterQueue {cq}" in text, text
        assert "1 of 2 in its LocalQueue" in text, text
        # the visibility API is served, but this Role does not grant it: said so
        assert VISIBILITY_FORBIDDEN.split(" (")[0] in text, text
        assert "priority now:   " + str(written["spec"]["priority"]) in text, text
        doc = json.loads(cli(reader, "why", "-o", "json", f"{ns}/train").stdout)
        assert doc["workload"] == train and doc["state"] == "pending"
        assert doc["position"]["local"] == 1
        if TERMS_ANNOTATION in written["metadata"]["annotations"]:  # the controller's breakdown
            assert doc["terms"]["class"] == "normal" and "breakdown (published" in text
        missing = cli(reader, "why", "nope")
        assert missing.returncode == 1 and missing.stderr.startswith("error: no Workload for nope")
        admitted = cli(reader, "why", "-o", "json", "running")
        assert json.loads(admitted.stdout)["state"] in ("admitted", "quota-reserved")

        # reset: dry run changes nothing, --yes restores, a second run finds nothing
        before = kube.get_workload(api, ns, train)["metadata"]["resourceVersion"]
        dry = cli(kubeconfig, "reset", "--namespace", ns)
        assert dry.returncode == 0, dry.stderr
        assert f"{ns}/{train}: remove " in dry.stdout and "dry run: " in dry.stdout
        assert kube.get_workload(api, ns, train)["metadata"]["resourceVersion"] == before
        done = cli(kubeconfig, "reset", "--namespace", ns, "--yes")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "0 failed" in done.stdout
        for name in (train, later):
            wl = kube.get_workload(api, ns, name)
            assert wl["spec"].get("priority", 0) == 0, kube.describe_workload(wl)
            left = set(wl["metadata"].get("annotations") or {}) & CONTROLLER_ANNOTATIONS
            assert not left, left
        again = cli(kubeconfig, "reset", "--namespace", ns, "--yes")
        assert again.returncode == 0 and again.stdout.startswith("reset 0 of 0"), again.stdout
    finally:
        h.cleanup(api, [ns], [cq])


CLUSTER_ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"


@pytest.fixture
def why_reader_role(api: k8s.ApiClient) -> Iterator[str]:
    """The rules of ClusterRole `wdrf-why-reader` as manifests/ ships it, under a name of this
    test's own (so a later `helm install` of the chart finds no foreign object of its name)."""
    role = next(o for o in kube.render_kustomize(REPO / "manifests")
                if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "wdrf-why-reader")
    name = kube.unique_name("wdrf-why-reader")
    kube.request(api, "POST", CLUSTER_ROLES, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": role["rules"]}, "application/json")
    yield name
    kube.request(api, "DELETE", f"{CLUSTER_ROLES}/{name}")


def test_why_shows_kueues_own_position_to_a_namespace_reader(
    plane: Plane, api: k8s.ApiClient, kubeconfig: Path, tmp_path: Path, why_reader_role: str
) -> None:
    """Two namespaces share one ClusterQueue; the reader's own namespace has two pending jobs,
    the other namespace one with a higher priority than both. `why`, run with the reader's
    token, must report the positions Kueue's visibility API gives the admin: its job second of
    two in its LocalQueue and third in the ClusterQueue (the other team's job is ahead)."""
    plane.wait_visibility()
    with h.two_teams_on_a_full_queue(api) as (ns, other, cq):
        wl: dict[str, str] = {}
        for job, job_ns, prio in (("train", ns, 50), ("later", ns, 0), ("rival", other, 100)):
            h.create_job(api, job_ns, job, "lq")
            wl[job] = h.job_workload(api, job_ns, job)
            if prio:
                kube.set_priority(api, job_ns, wl[job], prio)
            time.sleep(1.1)  # creation times one second apart

        def admin_view() -> dict[str, tuple[int, int]]:
            """workload -> (position in its LocalQueue, in the ClusterQueue), 1-based, as
            Kueue's visibility API answers the admin."""
            doc = kube.request(api, "GET", f"/apis/{VISIBILITY_GROUP}/v1beta2/clusterqueues/"
                                           f"{cq}/pendingworkloads")
            return {i["metadata"]["name"]: (i["positionInLocalQueue"] + 1,
                                            i["positionInClusterQueue"] + 1)
                    for i in doc["items"]}

        expected = {wl["rival"]: (1, 1), wl["train"]: (1, 2), wl["later"]: (2, 3)}
        kube.wait_for(lambda: admin_view() == expected, 30,
                      f"Kueue's pending order rival, train, later in {cq}",
                      lambda: str(admin_view()))

        reader = reader_kubeconfig(api, kubeconfig, ns, tmp_path / "reader.kubeconfig",
                                   cluster_role=why_reader_role)
        reader_api = kube.token_client(api, yaml.safe_load(reader.read_text())[
            "users"][0]["user"]["token"])
        # namespace-scoped: neither the ClusterQueue's list nor another namespace's queue
        for path in (f"clusterqueues/{cq}", f"namespaces/{other}/localqueues/lq"):
            status, _ = kube.denial(lambda path=path: kube.request(  # type: ignore[misc]
                reader_api, "GET", f"/apis/{VISIBILITY_GROUP}/v1beta2/{path}/pendingworkloads"))
            assert status == 403, path
        assert kube.denial(lambda: kube.request(
            reader_api, "GET", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{other}/workloads"
        ))[0] == 403

        out = cli(reader, "why", "-o", "json", "later")
        assert out.returncode == 0, out.stdout + out.stderr
        pos = json.loads(out.stdout)["position"]
        witness = admin_view()
        assert witness == expected  # nothing moved while `why` ran
        assert (pos["local"], pos["cluster"]) == witness[wl["later"]] == (2, 3), pos
        assert (pos["of"], pos["source"], pos["note"]) == (2, "visibility", ""), pos
        text = cli(reader, "why", f"{ns}/train").stdout
        assert f"position:       1 of 2 in its LocalQueue, 2 in ClusterQueue {cq}" in text, text
