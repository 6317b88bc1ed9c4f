"""Offline checks of manifests/ and examples/: they render, validate against the Kubernetes 1.36
OpenAPI schemas (kubernetes-validate), grant exactly the RBAC the controller needs, and run the
controller locked down. Kueue objects are validated against Kueue's real CRD schemas on the test
control plane instead (tests/plane/test_manifests_plane.py): kubernetes-validate has no CRDs.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from controller.config import Settings, with_overrides

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
EXAMPLES = ROOT / "examples"
K8S_VERSION = "1.36.0"  # the test plane's Kubernetes minor; kubernetes-validate ships 1.36.0
NAMESPACE = "kueue-system"
SA_USER = "system:serviceaccount:kueue-system:wdrf-controller"

Obj = dict[str, Any]

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)
NamedRule = tuple[str, str, str, str | None]  # ... plus resourceName (None: any)


def _all_features() -> Settings:
    """Settings under which the controller uses every permission it can: node inventory,
    leader election and the usage-history ConfigMap all on."""
    return with_overrides(Settings(), capacity_source="auto", leader_election=True,
                          usage_half_life=3600.0)


def expected_cluster_rules() -> frozenset[Rule]:
    """Cluster-wide grants: controller/live/rbac.py's cluster-wide rows, plus
    SelfSubjectAccessReview create for --health-check."""
    from controller.live.rbac import permissions

    rows = permissions(_all_features())
    out = {(p.group, p.resource, p.verb) for p in rows if p.namespace is None}
    return frozenset(out | {("authorization.k8s.io", "selfsubjectaccessreviews", "create")})


def expected_namespace_rules() -> frozenset[NamedRule]:
    """Grants in kueue-system (controller/live/rbac.py's namespaced rows). Not narrowed by
    resourceNames: --health-check's SelfSubjectAccessReviews carry no object names."""
    from controller.live.rbac import permissions

    out: set[NamedRule] = set()
    for p in permissions(_all_features()):
        if p.namespace is None:
            continue
        assert p.namespace == NAMESPACE, p
        out.add((p.group, p.resource, p.verb, None))
    return frozenset(out)


def kustomize(path: Path) -> list[Obj]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with built-in kustomize) is needed to render manifests/"
    out = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def load_yaml_dir(path: Path) -> list[tuple[str, Obj]]:
    docs: list[tuple[str, Obj]] = []
    for f in sorted(path.glob("*.yaml")):
        for i, d in enumerate(yaml.safe_load_all(f.read_text(encoding="utf-8"))):
            if d:
                docs.append((f"{f.relative_to(ROOT)}#{i}", d))
    return docs


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return kustomize(MANIFESTS)


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    hits = [
        o
        for o in objs
        if o["kind"] == kind and (name is None or o["metadata"]["name"].startswith(name))
    ]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


def rule_triples(rules: list[Obj]) -> Iterator[Rule]:
    for r in rules:
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                for v in r.get("verbs", []):
                    yield g, res, v


def named_rules(rules: list[Obj]) -> Iterator[NamedRule]:
    for r in rules:
        for g, res, v in rule_triples([r]):
            for name in r.get("resourceNames") or [None]:
                yield g, res, v, name


def is_kueue(obj: Obj) -> bool:
    return str(obj.get("apiVersion", "")).startswith("kueue.x-k8s.io/")


def k8s_validate(obj: Obj) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ---------------------------------------------------------------------------------------------
# Rendering and schema validation


def test_kustomize_renders_expected_objects(rendered: list[Obj]) -> None:
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in rendered)
    expected_prefixes = [
        "ClusterRole/wdrf-controller",
        "ClusterRoleBinding/wdrf-controller",
        "ConfigMap/wdrf-admission-params",
        "ConfigMap/wdrf-controller-config-",  # generated, with a content hash
        "Deployment/wdrf-controller",
        "PodDisruptionBudget/wdrf-controller",
        "Role/wdrf-controller",
        "RoleBinding/wdrf-controller",
        "Service/wdrf-controller-metrics",
        "ServiceAccount/wdrf-controller",
        "ValidatingAdmissionPolicy/wdrf-class-annotations",
        "ValidatingAdmissionPolicyBinding/wdrf-class-annotations",
    ]
    assert len(kinds) == len(expected_prefixes), kinds
    for got, want in zip(kinds, expected_prefixes, strict=True):
        assert got.startswith(want), (got, want)


def test_no_namespace_object_and_everything_in_kueue_system(rendered: list[Obj]) -> None:
    assert not [o for o in rendered if o["kind"] == "Namespace"], "kueue-system is Kueue's"
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for o in rendered:
        ns = o["metadata"].get("namespace")
        if o["kind"] in cluster_scoped:
            assert ns is None, o["metadata"]
        else:
            assert ns == NAMESPACE, o["metadata"]


def test_every_rendered_manifest_validates(rendered: list[Obj]) -> None:
    for o in rendered:
        k8s_validate(o)


def test_validation_catches_a_bad_manifest(rendered: list[Obj]) -> None:
    """The validator is not a no-op: a typo'd field fails strict validation."""
    dep = yaml.safe_load(yaml.safe_dump(find(rendered, "Deployment")))
    dep["spec"]["replicass"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(dep)


def test_prometheus_overlay_renders_a_servicemonitor_for_the_metrics_service(
    rendered: list[Obj],
) -> None:
    objs = [o for o in kustomize(MANIFESTS / "overlays" / "prometheus")
            if o["kind"] == "ServiceMonitor"]  # alerts etc.: tests/unit/test_monitoring.py
    assert len(objs) == 1
    sm = objs[0]
    # No CRD schema for ServiceMonitor in kubernetes-validate: check the fields that matter.
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == NAMESPACE
    svc = find(rendered, "Service")
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["http-metrics"]
    assert "http-metrics" in port_names
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"


def test_admission_kustomization_renders_on_its_own() -> None:
    objs = kustomize(MANIFESTS / "admission")
    assert sorted(o["kind"] for o in objs) == [
        "ConfigMap",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for o in objs:
        k8s_validate(o)


# ---------------------------------------------------------------------------------------------
# Examples


def example_docs() -> list[tuple[str, Obj]]:
    return load_yaml_dir(EXAMPLES / "queues") + load_yaml_dir(EXAMPLES / "jobs")


def test_examples_exist_for_every_case() -> None:
    names = {p.name for p in (EXAMPLES / "jobs").glob("*.yaml")}
    assert {
        "normal.yaml",
        "approved.yaml",
        "urgent.yaml",
        "priority-override.yaml",
        "pod-group.yaml",
        "fractional-gpu.yaml",
    } <= names
    kinds = [(d["kind"], d["metadata"]["name"]) for _, d in load_yaml_dir(EXAMPLES / "queues")]
    assert ("ResourceFlavor", "h100") in kinds
    cqs = [d for _, d in load_yaml_dir(EXAMPLES / "queues") if d["kind"] == "ClusterQueue"]
    shared = [c for c in cqs if "cohortName" not in c["spec"]]
    cohort = [c for c in cqs if c["spec"].get("cohortName") == "h100-pool"]
    assert len(shared) == 1 and len(cohort) >= 2
    lqs = [d for _, d in load_yaml_dir(EXAMPLES / "queues") if d["kind"] == "LocalQueue"]
    shared_lq_namespaces = {
        q["metadata"]["namespace"]
        for q in lqs
        if q["spec"]["clusterQueue"] == shared[0]["metadata"]["name"]
    }
    assert len(shared_lq_namespaces) >= 2, "the shared queue serves several team namespaces"


@pytest.mark.parametrize("where,doc", example_docs(), ids=lambda v: v if isinstance(v, str) else "")
def test_example_validates(where: str, doc: Obj) -> None:
    if is_kueue(doc):
        # Validated against Kueue's CRD schema by the real apiserver in the plane test.
        assert doc["apiVersion"] == "kueue.x-k8s.io/v1beta2", where
        assert doc["kind"] in {"ResourceFlavor", "ClusterQueue", "LocalQueue"}, where
    else:
        k8s_validate(doc)


def _containers(doc: Obj) -> list[Obj]:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
    return list(spec["containers"])


@pytest.mark.parametrize(
    "where,doc",
    [(w, d) for w, d in example_docs() if d["kind"] in ("Job", "Pod")],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_example_workloads_are_queued_and_extended_resources_requests_equal_limits(
    where: str, doc: Obj
) -> None:
    assert doc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], where
    for c in _containers(doc):
        req, lim = c["resources"]["requests"], c["resources"]["limits"]
        for r in req.keys() | lim.keys():
            if "/" in r:
                assert str(req.get(r)) == str(lim.get(r)), (where, r)


def test_class_and_hami_examples_carry_the_right_annotations() -> None:
    def ann(name: str) -> dict[str, str]:
        docs = load_yaml_dir(EXAMPLES / "jobs")
        hits = [d for w, d in docs if w.endswith(f"{name}.yaml#0")]
        assert hits, name
        return dict(hits[0]["metadata"].get("annotations", {}))

    assert not any(k.startswith("wdrf.x-k8s.io/") for k in ann("normal"))
    assert ann("approved")["wdrf.x-k8s.io/approved"] == "true"
    assert ann("urgent")["wdrf.x-k8s.io/urgent"] == "true"
    assert int(ann("priority-override")["wdrf.x-k8s.io/priority-override"]) > 0

    frac = next(d for w, d in load_yaml_dir(EXAMPLES / "jobs") if "fractional-gpu" in w)
    limits = _containers(frac)[0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert limits["nvidia.com/gpucores"] == "50"
    assert limits["nvidia.com/gpumem-percentage"] == "50"

    pods = [d for w, d in load_yaml_dir(EXAMPLES / "jobs") if "pod-group" in w]
    assert len(pods) >= 2 and all(p["kind"] == "Pod" for p in pods)
    groups = {p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in pods}
    assert len(groups) == 1
    for p in pods:
        a = p["metadata"]["annotations"]
        assert a["kueue.x-k8s.io/pod-group-total-count"] == str(len(pods))
        assert a["hami.io/node-scheduler-policy"] in ("binpack", "spread")
        assert a["hami.io/gpu-scheduler-policy"] in ("binpack", "spread", "topology-aware")


# ---------------------------------------------------------------------------------------------
# RBAC


def test_cluster_role_is_exactly_what_the_controller_uses(rendered: list[Obj]) -> None:
    role = find(rendered, "ClusterRole")
    triples = list(rule_triples(role["rules"]))
    assert len(triples) == len(set(triples)), "duplicate grants"
    want = expected_cluster_rules()
    assert set(triples) == want, (set(triples) - want, want - set(triples))
    for r in role["rules"]:
        assert "resourceNames" not in r
        assert "nonResourceURLs" not in r


def test_namespaced_role_is_exactly_lease_history_and_kueue_config(rendered: list[Obj]) -> None:
    role = find(rendered, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    got = list(named_rules(role["rules"]))
    assert len(got) == len(set(got)), "duplicate grants"
    want = expected_namespace_rules()
    assert set(got) == want, (set(got) - want, want - set(got))
    # Nothing there is listed, watched, patched or deleted; Deployments are only read.
    for g, res, v, _name in got:
        assert v in ("get", "create", "update"), (g, res, v)
        assert res != "deployments" or v == "get"


def test_no_wildcards_and_no_secrets_anywhere(rendered: list[Obj]) -> None:
    for kind in ("ClusterRole", "Role"):
        for g, res, v in rule_triples(find(rendered, kind)["rules"]):
            assert "*" not in (g, res, v), (kind, g, res, v)
            assert res != "secrets" and not res.startswith("secrets/"), (kind, res)
            assert v not in ("delete", "deletecollection", "escalate", "bind", "impersonate")


def test_rbac_checker_catches_a_wildcard() -> None:
    bad = [{"apiGroups": ["*"], "resources": ["secrets"], "verbs": ["get"]}]
    assert ("*", "secrets", "get") in set(rule_triples(bad))
    assert set(rule_triples(bad)) != expected_cluster_rules()


def test_bindings_grant_the_roles_to_the_controller_service_account(rendered: list[Obj]) -> None:
    sa = find(rendered, "ServiceAccount")
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        b = find(rendered, kind)
        assert b["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": find(rendered, role_kind)["metadata"]["name"],
        }
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
        ]


# ---------------------------------------------------------------------------------------------
# Deployment


def test_deployment_shape(rendered: list[Obj]) -> None:
    dep = find(rendered, "Deployment")
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2
    assert pod["serviceAccountName"] == find(rendered, "ServiceAccount")["metadata"]["name"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (c,) = pod["containers"]
    assert c["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "512Mi"},
    }
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8080}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    terms = pod["affinity"]["podAntiAffinity"]
    anti = terms.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
        t["podAffinityTerm"]
        for t in terms.get("preferredDuringSchedulingIgnoredDuringExecution", [])
    ]
    assert anti and all(t["topologyKey"] == "kubernetes.io/hostname" for t in anti)
    assert all(
        t["labelSelector"]["matchLabels"].items()
        <= spec["template"]["metadata"]["labels"].items()
        for t in anti
    )


def test_deployment_security_context(rendered: list[Obj]) -> None:
    pod = find(rendered, "Deployment")["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert isinstance(psc["runAsUser"], int) and psc["runAsUser"] > 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert sc.get("privileged", False) is False
    # The read-only root needs a writable /tmp.
    mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in vols[mounts["/tmp"]]


def test_deployment_mounts_the_generated_config(rendered: list[Obj]) -> None:
    pod = find(rendered, "Deployment")["spec"]["template"]["spec"]
    cm = find(rendered, "ConfigMap", "wdrf-controller-config")
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]  # hash suffix followed
    (c,) = pod["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert mount["readOnly"] is True
    config_args = [a for a in c["args"] if a.startswith("--config=")]
    assert config_args == [f"--config={mount['mountPath']}/config.yaml"]
    assert set(cm["data"]) == {"config.yaml"}


def test_manifest_config_is_a_copy_of_the_top_level_config(rendered: list[Obj]) -> None:
    top = ROOT / "config.yaml"
    assert top.exists(), "config.yaml at the repository top is the source of truth"
    copy = MANIFESTS / "config.yaml"
    assert copy.read_bytes() == top.read_bytes(), (
        "manifests/config.yaml differs from config.yaml: cp config.yaml manifests/config.yaml"
    )
    cm = find(rendered, "ConfigMap", "wdrf-controller-config")
    assert cm["data"]["config.yaml"] == top.read_text(encoding="utf-8")


def test_shipped_config_loads_without_errors(tmp_path: Path) -> None:
    from controller.config import load_settings

    settings = load_settings(MANIFESTS / "config.yaml", env={}, config_required=True)
    assert settings.controller_namespace == NAMESPACE


def test_service_and_pdb_select_the_controller_pods(rendered: list[Obj]) -> None:
    labels = find(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    svc = find(rendered, "Service")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    pdb = find(rendered, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1  # with 2 replicas: one may be drained at a time


# ---------------------------------------------------------------------------------------------
# Admission policy (its behaviour is proven on the real apiserver in the plane test)


def test_admission_policy_guards_jobs_and_workloads(rendered: list[Obj]) -> None:
    vap = find(rendered, "ValidatingAdmissionPolicy")
    assert vap["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert vap["spec"]["failurePolicy"] == "Fail"
    rules = {
        (g, r): set(rule["operations"])
        for rule in vap["spec"]["matchConstraints"]["resourceRules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert rules == {
        ("batch", "jobs"): {"CREATE", "UPDATE"},
        ("kueue.x-k8s.io", "workloads"): {"CREATE", "UPDATE"},
    }
    text = yaml.safe_dump(vap["spec"]["validations"])
    for key in ("approved", "urgent", "priority-override", "base-priority", "applied-priority"):
        assert f"wdrf.x-k8s.io/{key}" in text
    # The controller-owned keys are in the list of guarded keys, next to each other.
    changed = next(v["expression"] for v in vap["spec"]["variables"] if v["name"] == "changed")
    for key in ("wdrf.x-k8s.io/base-priority", "wdrf.x-k8s.io/applied-priority",
                "kueue.x-k8s.io/priority-boost"):
        assert f"'{key}'" in changed, key


def test_admission_binding_and_params(rendered: list[Obj]) -> None:
    vap = find(rendered, "ValidatingAdmissionPolicy")
    binding = find(rendered, "ValidatingAdmissionPolicyBinding")
    params = find(rendered, "ConfigMap", "wdrf-admission-params")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    ref = binding["spec"]["paramRef"]
    assert ref["name"] == params["metadata"]["name"]  # not a generated (hashed) name
    assert ref["namespace"] == params["metadata"]["namespace"] == NAMESPACE
    assert ref["parameterNotFoundAction"] == "Deny"
    assert vap["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    data = params["data"]
    assert "wdrf:team-leads" in data["teamLeadGroups"].split(",")
    assert "wdrf:admins" in data["adminGroups"].split(",")
    exempt = data["exemptUsers"].split(",")
    assert SA_USER in exempt
    assert "system:serviceaccount:kueue-system:kueue-controller-manager" in exempt
