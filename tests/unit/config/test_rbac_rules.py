"""RBAC against the code: every Kubernetes call the controllers make, and every resource a kopf handler
watches, is granted to the manager's ServiceAccount; nothing is a wildcard; every rule says why; the
gate driver's claim-status rule is scoped to our driver; CAPI core gets CRUD through aggregation."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import config_helpers as h
import yaml

from capi_gpu import domain, kube
from capi_gpu.kube import Res

SA = "capi-gpu-controller-manager"
# Kube / AsyncKube method -> RBAC verb(s).
VERBS = {
    "get": ["get"],
    "get_or_none": ["get"],
    "list": ["list"],
    "watch": ["watch"],
    "create": ["create"],
    "patch": ["patch"],
    "apply_patch": ["patch"],  # server-side apply is a PATCH
    "replace": ["update"],
    "delete": ["delete"],
    "apply": ["create", "patch"],
}
# kopf: every handled resource is listed and watched; daemons and on.delete/on.update handlers patch the
# object (finalizer, progress annotations).
KOPF_PATCHES = {"daemon", "delete", "update", "create", "resume", "timer", "field"}
SCANNED = [h.REPO / "capi_gpu" / d for d in ("controllers", "readiness", "autoscaler")]

Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
OUR_PLURALS = {
    yaml.safe_load(p.read_text())["spec"]["names"]["plural"] for p in (h.REPO / "crds").glob(f"{domain.GROUP}_*")
}


def granted(components: list[dict[str, Any]]) -> set[Grant]:
    bound = {
        b["roleRef"]["name"]
        for b in components
        if b["kind"] == "ClusterRoleBinding" and any(s["name"] == SA for s in b["subjects"])
    }
    out: set[Grant] = set()
    for role in components:
        if role["kind"] == "ClusterRole" and role["metadata"]["name"] in bound:
            for rule in role["rules"]:
                if rule.get("resourceNames"):
                    continue  # scoped to named objects: never enough for a general call
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        out |= {(g, r, v) for v in rule["verbs"]}
    return out


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(h.REPO).with_suffix("").parts)


def _is_kube(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        if node.attr in ("kube", "sync"):
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id == "kube"


def _literal(node: ast.expr, module: Any) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return getattr(module, node.id, None)
    if (  # ours("hetznergpuclusters") written at the call site
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "ours"
        and isinstance(node.args[0], ast.Constant)
    ):
        return kube.ours(node.args[0].value)
    return None


def kube_calls(path: Path) -> Iterator[tuple[Grant, str]]:
    module = importlib.import_module(_module_name(path))
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        where = f"{path.relative_to(h.REPO)}:{node.lineno}"
        if node.func.attr in VERBS and _is_kube(node.func.value):
            res = _literal(node.args[0], module)
            if not isinstance(res, Res):
                continue  # a Res passed in by the caller; the caller's own call site is scanned
            sub = next((_literal(k.value, module) for k in node.keywords if k.arg == "sub"), None)
            resource = f"{res.plural}/{sub}" if sub else res.plural
            for verb in VERBS[node.func.attr]:
                yield (res.group, resource, verb), where
        kopf_kind = _kopf_handler(node.func)
        if kopf_kind and len(node.args) >= 3:
            group, plural = _literal(node.args[0], module), _literal(node.args[2], module)
            # A registration over a variable (a table of daemons): every plural of ours the module names.
            plurals = [plural] if isinstance(plural, str) else sorted(OUR_PLURALS & _strings(path))
            assert plurals, f"{where}: cannot tell which resource this kopf handler watches"
            verbs = ["list", "watch"] + (["patch"] if kopf_kind in KOPF_PATCHES else [])
            for p in plurals:
                for verb in verbs:
                    yield (group, p, verb), where


def _strings(path: Path) -> set[str]:
    return {
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _kopf_handler(func: ast.Attribute) -> str | None:
    # kopf.daemon(...), kopf.timer(...), kopf.on.<event>(...)
    value = func.value
    if isinstance(value, ast.Name) and value.id == "kopf" and func.attr in ("daemon", "timer"):
        return func.attr
    if isinstance(value, ast.Attribute) and value.attr == "on" and isinstance(value.value, ast.Name):
        return func.attr if value.value.id == "kopf" else None
    return None


def test_every_call_the_controllers_make_is_granted(components: list[dict[str, Any]]) -> None:
    grants = granted(components)
    calls = [c for d in SCANNED for p in sorted(d.rglob("*.py")) if "proto" not in p.parts for c in kube_calls(p)]
    assert len(calls) > 10, "the scan found almost nothing: has the client's call shape changed?"
    missing = sorted({f"{g or 'core'} {r} {v}  ({where})" for (g, r, v), where in calls if (g, r, v) not in grants})
    assert not missing, "calls the manager's RBAC does not grant:\n" + "\n".join(missing)


def test_the_scan_sees_the_calls_it_must() -> None:
    calls = {grant for p in sorted(SCANNED[0].glob("*.py")) for grant, _ in kube_calls(p)}
    assert ("", "secrets", "create") in calls  # ensure_os_hostkey
    assert (domain.GROUP, "hetznergpuhosts/status", "patch") in calls
    assert (domain.GROUP, "hetznergpuhosts", "watch") in calls  # a kopf daemon
    assert (domain.GROUP, "hetznergpuremediations", "watch") in calls  # registered from a table
    assert (domain.CAPI_GROUP, "machines", "watch") in calls  # kopf.on.event on CAPI Machines
    readiness = {grant for p in sorted(SCANNED[1].glob("*.py")) for grant, _ in kube_calls(p)}
    assert (domain.CAPI_GROUP, "machines/status", "patch") in readiness  # GPUReady by server-side apply
    assert (domain.GROUP, "hetznergpumachines", "list") in readiness  # targets: ours(...) at the call site
    assert (domain.GROUP, "hetznergpuclusters", "get") in calls  # workload.owner_cluster


def test_every_client_method_that_calls_the_api_is_mapped_to_a_verb() -> None:
    # A new Kube method must be added to VERBS, or the scan above would silently miss its calls.
    # version: /version is a non-resource URL every client may read (system:public-info-viewer).
    not_api = {"close", "host", "from_kubeconfig", "from_kubeconfig_dict", "in_cluster_or_kubeconfig", "version"}
    for cls in (kube.Kube, kube.AsyncKube):
        methods = {n for n in vars(cls) if not n.startswith("_")} - not_api
        assert methods <= set(VERBS), f"{cls.__name__}: {methods - set(VERBS)} not in VERBS"


def test_no_wildcards_and_no_cluster_admin(components: list[dict[str, Any]]) -> None:
    for role in components:
        if role["kind"] in ("ClusterRole", "Role"):
            for rule in role.get("rules", []):
                assert "*" not in rule["verbs"], role["metadata"]["name"]
                assert "*" not in rule["resources"], role["metadata"]["name"]
                assert "*" not in rule["apiGroups"], role["metadata"]["name"]
        if role["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert role["roleRef"]["name"] not in ("cluster-admin", "admin", "edit")


def test_every_rule_of_the_manager_role_says_why() -> None:
    lines = (h.CONFIG / "rbac" / "role.yaml").read_text().splitlines()
    rule_starts = [i for i, line in enumerate(lines) if line.startswith("  - apiGroups:")]
    assert rule_starts
    for i in rule_starts:
        previous = lines[i - 1].strip()
        # A rule directly following another rule's verbs shares the comment above both (pods + eviction).
        assert previous.startswith(("#", "verbs:")), f"rule at line {i + 1} has no reason"


def test_gate_driver_claim_status_is_scoped_to_our_driver(components: list[dict[str, Any]]) -> None:
    rules = [r for d in components if d["kind"] == "ClusterRole" for r in d["rules"]]
    driver = [r for r in rules if "resourceclaims/driver" in r["resources"]]
    assert driver
    for rule in driver:
        assert rule["resourceNames"] == [domain.GATE_DRIVER]
        assert set(rule["verbs"]) == {"arbitrary-node:patch", "arbitrary-node:update"}


def test_capi_core_gets_crud_on_our_infra_kinds_by_aggregation(components: list[dict[str, Any]]) -> None:
    (agg,) = [d for d in components if d["metadata"]["name"] == "capi-gpu-aggregated-manager-role"]
    assert agg["metadata"]["labels"]["cluster.x-k8s.io/aggregate-to-manager"] == "true"
    crud = {"get", "list", "watch", "create", "update", "patch", "delete"}
    resources = {r for rule in agg["rules"] if set(rule["verbs"]) == crud for r in rule["resources"]}
    assert resources == OUR_PLURALS - {"hetznergpuhosts"}
