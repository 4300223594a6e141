"""infrastructure-components (kustomize build config/default): one Namespace, every namespaced object in it,
the provider label everywhere, the manager container and the flags `capi-gpu run` must accept, every
generated CRD and no other (none shared with other operators), leader election by a Lease, bindings that name the one ServiceAccount, no clusterctl
variable outside the documented two."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import config_helpers as h
import yaml

from capi_gpu import domain
from capi_gpu.cli import build_parser, run

NAMESPACE = "capi-gpu-system"
SERVICE_ACCOUNT = "capi-gpu-controller-manager"
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
}
COMPONENT_VARIABLES = {"CAPI_GPU_WATCH_FILTER", "CAPI_GPU_WATCH_NAMESPACE"}


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def manager_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = of_kind(docs, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (manager,) = [c for c in containers if c["name"] == "manager"]
    return dict(manager)


def test_exactly_one_namespace_and_everything_namespaced_is_in_it(components: list[dict[str, Any]]) -> None:
    namespaces = of_kind(components, "Namespace")
    assert [n["metadata"]["name"] for n in namespaces] == [NAMESPACE]
    for doc in components:
        where = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert where is None, f"{doc['kind']}/{doc['metadata']['name']} is cluster-scoped"
        else:
            assert where == NAMESPACE, f"{doc['kind']}/{doc['metadata']['name']} in {where!r}"


def test_every_object_carries_the_provider_label(components: list[dict[str, Any]]) -> None:
    assert domain.PROVIDER_NAME == "infrastructure-hetzner-gpu"
    unlabelled = [
        f"{d['kind']}/{d['metadata']['name']}"
        for d in components
        if (d["metadata"].get("labels") or {}).get(domain.PROVIDER_LABEL) != domain.PROVIDER_NAME
    ]
    assert not unlabelled


def test_selectors_do_not_depend_on_the_provider_label(components: list[dict[str, Any]]) -> None:
    (deployment,) = of_kind(components, "Deployment")
    assert domain.PROVIDER_LABEL not in deployment["spec"]["selector"]["matchLabels"]


def test_every_generated_crd_is_included_unchanged(components: list[dict[str, Any]]) -> None:
    rendered = {d["metadata"]["name"]: d for d in of_kind(components, "CustomResourceDefinition")}
    generated = sorted((h.REPO / "crds").glob(f"{domain.GROUP}_*.yaml"))
    assert generated
    for path in generated:
        crd = yaml.safe_load(path.read_text())
        name = crd["metadata"]["name"]
        assert name in rendered, f"{path.name} missing from config/crd"
        assert rendered[name]["spec"] == crd["spec"]
        assert rendered[name]["metadata"]["labels"][domain.CONTRACT_LABEL] == domain.VERSION


def test_no_crd_but_ours(components: list[dict[str, Any]]) -> None:
    # `clusterctl delete --include-crd` deletes every CRD in the components: one shared with other
    # operators (kopf's kopf.dev peering CRDs were) would be deleted under them.
    crds = of_kind(components, "CustomResourceDefinition")
    assert {d["spec"]["group"] for d in crds} == {domain.GROUP}
    assert not [d for d in components if d["apiVersion"].startswith("kopf.dev/")]


def test_crd_kustomization_lists_exactly_the_generated_files() -> None:
    doc = yaml.safe_load((h.CONFIG / "crd" / "kustomization.yaml").read_text())
    listed = {Path(r).name for r in doc["resources"] if r.startswith("../../crds/")}
    assert listed == {p.name for p in (h.REPO / "crds").glob("*.yaml")}


def test_manager_deployment(components: list[dict[str, Any]]) -> None:
    manager = manager_container(components)
    assert manager["image"] == "ghcr.io/capi-gpu/capi-gpu:dev"
    args = manager["args"]
    assert args[0] == "run"
    assert "--namespace=${CAPI_GPU_WATCH_NAMESPACE:=*}" in args
    assert "--watch-filter=${CAPI_GPU_WATCH_FILTER:=*}" in args
    assert "--leader-elect" in args
    assert not [a for a in args if a.startswith(("--peering", "--priority"))]
    ports = {p["name"]: p["containerPort"] for p in manager["ports"]}
    assert ports == {"healthz": 8080, "metrics": 9090, "webhook-server": 9443}
    assert "--liveness=http://0.0.0.0:8080/healthz" in args
    # The gate plugin runs the operator's image: the arg names the env var kustomize fills from `image`.
    assert "--gate-plugin-image=$(CAPI_GPU_IMAGE)" in args
    assert {"name": "CAPI_GPU_IMAGE", "value": manager["image"]} in manager["env"]
    assert manager["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    # Ready only while leading (capi_gpu/probes.py): the webhook Service reaches the leader alone.
    assert manager["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "healthz"}
    sc = manager["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"] for m in manager["volumeMounts"]}
    assert {"/tmp", "/var/lib/capi-gpu/artifacts"} <= mounts
    (deployment,) = of_kind(components, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT


def test_capi_gpu_run_accepts_the_deployment_args(components: list[dict[str, Any]]) -> None:
    # As clusterctl renders them with the variables unset (their defaults): "*" means all.
    args = [re.sub(r"\$\{[A-Z_]+:=([^}]*)\}", r"\1", a) for a in manager_container(components)["args"]]
    parsed = build_parser().parse_args(args)
    assert run.every(parsed.namespace) is None
    assert run.every(parsed.watch_filter) is None
    assert parsed.leader_elect is True
    assert parsed.metrics_port == 9090
    assert parsed.artifacts_dir == Path("/var/lib/capi-gpu/artifacts")
    sharded = build_parser().parse_args([*args, "--namespace=team-a", "--watch-filter=shard-1"])
    assert (run.every(sharded.namespace), run.every(sharded.watch_filter)) == ("team-a", "shard-1")


def test_component_variables_all_have_defaults(components: list[dict[str, Any]]) -> None:
    # clusterctl treats an empty default as no default: `clusterctl init` would then demand the variable.
    for name, defaults in h.template_variables(yaml.safe_dump_all(components)).items():
        assert None not in defaults and "" not in defaults, name


def test_only_documented_variables_in_components(components: list[dict[str, Any]]) -> None:
    text = yaml.safe_dump_all(components)
    assert set(h.template_variables(text)) == COMPONENT_VARIABLES
    assert not h.BARE_VAR_RE.search(h.VAR_RE.sub("", text))
    documented = h.docs_variables("### Component variables")
    assert set(documented) == COMPONENT_VARIABLES


def test_every_binding_names_the_manager_service_account(components: list[dict[str, Any]]) -> None:
    (sa,) = of_kind(components, "ServiceAccount")
    assert sa["metadata"]["name"] == SERVICE_ACCOUNT
    roles = {r["metadata"]["name"] for r in of_kind(components, "ClusterRole") + of_kind(components, "Role")}
    bindings = of_kind(components, "ClusterRoleBinding") + of_kind(components, "RoleBinding")
    assert bindings
    bound = set()
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
        assert b["roleRef"]["name"] in roles
        bound.add(b["roleRef"]["name"])
    # The aggregated role is CAPI core's; the readiness role is for a workload cluster's gate identity.
    assert roles - bound == {"capi-gpu-aggregated-manager-role", "capi-gpu-readiness"}
    assert bound == {"capi-gpu-manager-role", "capi-gpu-manager-secrets-role", "capi-gpu-leader-election-role"}


def test_the_leader_election_lease_is_granted_where_the_manager_looks(components: list[dict[str, Any]]) -> None:
    # capi_gpu/leader.py reads with get, writes with create and replace (update), in the pod's namespace.
    parsed = build_parser().parse_args(["run", "--leader-elect"])
    (role,) = [r for r in of_kind(components, "Role") if r["metadata"]["name"] == "capi-gpu-leader-election-role"]
    assert role["metadata"]["namespace"] == NAMESPACE
    (rule,) = role["rules"]
    assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert set(rule["verbs"]) == {"get", "create", "update"}
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in manager_container(components)["env"]
        if "valueFrom" in e
    }
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert parsed.leader_election_namespace == ""  # so $POD_NAMESPACE decides
