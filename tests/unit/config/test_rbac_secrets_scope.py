"""Secret access in the shipped RBAC: never list or watch; in the cluster-wide flavour (config/default) get
and, as a rule of its own, create; in the one-namespace flavour (config/namespaced, the component
components/namespaced-secrets) no cluster-wide Secret grant at all, only a Role and RoleBinding in the
namespace the manager is told to watch."""

from __future__ import annotations

import re
from typing import Any

import config_helpers as h

SA = ("capi-gpu-controller-manager", "capi-gpu-system")


def _bound_to_sa(docs: list[dict[str, Any]], kind: str) -> set[tuple[str, str | None]]:
    return {
        (b["roleRef"]["name"], b["metadata"].get("namespace"))
        for b in docs
        if b["kind"] == kind and any((s["name"], s.get("namespace")) == SA for s in b["subjects"])
    }


def _secret_rules(docs: list[dict[str, Any]], kind: str) -> dict[tuple[str, str | None], list[list[str]]]:
    out: dict[tuple[str, str | None], list[list[str]]] = {}
    for role in docs:
        if role["kind"] == kind:
            for rule in role.get("rules", []):
                if "" in rule["apiGroups"] and "secrets" in rule["resources"]:
                    key = (role["metadata"]["name"], role["metadata"].get("namespace"))
                    out.setdefault(key, []).append(sorted(rule["verbs"]))
    return out


def _watched_namespace(docs: list[dict[str, Any]]) -> str:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == SA[0]]
    args = [a for c in deployment["spec"]["template"]["spec"]["containers"] for a in c.get("args", [])]
    (flag,) = [a for a in args if a.startswith("--namespace=")]
    m = re.fullmatch(r"--namespace=\$\{(\w+):=\*\}", flag)
    assert m, flag
    return "${" + m.group(1) + "}"


def test_cluster_wide_flavour_gets_and_creates_secrets_in_separate_rules(components: list[dict[str, Any]]) -> None:
    rules = _secret_rules(components, "ClusterRole")
    bound = {name for name, _ in _bound_to_sa(components, "ClusterRoleBinding")}
    granted = [verbs for (name, _), all_verbs in rules.items() if name in bound for verbs in all_verbs]
    assert sorted(granted) == [["create"], ["get"]]
    assert not _secret_rules(components, "Role")


def test_namespaced_flavour_grants_secrets_only_in_the_watched_namespace() -> None:
    docs = h.kustomize_build(h.CONFIG / "namespaced")
    bound_cluster = {name for name, _ in _bound_to_sa(docs, "ClusterRoleBinding")}
    assert bound_cluster, "the rest of the manager's role stays cluster-wide"
    assert not [k for k in _secret_rules(docs, "ClusterRole") if k[0] in bound_cluster]
    watched = _watched_namespace(docs)
    roles = _secret_rules(docs, "Role")
    assert list(roles) == [("capi-gpu-manager-secrets-role", watched)]
    assert sorted(roles[("capi-gpu-manager-secrets-role", watched)]) == [["create"], ["get"]]
    # The leader-election Lease stays in the manager's own namespace, whichever namespace it watches.
    assert _bound_to_sa(docs, "RoleBinding") == {
        ("capi-gpu-manager-secrets-role", watched),
        ("capi-gpu-leader-election-role", "capi-gpu-system"),
    }
    # Everything else is the default flavour, object for object.
    default = {(d["kind"], d["metadata"]["name"]) for d in h.kustomize_build(h.CONFIG / "default")}
    secrets = {
        ("ClusterRole", "capi-gpu-manager-secrets-role"),
        ("ClusterRoleBinding", "capi-gpu-manager-secrets-rolebinding"),
    }
    namespaced = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert namespaced == (default - secrets) | {
        ("Role", "capi-gpu-manager-secrets-role"),
        ("RoleBinding", "capi-gpu-manager-secrets-rolebinding"),
    }
