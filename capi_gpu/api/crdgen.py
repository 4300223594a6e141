"""Generates the CRD YAML under ``crds/`` from the pydantic models.

pydantic emits JSON Schema; the apiserver wants *structural* OpenAPI v3: no ``$ref``, no ``anyOf`` with
null, no titles, a type on every node (except int-or-string), defaults only where they validate. CEL
rules (``x-kubernetes-validations``, see ``base.cel``) pass through as the models declare them. This
module is that translation, plus the CRD envelope (labels, status subresource, printer columns).
``capi-gpu crds --check`` fails when the committed files differ, so the YAML can't drift from the code.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from capi_gpu import domain
from capi_gpu.api.kinds import KINDS, Kind

_DROP = {"title", "$defs", "examples"}
_RULES = "x-kubernetes-validations"


def _resolve(node: Any, defs: dict[str, Any], in_status: bool) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs, in_status) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        merged = _merge(target, {k: v for k, v in node.items() if k != "$ref"})
        return _resolve(merged, defs, in_status)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            if rest.get("default", 0) is None:
                rest.pop("default")
            return _resolve(_merge(branches[0], rest), defs, in_status)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _resolve(sub, defs, in_status or name == "status") for name, sub in value.items()}
        else:
            out[key] = _resolve(value, defs, in_status)
    return _structural(out, in_status)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` wins, except that CEL rules add up: a model's own rules and the ones the field using it
    declares (its immutability, say) all apply."""
    merged = {**base, **over}
    rules = [*base.get(_RULES, []), *over.get(_RULES, [])]
    if rules:
        merged[_RULES] = rules
    return merged


def _structural(node: dict[str, Any], in_status: bool) -> dict[str, Any]:
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
    default = node.get("default")
    # Object/array defaults from pydantic carry nulls the apiserver would reject; status needs none.
    # An object default becomes {} so the apiserver descends into it and applies the inner defaults.
    if "default" in node and (in_status or isinstance(default, list) or default is None):
        node.pop("default")
    elif isinstance(default, dict):
        if node.get("required"):
            node.pop("default")
        else:
            node["default"] = {}
    if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
        node["x-kubernetes-preserve-unknown-fields"] = True
    return node


def openapi_schema(kind: Kind) -> dict[str, Any]:
    raw = kind.model.model_json_schema(by_alias=True)
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _resolve(raw, defs, in_status=False)
    props = schema["properties"]
    props["apiVersion"] = {"type": "string", "description": "APIVersion of this representation."}
    props["kind"] = {"type": "string", "description": "Kind of this object."}
    props["metadata"] = {"type": "object"}
    schema["required"] = [r for r in schema.get("required", []) if r not in ("apiVersion", "kind", "metadata")]
    if not schema["required"]:
        schema.pop("required")
    schema["description"] = (kind.model.__doc__ or kind.kind).strip().splitlines()[0]
    return schema


def crd(kind: Kind) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": domain.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": openapi_schema(kind)},
        "additionalPrinterColumns": [
            {
                k: v
                for k, v in {
                    "name": c.name,
                    "type": c.type,
                    "jsonPath": c.json_path,
                    "description": c.description or None,
                    "priority": c.priority or None,
                }.items()
                if v is not None
            }
            for c in kind.columns
        ],
    }
    if kind.status:
        version["subresources"] = {"status": {}}
    labels = {domain.CONTRACT_LABEL: domain.VERSION, domain.PROVIDER_LABEL: domain.PROVIDER_NAME, **kind.extra_labels}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name, "labels": labels},
        "spec": {
            "group": domain.GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": ["cluster-api", "hetzner-gpu"],
            },
            "scope": "Namespaced",
            "versions": [version],
        },
    }


def render_all() -> dict[str, str]:
    """File name -> YAML text, for every kind."""
    out: dict[str, str] = {}
    for kind in KINDS:
        text = "---\n" + yaml.safe_dump(crd(kind), sort_keys=False, width=120)
        out[f"{domain.GROUP}_{kind.plural}.yaml"] = text
    return out


def write(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written


def check(out_dir: Path) -> list[str]:
    """Differences between ``out_dir`` and the generated CRDs; empty when they agree."""
    problems = []
    expected = render_all()
    for name, text in expected.items():
        path = out_dir / name
        if not path.exists():
            problems.append(f"missing: {path}")
        elif path.read_text() != text:
            problems.append(f"differs: {path}")
    for path in sorted(out_dir.glob(f"{domain.GROUP}_*.yaml")):
        if path.name not in expected:
            problems.append(f"stale: {path}")
    return problems
