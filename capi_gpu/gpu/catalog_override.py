"""Turn a catalog override document (YAML text) into models, with errors that name the bad field.

An override is how an operator corrects the catalog without a release: a Max-Q device id confirmed on
a host, a profile a new driver added. Because a wrong catalog silently produces wrong layouts, every
field is type-checked and the merged model goes through :func:`capi_gpu.gpu.catalog.check_model`.
Text in, models out: the caller reads the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from capi_gpu.gpu import catalog

_MODEL_FIELDS = {
    "productName": "product_name",
    "architecture": "architecture",
    "deviceIds": "device_ids",
    "unverifiedDeviceIds": "unverified_device_ids",
    "memorySlices": "memory_slices",
    "computeSlices": "compute_slices",
    "placementUnits": "placement_units",
    "engines": "engines",
    "minDriver": "min_driver",
    "balanced": "balanced",
    "profiles": "profiles",
}


def apply(text: str, base: catalog.Catalog) -> catalog.Catalog:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise catalog.CatalogError(f"catalog override is not valid YAML: {exc}") from exc
    if not isinstance(doc, Mapping) or not isinstance(doc.get("models"), Mapping):
        raise catalog.CatalogError("catalog override must be a mapping with a 'models' mapping")
    result = base
    for key, body in doc["models"].items():
        if not isinstance(body, Mapping):
            raise catalog.CatalogError(f"models.{key}: expected a mapping")
        fields = _convert_fields(str(key), body)
        if key in result:
            model = dataclasses.replace(result[key], **fields)
        else:
            missing = sorted(k for k, v in _MODEL_FIELDS.items() if v not in fields and k != "balanced")
            missing = [m for m in missing if m != "unverifiedDeviceIds"]
            if missing:
                raise catalog.CatalogError(f"models.{key}: a new model needs {', '.join(missing)}")
            fields.setdefault("unverified_device_ids", ())
            model = catalog.GpuModel(key=str(key), **fields)
        catalog.check_model(model)
        result = result.replace(model)
    return result


def _convert_fields(key: str, body: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(body) - set(_MODEL_FIELDS))
    if unknown:
        raise catalog.CatalogError(f"models.{key}: unknown field(s) {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for src, dst in _MODEL_FIELDS.items():
        if src not in body:
            continue
        where = f"models.{key}.{src}"
        value = body[src]
        if dst in ("product_name", "architecture"):
            out[dst] = _str(where, value)
        elif dst in ("device_ids", "unverified_device_ids"):
            out[dst] = tuple(catalog.parse_pci_device_id(_id(where, v)) for v in _list(where, value))
        elif dst in ("memory_slices", "compute_slices", "placement_units"):
            out[dst] = _int(where, value)
        elif dst == "engines":
            out[dst] = _engines(where, value)
        elif dst == "min_driver":
            m = _map(where, value)
            req = catalog.DriverRequirement(
                _str(f"{where}.branch", m.get("branch")), _str(f"{where}.minimum", m.get("minimum"))
            )
            _ = req.floor  # refused when the file is loaded, not when a spec is first planned against it
            out[dst] = req
        elif dst == "balanced":
            out[dst] = tuple((str(n), _int(f"{where}.{n}", c)) for n, c in _map(where, value).items())
        else:
            out[dst] = tuple(_profile(f"{where}[{i}]", p, body, key) for i, p in enumerate(_list(where, value)))
    return out


def _profile(where: str, value: object, body: Mapping[str, Any], key: str) -> catalog.MigProfile:
    m = _map(where, value)
    allowed = {"name", "id", "maxInstances", "placements", "placementSize", "memorySlices"}
    allowed |= {"sms", "memoryGiB", "engines"}
    unknown = sorted(set(m) - allowed)
    if unknown:
        raise catalog.CatalogError(f"{where}: unknown field(s) {', '.join(unknown)}")
    size = _int(f"{where}.placementSize", m.get("placementSize"))
    slices = m.get("memorySlices")
    if slices is None:
        units = body.get("placementUnits")
        mem = body.get("memorySlices")
        if units is None or mem is None:
            raise catalog.CatalogError(
                f"{where}: give memorySlices (or the model's placementUnits and memorySlices for {key})"
            )
        slices = size // (_int("placementUnits", units) // _int("memorySlices", mem))
    gib = m.get("memoryGiB")
    return catalog.MigProfile(
        name=_str(f"{where}.name", m.get("name")),
        gi_profile_id=_int(f"{where}.id", m.get("id")),
        max_instances=_int(f"{where}.maxInstances", m.get("maxInstances")),
        placement_starts=tuple(_int(f"{where}.placements", s) for s in _list(where, m.get("placements"))),
        placement_size=size,
        memory_slices=_int(f"{where}.memorySlices", slices),
        multiprocessors=None if m.get("sms") is None else _int(f"{where}.sms", m.get("sms")),
        memory_gib=None if gib is None else float(gib),
        engines=_engines(f"{where}.engines", m["engines"]) if "engines" in m else catalog.NO_ENGINES,
    )


def _engines(where: str, value: object) -> catalog.Engines:
    m = _map(where, value)
    names = {"decoders", "encoders", "jpeg", "ofa", "copyEngines"}
    unknown = sorted(set(m) - names)
    if unknown:
        raise catalog.CatalogError(f"{where}: unknown engine(s) {', '.join(unknown)}")
    return catalog.Engines(
        decoders=_int(f"{where}.decoders", m.get("decoders", 0)),
        encoders=_int(f"{where}.encoders", m.get("encoders", 0)),
        jpeg=_int(f"{where}.jpeg", m.get("jpeg", 0)),
        ofa=_int(f"{where}.ofa", m.get("ofa", 0)),
        copy_engines=_int(f"{where}.copyEngines", m.get("copyEngines", 0)),
    )


def _map(where: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise catalog.CatalogError(f"{where}: expected a mapping")
    return value


def _list(where: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise catalog.CatalogError(f"{where}: expected a list")
    return value


def _str(where: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise catalog.CatalogError(f"{where}: expected a non-empty string")
    return value


def _int(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise catalog.CatalogError(f"{where}: expected an integer, got {value!r}")
    return value


def _id(where: str, value: object) -> str | int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise catalog.CatalogError(f"{where}: expected a PCI id string such as '0x2BB5'")
    return value
