"""`capi-gpu layouts`: list, validate and render MIG layouts, and check the catalog against a host.

Operators choose a layout before any host is touched; ``validate`` gives them the same answer the
controller will (exit 0 valid, 1 not, with the reason and the nearest valid layouts). ``render``
prints the mig-parted config the ``mig_layout`` role installs. ``check-catalog`` is the
driver-upgrade runbook's step: compare a host's ``nvidia-smi mig -lgip`` with the built-in catalog.
This module is the edge: it reads files and prints; the decisions live in ``capi_gpu.gpu``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capi_gpu.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from capi_gpu.gpu import catalog, catalog_check, layout, migparted


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("layouts", help="MIG layouts: list, validate, render, check the catalog")
    verbs = p.add_subparsers(dest="layouts_command", required=True)

    def common(name: str, help_text: str) -> argparse.ArgumentParser:
        v = verbs.add_parser(name, help=help_text)
        v.add_argument("--gpu", required=True, help="rtx-pro-6000, h100-80gb, h200-141gb or a PCI device id")
        v.add_argument("--catalog", type=Path, help="YAML catalog override (see capi_gpu.gpu.catalog)")
        return v

    v = common("list", "profiles and presets of a GPU model")
    v.add_argument("-o", "--output", choices=("table", "json"), default="table")
    v.set_defaults(func=run_list)

    v = common("validate", "check a layout (e.g. '1g.24gb=2,2g.48gb=1' or a preset name)")
    v.add_argument("layout")
    v.set_defaults(func=run_validate)

    v = common("render", "print the mig-parted config for a layout")
    v.add_argument("layout")
    v.add_argument("--name", help="config name (default: the preset name or the layout key)")
    v.add_argument("--device-filter", action="append", help="PCI id such as 0x2BB510DE (repeatable)")
    v.set_defaults(func=run_render)

    v = common("devices", "the DRA devices the NVIDIA driver will publish for a layout")
    v.add_argument("layout")
    v.add_argument("--minor", type=int, default=0)
    v.add_argument("-o", "--output", choices=("table", "json"), default="table")
    v.set_defaults(func=run_devices)

    v = common("check-catalog", "compare the catalog with a host's `nvidia-smi mig -lgip` output")
    v.add_argument("--lgip", type=Path, required=True, help="file with `nvidia-smi mig -lgip` output")
    v.add_argument("--lgipp", type=Path, help="file with `nvidia-smi mig -lgipp` output (placements)")
    v.set_defaults(func=run_check_catalog)


class _UsageError(Exception):
    pass


def _model(args: argparse.Namespace) -> catalog.GpuModel:
    try:
        cat = catalog.builtin_catalog()
        if args.catalog is not None:
            cat = catalog.load_override(_read(args.catalog), cat)
        return cat.model(args.gpu)
    except catalog.CatalogError as exc:
        raise _UsageError(str(exc)) from exc


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise _UsageError(f"cannot read {path}: {exc.strerror}") from exc


def _guard(args: argparse.Namespace, body: str) -> int:
    try:
        return _VERBS[body](args, _model(args))
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (layout.LayoutError, catalog.CatalogError) as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return EXIT_FAILED


def run_list(args: argparse.Namespace) -> int:
    return _guard(args, "list")


def run_validate(args: argparse.Namespace) -> int:
    return _guard(args, "validate")


def run_render(args: argparse.Namespace) -> int:
    return _guard(args, "render")


def run_devices(args: argparse.Namespace) -> int:
    return _guard(args, "devices")


def run_check_catalog(args: argparse.Namespace) -> int:
    return _guard(args, "check-catalog")


def _list(args: argparse.Namespace, model: catalog.GpuModel) -> int:
    named = migparted.presets(model)
    if args.output == "json":
        print(json.dumps(_model_json(model, named), indent=2))
        return EXIT_OK
    print(f"{model.key}: {model.product_name} ({model.architecture}), PCI {', '.join(model.pci_ids())}")
    print(
        f"{model.memory_slices} memory slices, {model.compute_slices} compute slices, "
        f"{model.placement_units} placement units; MIG needs driver {model.min_driver.branch} "
        f"(>= {model.min_driver.minimum})"
    )
    print(f"{'PROFILE':<16}{'ID':>4}{'MAX':>5}{'SLICES':>8}{'SM':>6}  PLACEMENTS")
    for p in model.profiles:
        sms = "-" if p.multiprocessors is None else str(p.multiprocessors)
        where = "{" + ",".join(map(str, p.placement_starts)) + f"}}:{p.placement_size}"
        print(f"{p.name:<16}{p.gi_profile_id:>4}{p.max_instances:>5}{p.memory_slices:>8}{sms:>6}  {where}")
    print("\nPRESETS")
    for name, chosen in named.items():
        print(f"  {name:<22}{chosen}")
    return EXIT_OK


def _model_json(model: catalog.GpuModel, named: dict[str, layout.Layout]) -> dict[str, object]:
    return {
        "gpu": model.key,
        "productName": model.product_name,
        "deviceIds": list(model.pci_ids()),
        "unverifiedDeviceIds": [catalog.format_pci_id(d) for d in model.unverified_device_ids],
        "memorySlices": model.memory_slices,
        "computeSlices": model.compute_slices,
        "placementUnits": model.placement_units,
        "minDriver": {"branch": model.min_driver.branch, "minimum": model.min_driver.minimum},
        "profiles": [
            {
                "name": p.name,
                "id": p.gi_profile_id,
                "maxInstances": p.max_instances,
                "memorySlices": p.memory_slices,
                "placements": list(p.placement_starts),
                "placementSize": p.placement_size,
                "sms": p.multiprocessors,
            }
            for p in model.profiles
        ],
        "presets": {name: str(chosen) for name, chosen in named.items()},
    }


def _validate(args: argparse.Namespace, model: catalog.GpuModel) -> int:
    chosen = migparted.resolve(model, args.layout)
    placed = layout.place(model, chosen)
    where = ", ".join(f"{i.profile}@{i.start}" for i in placed)
    print(f"valid: {chosen or '(no MIG devices)'} on {model.key} (key {layout.layout_key(chosen)}; {where})")
    return EXIT_OK


def _render(args: argparse.Namespace, model: catalog.GpuModel) -> int:
    sys.stdout.write(migparted.render_one(model, args.layout, name=args.name, device_filter=args.device_filter))
    return EXIT_OK


def _devices(args: argparse.Namespace, model: catalog.GpuModel) -> int:
    devices = layout.expected_devices(model, migparted.resolve(model, args.layout), minor=args.minor)
    if args.output == "json":
        print(
            json.dumps([{"name": d.name, "profile": d.profile, "memorySlices": list(d.memory_slices)} for d in devices])
        )
    else:
        for d in devices:
            print(f"{d.name:<32}{d.profile:<16}memorySlice{d.memory_slices[0]}..{d.memory_slices[-1]}")
    return EXIT_OK


def _check_catalog(args: argparse.Namespace, model: catalog.GpuModel) -> int:
    lgip = _read(args.lgip)
    lgipp = None if args.lgipp is None else _read(args.lgipp)
    try:
        diffs = catalog_check.check(model, lgip, lgipp)
    except ValueError as exc:  # the file is not -lgip/-lgipp output
        raise _UsageError(str(exc)) from exc
    if not diffs:
        print(f"{model.key}: the catalog agrees with {args.lgip}" + (f" and {args.lgipp}" if lgipp else ""))
        return EXIT_OK
    for d in diffs:
        print(d)
    print(f"{len(diffs)} difference(s) between the {model.key} catalog and the host", file=sys.stderr)
    return EXIT_FAILED


_VERBS = {
    "list": _list,
    "validate": _validate,
    "render": _render,
    "devices": _devices,
    "check-catalog": _check_catalog,
}
