"""Small, stable helpers for tests that talk to the real control plane.

All functions take a ``kubernetes.client.ApiClient`` (``api``) and work with plain dicts for
Kueue objects (the ``kueue.x-k8s.io/v1beta2`` API unless a ``version`` is given).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PRIORITY_BOOST = "kueue.x-k8s.io/priority-boost"
KWOK_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
KWOK_JITTER = "pod-complete.stage.kwok.x-k8s.io/jitter-delay"
HAMI_REGISTER = "hami.io/node-nvidia-register"

Obj = dict[str, Any]
T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A wait helper ran out of time; the message says what was seen last."""


# ----- RBAC objects -----------------------------------------------------------------------------

RBAC_GROUP = "rbac.authorization.k8s.io"


def user(name: str) -> Obj:
    return {"apiGroup": RBAC_GROUP, "kind": "User", "name": name}


def group(name: str) -> Obj:
    return {"apiGroup": RBAC_GROUP, "kind": "Group", "name": name}


def service_account(name: str, namespace: str) -> Obj:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def role(name: str, rules: list[Obj], namespace: str | None = None) -> Obj:
    """A Role in ``namespace``, or a ClusterRole without one."""
    meta: Obj = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "Role" if namespace else "ClusterRole",
            "metadata": meta, "rules": rules}


def binding(name: str, role_name: str, subjects: list[Obj], namespace: str | None = None, *,
            cluster_role: bool = True) -> Obj:
    """A RoleBinding in ``namespace``, or a ClusterRoleBinding without one, of a ClusterRole
    (``cluster_role=False``: of the Role of that name in ``namespace``)."""
    meta: Obj = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "RoleBinding" if namespace else "ClusterRoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole" if cluster_role else "Role",
                        "name": role_name},
            "subjects": subjects}


# ----- generic REST ---------------------------------------------------------------------------
def request(api: k8s.ApiClient, method: str, path: str, body: Any = None,
            content_type: str | None = None,
            query: Mapping[str, str] | None = None) -> Obj:
    """Raw REST call with JSON in/out (``ApiException`` on HTTP errors).

    ``content_type`` defaults to ``application/json``, for PATCH to
    ``application/merge-patch+json``; others: ``application/json-patch+json`` (body is a
    list), ``application/apply-patch+yaml`` (server-side apply; add fieldManager to ``query``).
    """
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type or (
            "application/merge-patch+json" if method == "PATCH" else "application/json")
    method_, url, hdrs, body_, post = api.param_serialize(
        method, path, query_params=list((query or {}).items()), header_params=headers,
        body=body, auth_settings=["BearerToken"])
    resp = api.call_api(method_, url, header_params=hdrs, body=body_, post_params=post)
    data: bytes = resp.read()  # type: ignore[no-untyped-call]
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=data.decode(errors="replace"),
                                         data=None)
    out: Obj = json.loads(data) if data else {}
    return out


def server_side_apply(api: k8s.ApiClient, path: str, obj: Obj, field_manager: str,
                      dry_run: bool = False) -> Obj:
    """Server-side apply `obj` at `path` with strict field validation (unknown fields fail)."""
    query = {"fieldManager": field_manager, "force": "true", "fieldValidation": "Strict"}
    if dry_run:
        query["dryRun"] = "All"
    return request(api, "PATCH", path, obj, "application/apply-patch+yaml", query)


def denial(call: Callable[[], object]) -> tuple[int, str]:
    """Run `call`, expecting the apiserver to refuse it; return (HTTP status, message)."""
    try:
        call()
    except ApiException as e:
        body = e.body or ""
        try:
            message = str(json.loads(body).get("message", body))
        except ValueError:
            message = str(body)
        return int(e.status), message
    raise AssertionError("the apiserver accepted a request that should have been refused")


def render_kustomize(path: Path) -> list[Obj]:
    """`kubectl kustomize PATH`, parsed into objects: the one place tests render a
    kustomization (kubectl's built-in kustomize, no Go-built tool)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, f"kubectl (with built-in kustomize) is needed to render {path}"
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, f"kubectl kustomize {path} failed: {out.stderr.strip()}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kueue_path(plural: str, name: str = "", namespace: str | None = None,
               version: str = KUEUE_VERSION) -> str:
    """REST path of a Kueue resource (collection when ``name`` is empty)."""
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{KUEUE_GROUP}/{version}{ns}/{plural}" + (f"/{name}" if name else "")


def unique_name(prefix: str) -> str:
    """``prefix`` plus a short random suffix (valid DNS label)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# ----- namespaces and queues ------------------------------------------------------------------
def create_namespace(api: k8s.ApiClient, name: str | None = None,
                     labels: Mapping[str, str] | None = None) -> str:
    """Create a namespace (random ``t-xxxxxx`` name by default) and return its name."""
    name = name or unique_name("t")
    request(api, "POST", "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": name, "labels": dict(labels or {})}}, "application/json")
    return name


def create_resource_flavor(api: k8s.ApiClient, name: str,
                           node_labels: Mapping[str, str] | None = None) -> Obj:
    """Create (or return the existing) ResourceFlavor ``name``."""
    body = {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ResourceFlavor",
            "metadata": {"name": name}, "spec": {"nodeLabels": dict(node_labels or {})}}
    try:
        return request(api, "POST", kueue_path("resourceflavors"), body)
    except ApiException as e:
        if e.status != 409:
            raise
        return request(api, "GET", kueue_path("resourceflavors", name))


def create_cluster_queue(api: k8s.ApiClient, name: str, quota: Mapping[str, str | int],
                         flavor: str = "default", *,
                         namespace_selector: Obj | None = None,
                         queueing_strategy: str = "BestEffortFIFO",
                         preemption: Obj | None = None, cohort: str | None = None,
                         extra_spec: Obj | None = None) -> Obj:
    """Create a ClusterQueue with one resource group: ``quota`` maps resource -> nominalQuota.

    The flavor is created if missing. ``namespace_selector`` defaults to all namespaces;
    ``preemption`` defaults to Kueue's (no preemption within the queue).
    """
    create_resource_flavor(api, flavor)
    spec: Obj = {
        "namespaceSelector": namespace_selector if namespace_selector is not None else {},
        "queueingStrategy": queueing_strategy,
        "resourceGroups": [{
            "coveredResources": list(quota),
            "flavors": [{"name": flavor, "resources": [
                {"name": r, "nominalQuota": str(q)} for r, q in quota.items()]}],
        }],
    }
    if preemption is not None:
        spec["preemption"] = preemption
    if cohort:
        spec["cohortName"] = cohort
    spec.update(extra_spec or {})
    body = {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue",
            "metadata": {"name": name}, "spec": spec}
    return request(api, "POST", kueue_path("clusterqueues"), body)


def create_local_queue(api: k8s.ApiClient, namespace: str, name: str,
                       cluster_queue: str) -> Obj:
    """Create a LocalQueue ``namespace/name`` pointing at ``cluster_queue``."""
    body = {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue}}
    return request(api, "POST", kueue_path("localqueues", namespace=namespace), body)


def create_queues(api: k8s.ApiClient, namespace: str, quota: Mapping[str, str | int],
                  **cq_kwargs: Any) -> tuple[str, str]:
    """Create a fresh ClusterQueue (named after the namespace) and a LocalQueue ``lq`` in
    ``namespace``; return ``(cluster_queue, local_queue)``. kwargs go to create_cluster_queue.
    """
    cq = f"cq-{namespace}"
    selector = cq_kwargs.pop("namespace_selector", {"matchLabels": {
        "kubernetes.io/metadata.name": namespace}})
    create_cluster_queue(api, cq, quota, namespace_selector=selector, **cq_kwargs)
    create_local_queue(api, namespace, "lq", cq)
    return cq, "lq"


# ----- jobs and workloads ---------------------------------------------------------------------
def _resources(requests: Mapping[str, str | int]) -> Obj:
    req = {k: str(v) for k, v in requests.items()}
    # Extended resources (GPUs, HAMi's) need limits == requests.
    lim = {k: v for k, v in req.items() if k not in ("cpu", "memory", "ephemeral-storage")}
    out: Obj = {"requests": req}
    if lim:
        out["limits"] = lim
    return out


def job_manifest(namespace: str, name: str, queue: str | None, *,
                 requests: Mapping[str, str | int] | None = None, parallelism: int = 1,
                 completions: int | None = None, annotations: Mapping[str, str] | None = None,
                 labels: Mapping[str, str] | None = None,
                 pod_annotations: Mapping[str, str] | None = None,
                 run_seconds: float | None = None, suspend: bool = True,
                 priority_class: str | None = None) -> Obj:
    """A batch/v1 Job manifest for Kueue: one container with ``requests`` (default cpu 1).

    ``run_seconds`` sets kwok's pod run time (pod-complete delay and jitter-delay).
    ``priority_class`` sets the Job label ``kueue.x-k8s.io/priority-class`` (a
    WorkloadPriorityClass).
    """
    lbl = dict(labels or {})
    if queue:
        lbl[QUEUE_LABEL] = queue
    if priority_class:
        lbl["kueue.x-k8s.io/priority-class"] = priority_class
    pod_ann = dict(pod_annotations or {})
    if run_seconds is not None:
        pod_ann[KWOK_DELAY] = pod_ann[KWOK_JITTER] = f"{int(run_seconds * 1000)}ms"
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": lbl,
                     "annotations": dict(annotations or {})},
        "spec": {
            "suspend": suspend, "parallelism": parallelism,
            "completions": completions if completions is not None else parallelism,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": pod_ann},
                "spec": {
                    "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "busybox:1.36",
                                    "command": ["sleep", "3600"],
                                    "resources": _resources(requests or {"cpu": "1"})}],
                },
            },
        },
    }


def create_job(api: k8s.ApiClient, namespace: str, name: str, queue: str | None,
               **kwargs: Any) -> Obj:
    """Create a (suspended) Job from :func:`job_manifest` and return it as a dict."""
    body = job_manifest(namespace, name, queue, **kwargs)
    return request(api, "POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", body)


def get_job(api: k8s.ApiClient, namespace: str, name: str) -> Obj:
    """The Job as a dict."""
    return request(api, "GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")


def list_workloads(api: k8s.ApiClient, namespace: str | None = None,
                   label_selector: str | None = None, version: str = KUEUE_VERSION) -> list[Obj]:
    """Workloads in ``namespace`` (all namespaces if None)."""
    q = {"labelSelector": label_selector} if label_selector else None
    items: list[Obj] = request(api, "GET", kueue_path("workloads", namespace=namespace,
                                                      version=version), query=q)["items"]
    return items


def get_workload(api: k8s.ApiClient, namespace: str, name: str,
                 version: str = KUEUE_VERSION) -> Obj:
    """One Workload as a dict."""
    return request(api, "GET", kueue_path("workloads", name, namespace, version))


def workload_for_job(api: k8s.ApiClient, namespace: str, job_name: str,
                     timeout: float = 30) -> Obj:
    """Wait for and return the Workload Kueue created for Job ``job_name`` (by job-uid label)."""
    uid = get_job(api, namespace, job_name)["metadata"]["uid"]
    return wait_for(lambda: next(iter(list_workloads(api, namespace, f"{JOB_UID_LABEL}={uid}")),
                                 None),
                    timeout, f"a Workload for Job {namespace}/{job_name}")


def patch_workload(api: k8s.ApiClient, namespace: str, name: str, patch: Obj | list[Obj], *,
                   version: str = KUEUE_VERSION, subresource: str = "") -> Obj:
    """Patch a Workload: dict = JSON merge patch, list = JSON patch. Returns the result."""
    ct = "application/json-patch+json" if isinstance(patch, list) else \
        "application/merge-patch+json"
    path = kueue_path("workloads", name, namespace, version)
    return request(api, "PATCH", path + (f"/{subresource}" if subresource else ""), patch, ct)


def set_priority(api: k8s.ApiClient, namespace: str, name: str, priority: int) -> Obj:
    """Set a Workload's ``spec.priority``."""
    return patch_workload(api, namespace, name, {"spec": {"priority": priority}})


def set_priority_boost(api: k8s.ApiClient, namespace: str, name: str, boost: int | None) -> Obj:
    """Set (or with None remove) the ``kueue.x-k8s.io/priority-boost`` annotation."""
    value = None if boost is None else str(boost)
    return patch_workload(api, namespace, name,
                          {"metadata": {"annotations": {PRIORITY_BOOST: value}}})


def condition(obj: Obj, cond_type: str) -> Obj | None:
    """The status condition ``cond_type`` of ``obj`` or None."""
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("type") == cond_type:
            return dict(c)
    return None


def has_condition(obj: Obj, cond_type: str, status: str = "True") -> bool:
    """True if ``obj`` has condition ``cond_type`` with ``status``."""
    c = condition(obj, cond_type)
    return c is not None and c.get("status") == status


def is_pending(wl: Obj) -> bool:
    """Kueue's meaning of pending: no QuotaReserved=True and no Finished=True."""
    return not has_condition(wl, "QuotaReserved") and not has_condition(wl, "Finished")


def describe_workload(wl: Obj) -> str:
    """One readable paragraph: name, priority, boost, conditions, admission."""
    md, spec, st = wl.get("metadata", {}), wl.get("spec", {}), wl.get("status", {})
    conds = "; ".join(f"{c['type']}={c['status']} ({c.get('reason')}: {c.get('message')})"
                      for c in st.get("conditions", []) or [])
    boost = (md.get("annotations") or {}).get(PRIORITY_BOOST)
    adm = (st.get("admission") or {}).get("clusterQueue")
    return (f"Workload {md.get('namespace')}/{md.get('name')} priority={spec.get('priority')} "
            f"boost={boost} active={spec.get('active', True)} admittedBy={adm} "
            f"conditions=[{conds or 'none'}]")


def wait_for_workload_condition(api: k8s.ApiClient, namespace: str, name: str,
                                cond_type: str, status: str = "True", timeout: float = 30,
                                reason: str | None = None) -> Obj:
    """Wait until Workload ``name`` has ``cond_type``=``status`` (and ``reason`` if given).

    Raises :class:`WaitTimeout` with the Workload's last conditions when time runs out.
    """
    last: list[Obj] = [{}]

    def probe() -> Obj | None:
        wl = get_workload(api, namespace, name)
        last[0] = wl
        c = condition(wl, cond_type)
        ok = (c is not None and c.get("status") == status
              and (reason is None or c.get("reason") == reason))
        # A missing condition counts as False for status "False".
        ok = ok or (status == "False" and c is None and reason is None)
        return wl if ok else None

    return wait_for(probe, timeout, f"{cond_type}={status} on Workload {namespace}/{name}",
                    lambda: describe_workload(last[0]))


def wait_for(probe: Callable[[], T | None], timeout: float, what: str,
                describe: Callable[[], str] | None = None, interval: float = 0.2) -> T:
    """Poll ``probe`` until it returns a truthy value and return it; raise WaitTimeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            v = probe()
            if v:
                return v
        except ApiException as e:
            last_error = e
        if time.monotonic() > deadline:
            detail = describe() if describe else ""
            err = f"; last error: {last_error}" if last_error else ""
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}. "
                              f"Last seen: {detail}{err}")
        time.sleep(interval)


def admitted_names(api: k8s.ApiClient, namespace: str) -> set[str]:
    """Names of Workloads in ``namespace`` with QuotaReserved=True."""
    return {w["metadata"]["name"] for w in list_workloads(api, namespace)
            if has_condition(w, "QuotaReserved")}


# ----- identities -----------------------------------------------------------------------------
def service_account_token(api: k8s.ApiClient, namespace: str, name: str,
                          expiration_seconds: int = 3600) -> str:
    """Create ServiceAccount ``namespace/name`` if missing and return a TokenRequest token."""
    try:
        request(api, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
                "application/json")
    except ApiException as e:
        if e.status != 409:
            raise
    tr = request(api, "POST",
                 f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                 {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                  "spec": {"expirationSeconds": expiration_seconds}}, "application/json")
    token: str = tr["status"]["token"]
    return token


def token_client(admin: k8s.ApiClient, token: str) -> k8s.ApiClient:
    """A new ApiClient for the same server as ``admin`` that authenticates with ``token``."""
    cfg = k8s.Configuration()
    src = admin.configuration
    cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = src.host, src.ssl_ca_cert, src.verify_ssl
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return k8s.ApiClient(cfg)


class _ImpersonatingPool:
    """Wraps urllib3's pool manager to add Impersonate-* headers (repeated group headers)."""

    def __init__(self, inner: Any, user: str, groups: Iterable[str]) -> None:
        self._inner, self._user, self._groups = inner, user, list(groups)

    def request(self, method: str, url: str, headers: Mapping[str, str] | None = None,
                **kw: Any) -> Any:
        h = urllib3.HTTPHeaderDict(dict(headers or {}))
        h["Impersonate-User"] = self._user
        for g in self._groups:
            h.add("Impersonate-Group", g)
        return self._inner.request(method, url, headers=h, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def impersonating_client(admin: k8s.ApiClient, user: str,
                         groups: Iterable[str] = ()) -> k8s.ApiClient:
    """A new ApiClient that acts as ``user`` in ``groups`` (admin credentials + impersonation).

    ``system:authenticated`` is added by the apiserver. Check identity with :func:`whoami`.
    """
    c = token_client(admin, _admin_token(admin))
    pool = _ImpersonatingPool(c.rest_client.pool_manager, user, groups)
    c.rest_client.pool_manager = pool  # type: ignore[assignment]
    return c


def _admin_token(admin: k8s.ApiClient) -> str:
    raw = admin.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
    if not raw:
        raise ValueError("the admin ApiClient has no bearer token")
    return str(raw).removeprefix("Bearer ").strip()


def whoami(api: k8s.ApiClient) -> Obj:
    """``userInfo`` from a SelfSubjectReview: who the apiserver thinks ``api`` is."""
    r = request(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                "application/json")
    info: Obj = r["status"]["userInfo"]
    return info


# ----- fake GPU nodes (kwok) ------------------------------------------------------------------
def hami_register_annotation(gpus: int, split: int = 10, devmem_mib: int = 81559,
                             gpu_type: str = "NVIDIA-H100", node: str = "node") -> str:
    """HAMi's ``hami.io/node-nvidia-register`` JSON (v2.8+ form) for ``gpus`` GPUs."""
    devs = [{"id": f"GPU-{node}-{i:02d}", "count": split, "devmem": devmem_mib, "devcore": 100,
             "type": gpu_type, "numa": 0, "health": True, "index": i} for i in range(gpus)]
    return json.dumps(devs, separators=(",", ":"))


def create_gpu_node(api: k8s.ApiClient, name: str, gpus: int = 8, *, split: int = 10,
                    cpu: str = "64", memory: str = "512Gi", hami: bool = True,
                    labels: Mapping[str, str] | None = None,
                    extra_capacity: Mapping[str, str] | None = None) -> Obj:
    """Create a kwok-managed fake node advertising ``nvidia.com/gpu``.

    With ``hami`` the node looks like a HAMi node: allocatable ``nvidia.com/gpu`` = gpus x split
    and the ``hami.io/node-nvidia-register`` annotation; without it, ``gpus`` whole GPUs.
    """
    gpu_count = gpus * split if hami else gpus
    cap = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpu_count)}
    cap.update(extra_capacity or {})
    ann = {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}
    if hami:
        ann[HAMI_REGISTER] = hami_register_annotation(gpus, split, node=name)
    lbl = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
           "kubernetes.io/arch": "amd64", "type": "kwok", **dict(labels or {})}
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": ann, "labels": lbl},
            "spec": {"podCIDR": "10.244.0.0/24"},
            "status": {"capacity": cap, "allocatable": cap}}
    request(api, "POST", "/api/v1/nodes", body, "application/json")
    return request(api, "PATCH", f"/api/v1/nodes/{name}/status",
                   {"status": {"capacity": cap, "allocatable": cap}})


def wait_node_ready(api: k8s.ApiClient, name: str, timeout: float = 30) -> Obj:
    """Wait until kwok reports node ``name`` Ready."""
    return wait_for(
        lambda: (lambda n: n if has_condition(n, "Ready") else None)(
            request(api, "GET", f"/api/v1/nodes/{name}")),
        timeout, f"node {name} Ready")
