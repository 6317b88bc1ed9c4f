"""Offline checks of manifests/ and examples/: they render, validate against the Kubernetes 1.36
OpenAPI schemas (kubernetes-validate), grant exactly the RBAC the controller needs, and run the
controller locked down. Kueue objects are validated against Kueue's real CRD schemas on the test
control plane instead (tests/plane/test_manifests_plane.py): kubernetes-validate has no CRDs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from controller.config import Settings, load_settings, with_overrides
from controller.domain import CLASS_PRIORITY_CLASSES, OWNER_KINDS, PriorityClass
from tests.support.kube import render_kustomize
from tests.support.manifests import (
    NamedRule,
    Rule,
    all_features,
    expected_cluster_rules,
    expected_namespace_rules,
    with_component,
    with_history_component,
)

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
HISTORY_COMPONENT = MANIFESTS / "components" / "usage-history"
EXAMPLES = ROOT / "examples"
K8S_VERSION = "1.36.0"  # the test plane's Kubernetes minor; kubernetes-validate ships 1.36.0
NAMESPACE = "kueue-system"
SA_USER = "system:serviceaccount:kueue-system:wdrf-controller"

Obj = dict[str, Any]

def load_yaml_dir(path: Path) -> list[tuple[str, Obj]]:
    docs: list[tuple[str, Obj]] = []
    for f in sorted(path.glob("*.yaml")):
        for i, d in enumerate(yaml.safe_load_all(f.read_text(encoding="utf-8"))):
            if d:
                docs.append((f"{f.relative_to(ROOT)}#{i}", d))
    return docs


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return render_kustomize(MANIFESTS)


@pytest.fixture(scope="module")
def rendered_with_history(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render_kustomize(with_history_component(tmp_path_factory.mktemp("history")))


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
    if obj["kind"] == "WorkloadPriorityClass":  # a Kueue CRD: the plane tests apply it
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2", obj
        assert set(obj) <= {"apiVersion", "kind", "metadata", "value", "description"}, obj
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ---------------------------------------------------------------------------------------------
# Rendering and schema validation


def test_kustomize_renders_expected_objects(rendered: list[Obj]) -> None:
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in rendered)
    expected_prefixes = [
        "ClusterRole/wdrf-controller",
        "ClusterRole/wdrf-metrics-reader",
        "ClusterRole/wdrf-why-reader",
        "ClusterRoleBinding/wdrf-controller",
        "ConfigMap/wdrf-admission-params",
        "ConfigMap/wdrf-controller-config-",  # generated, with a content hash
        "Deployment/wdrf-controller",
        "MutatingAdmissionPolicy/wdrf-class-priority",
        "MutatingAdmissionPolicy/wdrf-submitted-by",
        "MutatingAdmissionPolicyBinding/wdrf-class-priority",
        "MutatingAdmissionPolicyBinding/wdrf-submitted-by",
        "NetworkPolicy/wdrf-controller",
        "PodDisruptionBudget/wdrf-controller",
        "Role/wdrf-controller",
        "RoleBinding/wdrf-controller",
        "Service/wdrf-controller-metrics",
        "ServiceAccount/wdrf-controller",
        "ValidatingAdmissionPolicy/wdrf-admission-params-guard",
        "ValidatingAdmissionPolicy/wdrf-class-annotations",
        "ValidatingAdmissionPolicy/wdrf-controller-configmaps",
        "ValidatingAdmissionPolicy/wdrf-controller-writes",
        "ValidatingAdmissionPolicyBinding/wdrf-admission-params-guard",
        "ValidatingAdmissionPolicyBinding/wdrf-class-annotations",
        "ValidatingAdmissionPolicyBinding/wdrf-controller-configmaps",
        "ValidatingAdmissionPolicyBinding/wdrf-controller-writes",
        "WorkloadPriorityClass/wdrf-approved",
        "WorkloadPriorityClass/wdrf-normal",
        "WorkloadPriorityClass/wdrf-urgent",
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
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "WorkloadPriorityClass",
    }
    for o in rendered:
        ns = o["metadata"].get("namespace")
        if o["kind"] in cluster_scoped:
            assert ns is None, o["metadata"]
        else:
            assert ns == NAMESPACE, o["metadata"]


def test_every_rendered_manifest_validates(rendered: list[Obj],
                                           rendered_with_history: list[Obj]) -> None:
    for o in rendered + rendered_with_history:
        k8s_validate(o)
    for o in render_kustomize(MANIFESTS / "agent"):
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
    objs = [o for o in render_kustomize(MANIFESTS / "overlays" / "prometheus")
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
    objs = render_kustomize(MANIFESTS / "admission")
    assert sorted(o["kind"] for o in objs) == [
        "ConfigMap",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "WorkloadPriorityClass",
        "WorkloadPriorityClass",
        "WorkloadPriorityClass",
    ]
    for o in objs:
        k8s_validate(o)


# ---------------------------------------------------------------------------------------------
# Examples


def example_docs() -> list[tuple[str, Obj]]:
    recommended = [(w, d) for w, d in load_yaml_dir(EXAMPLES / "recommended")
                   if d["kind"] != "Configuration"]  # Kueue's manager config: not an object
    return load_yaml_dir(EXAMPLES / "queues") + load_yaml_dir(EXAMPLES / "jobs") + recommended


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
    role = find(rendered, "ClusterRole", "wdrf-controller")
    triples = list(rule_triples(role["rules"]))
    assert len(triples) == len(set(triples)), "duplicate grants"
    want = expected_cluster_rules()
    assert set(triples) == want, (set(triples) - want, want - set(triples))
    for r in role["rules"]:
        assert "resourceNames" not in r
        assert "nonResourceURLs" not in r


def _namespaced_grants(objs: list[Obj]) -> list[NamedRule]:
    out: list[NamedRule] = []
    for role in (o for o in objs if o["kind"] == "Role"):
        assert role["metadata"]["namespace"] == NAMESPACE
        out += named_rules(role["rules"])
    return out


def test_namespaced_role_is_exactly_lease_and_kueue_config_by_name(rendered: list[Obj]) -> None:
    """Without the usage history (the default): the Lease and Kueue's config, each by name; no
    ConfigMap write of any kind."""
    got = _namespaced_grants(rendered)
    assert len(got) == len(set(got)), "duplicate grants"
    want = expected_namespace_rules(history=False)
    assert set(got) == want, (set(got) - want, want - set(got))
    assert not [r for r in got if r[1] == "configmaps" and r[2] != "get"], got
    # Nothing there is listed, watched, patched or deleted; Deployments are only read; every
    # rule but "create" names its object.
    for g, res, v, name in got:
        assert v in ("get", "create", "update"), (g, res, v)
        assert res != "deployments" or v == "get"
        assert (name is None) == (v == "create"), (g, res, v, name)


def test_usage_history_component_adds_exactly_the_history_configmap(
        rendered: list[Obj], rendered_with_history: list[Obj]) -> None:
    got = _namespaced_grants(rendered_with_history)
    assert len(got) == len(set(got)), "duplicate grants"
    want = expected_namespace_rules(history=True)
    assert set(got) == want, (set(got) - want, want - set(got))
    added = set(got) - set(_namespaced_grants(rendered))
    assert added == {("", "configmaps", "get", "wdrf-usage-history"),
                     ("", "configmaps", "update", "wdrf-usage-history"),
                     ("", "configmaps", "create", None)}, added
    binding = find(rendered_with_history, "RoleBinding", "wdrf-controller-usage-history")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "wdrf-controller", "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == "wdrf-controller-usage-history"
    for o in rendered_with_history:
        k8s_validate(o)


def test_kueue_system_names_match_the_controller_and_the_writes_policy(
        rendered_with_history: list[Obj]) -> None:
    """The names in resourceNames are the ones the controller uses (LEASE_NAME,
    HISTORY_CONFIG_MAP defaults, Kueue's objects) and the ones controller-writes.yaml lets it
    create."""
    from controller.live.discovery import KUEUE_CONFIG_MAP, KUEUE_DEPLOYMENT

    s = Settings()
    names = {n for _g, _r, _v, n in _namespaced_grants(rendered_with_history) if n}
    assert names == {s.lease_name, s.history_config_map, KUEUE_CONFIG_MAP, KUEUE_DEPLOYMENT}
    vap = find(rendered_with_history, "ValidatingAdmissionPolicy", "wdrf-controller-writes")
    text = yaml.safe_dump(vap["spec"]["validations"])
    assert f"'{s.lease_name}'" in text and f"'{s.history_config_map}'" in text


def test_no_wildcards_and_no_secrets_anywhere(rendered_with_history: list[Obj]) -> None:
    for role in (o for o in rendered_with_history if o["kind"] in ("ClusterRole", "Role")):
        kind = role["kind"]
        for g, res, v in rule_triples(role["rules"]):
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
            "name": find(rendered, role_kind, "wdrf-controller")["metadata"]["name"],
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


def test_admission_policy_guards_every_object_a_priority_or_team_is_read_from(
        rendered: list[Obj]) -> None:
    vap = find(rendered, "ValidatingAdmissionPolicy", "wdrf-class-annotations")
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
        ("batch", "jobs/status"): {"CREATE", "UPDATE"},  # S4: metadata persists through status
        ("batch", "cronjobs"): {"CREATE", "UPDATE"},  # S9: their job template
        ("kueue.x-k8s.io", "workloads"): {"CREATE", "UPDATE"},
        ("kueue.x-k8s.io", "localqueues"): {"CREATE", "UPDATE"},
        ("", "pods"): {"CREATE", "UPDATE"},
        ("apps", "deployments"): {"CREATE", "UPDATE"},  # pod templates of Kueue's
        ("apps", "statefulsets"): {"CREATE", "UPDATE"},  # pod-based integrations
        ("apps", "replicasets"): {"CREATE", "UPDATE"},
        # every other Kueue-integrated kind the controller reads a class from
        **{(key.partition("/")[0], plural): {"CREATE", "UPDATE"}
           for key, plural in OWNER_KINDS.items()},
    }
    text = yaml.safe_dump(vap["spec"])
    for key in ("approved", "urgent", "priority-override", "base-priority", "applied-priority",
                "submitted-by"):
        assert f"wdrf.x-k8s.io/{key}" in text
    for what in ("kueue.x-k8s.io/priority-class", "priorityClassName", "priorityClassRef",
                 "spec.priority", "teamLabelKey", "allowedPriorityClasses", "quantity("):
        assert what in text, what
    # Kueue, the controller and the CronJob controller are exempt in the policy itself (S7),
    # not only in the params.
    exempt = vap["spec"]["matchConditions"][0]["expression"]
    for user in (SA_USER, "system:serviceaccount:kueue-system:kueue-controller-manager",
                 "system:serviceaccount:kube-system:cronjob-controller"):
        assert f"'{user}'" in exempt, user


def test_admission_binding_and_params(rendered: list[Obj]) -> None:
    vap = find(rendered, "ValidatingAdmissionPolicy", "wdrf-class-annotations")
    binding = find(rendered, "ValidatingAdmissionPolicyBinding", "wdrf-class-annotations")
    params = find(rendered, "ConfigMap", "wdrf-admission-params")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    ref = binding["spec"]["paramRef"]
    assert ref["name"] == params["metadata"]["name"]  # not a generated (hashed) name
    assert ref["namespace"] == params["metadata"]["namespace"] == NAMESPACE
    # S7: the apiserver resolves params before matchConditions; Deny would lock out Kueue.
    assert ref["parameterNotFoundAction"] == "Allow"
    assert vap["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    data = params["data"]
    assert data["teamLeadGroupPrefix"] == "wdrf:team-lead:"
    assert data["teamLeadGroups"] == "" and data["allowSelfApproval"] == "false"
    assert "wdrf:admins" in data["adminGroups"].split(",")
    assert data["allowedPriorityClasses"] == "" and data["teamLabelKey"] == "wdrf.x-k8s.io/team"
    assert data["exemptUsers"] == ""
    assert Settings().team_label_key == data["teamLabelKey"]


def test_admission_params_are_guarded(rendered: list[Obj]) -> None:
    guard = find(rendered, "ValidatingAdmissionPolicy", "wdrf-admission-params-guard")
    ops = {o for r in guard["spec"]["matchConstraints"]["resourceRules"] for o in r["operations"]}
    assert ops == {"CREATE", "UPDATE", "DELETE"}
    cond = guard["spec"]["matchConditions"][0]["expression"]
    assert "'kueue-system'" in cond and "'wdrf-admission-params'" in cond
    assert "system:authenticated" in yaml.safe_dump(guard["spec"]["validations"])
    binding = find(rendered, "ValidatingAdmissionPolicyBinding", "wdrf-admission-params-guard")
    assert binding["spec"]["validationActions"] == ["Deny"]
    # The controller's settings and usage history: as guarded (adminGroups from the params).
    cms = find(rendered, "ValidatingAdmissionPolicy", "wdrf-controller-configmaps")
    cond = cms["spec"]["matchConditions"][0]["expression"]
    config = find(rendered, "ConfigMap", "wdrf-controller-config")["metadata"]["name"]
    assert "'wdrf-controller-config'" in cond and "'wdrf-usage-history'" in cond
    assert config.startswith("wdrf-controller-config") and Settings().history_config_map == \
        "wdrf-usage-history"
    binding = find(rendered, "ValidatingAdmissionPolicyBinding", "wdrf-controller-configmaps")
    assert binding["spec"]["paramRef"]["name"] == "wdrf-admission-params"


def test_submitter_stamp_covers_jobs_and_cronjob_templates(rendered: list[Obj]) -> None:
    map_ = find(rendered, "MutatingAdmissionPolicy", "wdrf-submitted-by")
    assert map_["apiVersion"] == "admissionregistration.k8s.io/v1"
    (rule,) = map_["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"jobs", "cronjobs"} and rule["operations"] == ["CREATE"]
    text = yaml.safe_dump(map_["spec"]["mutations"])
    assert "jobTemplate" in text and "wdrf.x-k8s.io/submitted-by" in text
    assert find(rendered, "MutatingAdmissionPolicyBinding", "wdrf-submitted-by")["spec"][
        "policyName"] == "wdrf-submitted-by"


def test_class_stand_ins_are_the_names_the_controller_reads_with_the_values_it_prints(
    rendered: list[Obj], tmp_path: Path,
) -> None:
    """The shipped WorkloadPriorityClasses are exactly CLASS_PRIORITY_CLASSES (the names the
    controller counts as base 0) and their values are what the shipped config gives
    (`stand_in_value`, printed by the dry run); the policy stamps them on Jobs and CronJob
    templates at creation only, and the class policy accepts exactly those names besides the
    allowed classes."""
    settings = load_settings(MANIFESTS / "config.yaml", env={})
    wpcs = {o["metadata"]["name"]: o["value"] for o in rendered
            if o["kind"] == "WorkloadPriorityClass"}
    assert set(wpcs) == CLASS_PRIORITY_CLASSES
    assert wpcs == {f"wdrf-{c.value}": settings.stand_in_value(c) for c in PriorityClass}
    assert wpcs["wdrf-urgent"] > settings.guard(PriorityClass.APPROVED)
    assert wpcs["wdrf-urgent"] > settings.guard(PriorityClass.NORMAL)
    assert wpcs["wdrf-approved"] == wpcs["wdrf-normal"]  # APPROVED_PREEMPTS_NORMAL false
    map_ = find(rendered, "MutatingAdmissionPolicy", "wdrf-class-priority")
    rules = map_["spec"]["matchConstraints"]["resourceRules"]
    assert all(r["operations"] == ["CREATE"] for r in rules)
    stamped = {(g, res) for r in rules for g in r["apiGroups"] for res in r["resources"]}
    owners = {(key.split("/")[0], res) for key, res in OWNER_KINDS.items()}
    assert stamped == {("batch", "jobs"), ("batch", "cronjobs")} | owners, stamped
    text = yaml.safe_dump(map_["spec"])
    for name in CLASS_PRIORITY_CLASSES:
        assert f"'{name}'" in text
    assert find(rendered, "MutatingAdmissionPolicyBinding", "wdrf-class-priority")["spec"][
        "policyName"] == "wdrf-class-priority"
    vap = yaml.safe_dump(find(rendered, "ValidatingAdmissionPolicy", "wdrf-class-annotations"))
    for name in CLASS_PRIORITY_CLASSES:
        assert f"'{name}'" in vap


@pytest.mark.parametrize(("env", "approved"), [
    ({}, 0),
    ({"APPROVED_PREEMPTS_NORMAL": "true", "PRIORITY_CLASS_UNIT": "30000"}, 3_000_000),
    ({"APPROVED_PREEMPTS_NORMAL": "true", "PRIORITY_CLASS_UNIT": "30000",
      "APPROVED_SCOPE": "team"}, 0),
])
def test_the_approved_stand_in_rises_above_normal_only_where_approved_may_preempt_normal(
    env: dict[str, str], approved: int,
) -> None:
    settings = load_settings(MANIFESTS / "config.yaml", env=env)
    assert settings.stand_in_value(PriorityClass.APPROVED) == approved
    assert settings.stand_in_value(PriorityClass.NORMAL) == 0
    if approved:
        assert approved > settings.guard(PriorityClass.NORMAL)


def test_controller_writes_policy_narrows_every_cluster_wide_patch(rendered: list[Obj]) -> None:
    """Every resource the ClusterRole lets the controller patch is narrowed by the
    controller-writes policy, for the controller's ServiceAccount only."""
    vap = find(rendered, "ValidatingAdmissionPolicy", "wdrf-controller-writes")
    assert vap["spec"]["failurePolicy"] == "Fail"
    matched = {(g, r) for rule in vap["spec"]["matchConstraints"]["resourceRules"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    patched = {(g, r) for g, r, v in expected_cluster_rules() if v in ("patch", "update")}
    assert patched <= matched, patched - matched
    assert {("coordination.k8s.io", "leases"), ("", "configmaps")} <= matched  # create by name
    assert ("", "events") in matched  # only in its own name
    cond = vap["spec"]["matchConditions"][0]["expression"]
    assert ":wdrf-controller'" in cond
    assert "paramKind" not in vap["spec"]  # no params: nothing to delete to turn it off
    b = find(rendered, "ValidatingAdmissionPolicyBinding", "wdrf-controller-writes")
    assert b["spec"]["validationActions"] == ["Deny"] and "paramRef" not in b["spec"]


def test_secure_metrics_component_moves_metrics_to_https_and_keeps_probes_plain(
        tmp_path: Path, rendered: list[Obj]) -> None:
    """overlays/secure-metrics (a Component): /metrics on port https (8443) with the TLS Secret
    mounted, HEALTH_PORT 8080 = the probes' port "http"; the Service and the NetworkPolicy
    expose only https; the controller may create TokenReviews and SubjectAccessReviews."""
    objs = render_kustomize(with_component(tmp_path, MANIFESTS / "overlays" / "secure-metrics"))
    for o in objs:
        k8s_validate(o)
    pod = find(objs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["METRICS_PORT"] == "8443" and env["HEALTH_PORT"] == "8080"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8080, "https": 8443}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    tls_dir = env["METRICS_CERT_FILE"].rsplit("/", 1)[0]
    assert env["METRICS_KEY_FILE"].startswith(tls_dir) and tls_dir in mounts
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols[mounts[tls_dir]]["secret"]["secretName"] == "wdrf-controller-metrics-tls"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe in c:
            assert c[probe]["httpGet"]["port"] == "http", probe  # plain health port
    svc = find(objs, "Service")
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(8443, "https")]
    (rule,) = find(objs, "NetworkPolicy")["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == ["https"]
    auth = find(objs, "ClusterRole", "wdrf-controller-metrics-auth")
    assert set(rule_triples(auth["rules"])) == {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create")}
    base = [o for o in objs if o["kind"] == "ClusterRole"
            and o["metadata"]["name"] == "wdrf-controller"]
    assert base == [find(rendered, "ClusterRole", "wdrf-controller")]  # unchanged


def test_metrics_reader_grants_only_get_metrics(rendered: list[Obj]) -> None:
    reader = find(rendered, "ClusterRole", "wdrf-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_why_reader_grants_exactly_what_why_reads(rendered: list[Obj]) -> None:
    """The users' ClusterRole for `why` (bound per namespace) is exactly why's reads: no list
    of LocalQueues, nothing cluster-wide (no clusterqueues/pendingworkloads), no writes."""
    from controller.why import READER_PERMISSIONS

    reader = find(rendered, "ClusterRole", "wdrf-why-reader")
    assert set(rule_triples(reader["rules"])) == set(READER_PERMISSIONS)
    assert not [b for b in rendered if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and b["roleRef"]["name"] == "wdrf-why-reader"]  # users bind it per namespace


def test_network_policies_select_the_pods_and_limit_ingress_to_the_metrics_port(
        rendered: list[Obj]) -> None:
    agent = render_kustomize(MANIFESTS / "agent")
    for objs, workload_kind, port in ((rendered, "Deployment", "http"),
                                      (agent, "DaemonSet", "metrics")):
        np = find(objs, "NetworkPolicy")
        labels = find(objs, workload_kind)["spec"]["template"]["metadata"]["labels"]
        assert np["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        assert set(np["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        (rule,) = np["spec"]["ingress"]
        assert [p["port"] for p in rule["ports"]] == [port]
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
            "wdrf.x-k8s.io/metrics-scraper": "true"}}}]
        (egress,) = np["spec"]["egress"]
        assert "to" not in egress and {p["port"] for p in egress["ports"]} == {443, 6443}


def test_secure_metrics_rbac_is_exactly_what_the_controller_then_uses() -> None:
    """With METRICS_CERT_FILE the controller adds TokenReview and SubjectAccessReview create
    (controller/live/rbac.py); overlays/secure-metrics grants exactly those."""
    from controller.live.rbac import permissions

    plain = {(p.group, p.resource, p.verb) for p in permissions(all_features())}
    secure = {(p.group, p.resource, p.verb) for p in permissions(with_overrides(
        all_features(), metrics_cert_file="/tls/tls.crt", metrics_key_file="/tls/tls.key"))}
    docs = yaml.safe_load_all((MANIFESTS / "overlays" / "secure-metrics" / "rbac.yaml")
                              .read_text(encoding="utf-8"))
    granted = {(g, r, v) for d in docs if d and d["kind"] == "ClusterRole"
               for rule in d["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert secure - plain == granted == {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create")}


def test_multikueue_worker_component_mounts_the_manager_kubeconfig(
        tmp_path: Path, rendered: list[Obj]) -> None:
    """overlays/multikueue-worker (a Component): the manager's kubeconfig from the Secret
    wdrf-multikueue-manager mounted read-only where MULTIKUEUE_MANAGER_KUBECONFIG points,
    boost mode, and nothing else changed; the settings load from the shipped config with it."""
    objs = render_kustomize(with_component(tmp_path, MANIFESTS / "overlays" / "multikueue-worker"))
    for o in objs:
        k8s_validate(o)
    pod = find(objs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    where, _, file = env["MULTIKUEUE_MANAGER_KUBECONFIG"].rpartition("/")
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == where)
    assert mount.get("readOnly") is True
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert vol["secret"]["secretName"] == "wdrf-multikueue-manager"
    assert vol["secret"]["items"] == [{"key": "kubeconfig", "path": file}]
    s = load_settings(MANIFESTS / "config.yaml", env={k: v for k, v in env.items() if v})
    assert s.multikueue_manager_kubeconfig == env["MULTIKUEUE_MANAGER_KUBECONFIG"]
    assert s.priority_mode.value == "boost"
    base = {(o["kind"], o["metadata"]["name"]): o for o in rendered}
    changed = [k for o in objs if base.get(k := (o["kind"], o["metadata"]["name"])) != o]
    assert changed == [("Deployment", "wdrf-controller")], changed


def test_multikueue_manager_reader_grants_exactly_what_the_workers_read_there() -> None:
    """manifests/multikueue-manager (applied on the manager): a ServiceAccount, its token and
    a ClusterRole of exactly the controller's reads on the manager (list and watch of
    Workloads and Jobs, controller.live.rbac.manager_permissions), no write."""
    from controller.live.rbac import manager_permissions

    objs = render_kustomize(MANIFESTS / "multikueue-manager")
    for o in objs:
        k8s_validate(o)
    assert sorted(o["kind"] for o in objs) == [
        "ClusterRole", "ClusterRoleBinding", "Secret", "ServiceAccount"]
    sa = find(objs, "ServiceAccount")
    assert sa["metadata"]["namespace"] == NAMESPACE
    reader = find(objs, "ClusterRole", "wdrf-multikueue-reader")
    used = manager_permissions(with_overrides(
        all_features(), multikueue_manager_kubeconfig="/etc/wdrf/manager/kubeconfig"))
    assert set(rule_triples(reader["rules"])) == {(p.group, p.resource, p.verb) for p in used}
    assert not [p for p in used if p.verb not in ("get", "list", "watch")]
    assert not manager_permissions(all_features())  # nothing without the setting
    b = find(objs, "ClusterRoleBinding")
    assert b["roleRef"]["name"] == reader["metadata"]["name"]
    assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                              "namespace": NAMESPACE}]
    token = find(objs, "Secret")
    assert token["type"] == "kubernetes.io/service-account-token" and "data" not in token
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": sa["metadata"]["name"]}
