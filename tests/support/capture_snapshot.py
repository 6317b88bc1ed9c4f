"""Regenerate tests/fixtures/real-snapshot.yaml (v1beta2) and real-snapshot-v1beta1.yaml.

Starts a plane (PriorityBoost on, Kueue's HAMi resource transformations), creates a small
multi-team scene with admitted and pending Workloads, then saves the output of
``kubectl get workloads,clusterqueues,localqueues,resourceflavors -A -o yaml``
as Kueue really serves them.

    .venv/bin/python -m tests.support.capture_snapshot [--out-dir tests/fixtures]

The wdrf annotations (``wdrf.x-k8s.io/urgent``, ``wdrf.x-k8s.io/approved``) are set on the Jobs
and, since Kueue does not copy Job annotations, also on their Workloads.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client as k8s

from tests.support import kube
from tests.support.plane import HAMI_KUEUE_RESOURCES, REPO, KueueSettings, Plane
from tests.support.procs import PlaneError

KINDS = ("workloads", "clusterqueues", "localqueues", "resourceflavors")
URGENT = "wdrf.x-k8s.io/urgent"
APPROVED = "wdrf.x-k8s.io/approved"


@dataclass(frozen=True)
class SceneJob:
    namespace: str
    name: str
    requests: dict[str, str]
    admitted: bool
    annotations: dict[str, str] = field(default_factory=dict)
    priority_class: str | None = None


GPU_HALF = {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}
GPU_FULL = {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
GPU_MEM = {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1", "nvidia.com/gpucores": "30",
           "nvidia.com/gpumem": "16000"}

SCENE = (
    SceneJob("team-a", "train-llm", GPU_FULL, True),
    SceneJob("team-a", "finetune", GPU_HALF, True, priority_class="high"),
    SceneJob("team-a", "eval-urgent", GPU_HALF, False, {URGENT: "true"}),
    SceneJob("team-a", "batch-infer", GPU_FULL, False),
    SceneJob("team-b", "sweep-1", GPU_MEM, True, {APPROVED: "true"}),
    SceneJob("team-b", "sweep-2", GPU_MEM, False, {APPROVED: "true", URGENT: "true"}),
    SceneJob("team-c", "notebook", GPU_HALF, False),
    SceneJob("team-c", "cpu-prep", {"cpu": "1", "memory": "2Gi"}, True),
)


def build_scene(api: k8s.ApiClient) -> None:
    """Create flavors, a cohort of ClusterQueues, LocalQueues and the Jobs of SCENE."""
    kube.create_resource_flavor(api, "h100", {"nvidia.com/gpu.product": "NVIDIA-H100"})
    kube.request(api, "POST", kube.kueue_path("workloadpriorityclasses"), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
        "metadata": {"name": "high"}, "value": 1000, "description": "urgent production"},
        "application/json")
    for cq, gpus in (("research", 2), ("platform", 1)):
        quota = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(gpus),
                 "nvidia.com/total-gpucores": str(gpus * 100),
                 "nvidia.com/total-gpumem": str(gpus * 81559)}
        kube.create_cluster_queue(
            api, cq, quota, "h100", cohort="org",
            preemption={"withinClusterQueue": "Never", "reclaimWithinCohort": "Never"},
            extra_spec={"resourceGroups": [{
                "coveredResources": list(quota),
                "flavors": [{"name": "h100", "resources": [
                    {"name": r, "nominalQuota": q, "borrowingLimit": "0"}
                    for r, q in quota.items()]}]}]})
    for ns, cq in (("team-a", "research"), ("team-b", "platform"), ("team-c", "platform")):
        kube.create_namespace(api, ns)
        kube.create_local_queue(api, ns, "default", cq)
    for j in SCENE:  # in order: admitted ones first per queue, as Kueue sees them
        kube.create_job(api, j.namespace, j.name, "default", requests=j.requests,
                        annotations=j.annotations, priority_class=j.priority_class)
        wl = kube.workload_for_job(api, j.namespace, j.name)["metadata"]["name"]
        if j.annotations:
            kube.patch_workload(api, j.namespace, wl, {"metadata": {"annotations": j.annotations}})
        cond = ("Admitted", "True", None) if j.admitted else ("QuotaReserved", "False", "Pending")
        kube.wait_for_workload_condition(api, j.namespace, wl, cond[0], cond[1], reason=cond[2])


def kubectl_yaml(kubeconfig: Path, resources: str) -> str:
    """``kubectl get <resources> -A -o yaml`` output."""
    exe = shutil.which("kubectl")
    if exe is None:
        raise PlaneError("what is missing: the kubectl command")
    r = subprocess.run([exe, "--kubeconfig", str(kubeconfig), "get", resources, "-A",
                        "-o", "yaml"], capture_output=True, text=True, check=True)
    return r.stdout


def capture(plane: Plane, out_dir: Path) -> list[Path]:
    """Build the scene on ``plane`` and write both snapshot files; return their paths."""
    build_scene(plane.api_client())
    header = ("# Captured from a real kube-apiserver + Kueue v0.19.2 test plane by\n"
              "# tests/support/capture_snapshot.py ({cmd}). Do not edit by hand.\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    v2 = out_dir / "real-snapshot.yaml"
    cmd2 = f"kubectl get {','.join(KINDS)} -A -o yaml"
    v2.write_text(header.format(cmd=cmd2) + kubectl_yaml(plane.kubeconfig, ",".join(KINDS)))
    v1_kinds = ",".join(f"{k}.v1beta1.kueue.x-k8s.io" for k in KINDS)
    v1 = out_dir / "real-snapshot-v1beta1.yaml"
    v1.write_text(header.format(cmd=f"kubectl get {v1_kinds} -A -o yaml")
                  + kubectl_yaml(plane.kubeconfig, v1_kinds))
    return [v2, v1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out-dir", type=Path, default=REPO / "tests" / "fixtures")
    args = ap.parse_args(argv)
    try:
        settings = KueueSettings(extra={"resources": HAMI_KUEUE_RESOURCES})
        with Plane.temporary(settings) as plane:
            for p in capture(plane, args.out_dir):
                print(f"wrote {p}")
    except PlaneError as e:
        print(f"failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
