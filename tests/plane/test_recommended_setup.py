"""examples/recommended/ on the real control plane: Kueue restarted with the keys of
kueue-config.yaml, the queues and Jobs server-side applied as shipped (strict field
validation), and Kueue's own answers as the witness: it admits the four Jobs, lends team-a
the cohort's idle GPUs, and reports Fair Sharing's weighted share on every ClusterQueue (a
status Kueue writes only with Fair Sharing on). Then the controller's dry run reads the same
cluster and plans the one Job that cannot fit, in the cohort's pool.

Isolation on the shared plane: namespaces, ClusterQueues, the cohort and the flavor get a
random suffix; Kueue's previous configuration is restored afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.support import kube
from tests.support.cluster import kueue_settings_from
from tests.support.plane import Plane

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "recommended"
FIELD_MANAGER = "wdrf-recommended-test"
ORDER = ["Namespace", "ResourceFlavor", "ClusterQueue", "LocalQueue", "Job"]

Obj = dict[str, Any]


def _docs(name: str, suffix: str) -> list[Obj]:
    text = (EXAMPLE / name).read_text(encoding="utf-8")
    for team in ("team-a", "team-b", "team-c"):
        text = text.replace(team, f"{team}-{suffix}")
    text = text.replace("gpu-pool", f"gpu-pool-{suffix}")
    text = text.replace("name: gpu\n", f"name: gpu-{suffix}\n")  # flavor and LocalQueues
    text = text.replace("queue-name: gpu\n", f"queue-name: gpu-{suffix}\n")
    return [d for d in yaml.safe_load_all(text) if d]


def _path(obj: Obj) -> str:
    kind, meta = obj["kind"], obj["metadata"]
    if kind == "Namespace":
        return f"/api/v1/namespaces/{meta['name']}"
    if kind == "Job":
        return f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}"
    plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
              "LocalQueue": "localqueues"}[kind]
    return kube.kueue_path(plural, meta["name"], meta.get("namespace"))


def _borrowed_gpus(cq: Obj) -> float:
    total = 0.0
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        for r in flavor.get("resources") or []:
            if r.get("name") == "nvidia.com/gpu":
                total += float(str(r.get("borrowed", "0")))
    return total


def test_the_recommended_setup_applies_and_kueue_admits_from_it(
    plane: Plane, api: k8s.ApiClient, kubeconfig: Path
) -> None:
    suffix = uuid.uuid4().hex[:6]
    # the same merge `make cluster CLUSTER_ARGS="--kueue-config ..."` does (README)
    wanted = kueue_settings_from(plane.kueue_settings, EXAMPLE / "kueue-config.yaml")
    with plane.kueue_configured(extra=wanted.extra, feature_gates=wanted.feature_gates):
        queues, jobs = _docs("queues.yaml", suffix), _docs("jobs.yaml", suffix)
        for d in sorted(queues + jobs, key=lambda d: ORDER.index(d["kind"])):
            kube.server_side_apply(api, _path(d), d, FIELD_MANAGER)
        cqs = [d for d in queues if d["kind"] == "ClusterQueue"]
        for d in queues:
            if d["kind"] in ("ClusterQueue", "LocalQueue"):
                kube.wait_for(lambda d=d: kube.has_condition(  # type: ignore[misc]
                    kube.request(api, "GET", _path(d)), "Active"), 60,
                    f"{d['kind']} {d['metadata']['name']} Active")
        # Kueue admits every shipped Job: 17 of the cohort's 24 GPUs, team-a beyond its 8
        for job in jobs:
            ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
            kube.wait_for(lambda ns=ns, name=name: kube.has_condition(  # type: ignore[misc]
                kube.workload_for_job(api, ns, name), "Admitted"), 90,
                f"Kueue admits {ns}/{name}")
        team_a = next(c for c in cqs if c["metadata"]["name"] == f"team-a-{suffix}")
        kube.wait_for(lambda: _borrowed_gpus(kube.request(api, "GET", _path(team_a))) == 4,
                      60, "team-a's ClusterQueue borrows 4 GPUs from the cohort")
        # Fair Sharing is on: Kueue writes each ClusterQueue's weighted share
        for cq in cqs:
            kube.wait_for(lambda cq=cq: "weightedShare" in (  # type: ignore[misc]
                (kube.request(api, "GET", _path(cq)).get("status") or {}).get("fairSharing")
                or {}), 60, f"Fair Sharing status on {cq['metadata']['name']}")
        # One Job more than the cohort can ever hold stays pending; the controller plans it
        big = yaml.safe_load(yaml.safe_dump(next(j for j in jobs if "team-b" in
                                                 j["metadata"]["namespace"])))
        big["metadata"]["name"] = "too-big"
        for c in big["spec"]["template"]["spec"]["containers"]:
            c["resources"]["requests"]["nvidia.com/gpu"] = "21"
            c["resources"]["limits"]["nvidia.com/gpu"] = "21"
        kube.server_side_apply(api, _path(big), big, FIELD_MANAGER)
        ns = big["metadata"]["namespace"]
        kube.wait_for(lambda: kube.is_pending(kube.workload_for_job(api, ns, "too-big")), 60,
                      "the too-big Job's Workload pending")
        env = {**os.environ, "KUBECONFIG_PATH": str(kubeconfig), "METRICS_PORT": "0",
               "LEADER_ELECTION": "false", "CAPACITY_SOURCE": "quota", "COLUMNS": "200",
               "KUEUE_FAIR_SHARING": "true"}
        out = subprocess.run([sys.executable, "-m", "controller", "--dry-run", "--once",
                              "--config", str(ROOT / "config.yaml"), "-o", "json"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
                             check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        plan = yaml.safe_load(out.stdout[out.stdout.index("{"):])
        pending = [d for d in plan["decisions"] if not d["admitted"]
                   and d["workload"].startswith(f"{ns}/")]
        assert [d["clusterQueue"] for d in pending] == [f"team-b-{suffix}"], pending
        assert pending[0]["breakdown"]["pool"] == f"cohort/gpu-pool-{suffix}"
