"""mig-parted's side of a layout: the named presets it ships and the config file it reads.

Presets carry mig-parted's names (``all-1g.24gb``, ``all-balanced``…) so a layout chosen by name in a
``HetznerGPUMachine`` means on our hosts what it means in the GPU Operator's MIG manager. They are
derived from the catalog (every profile at its instance limit, plus the model's ``all-balanced``),
so a model added by a catalog override gets them too; a test checks them against mig-parted's own
``config-default.yaml``.

The rendered config is what the ``mig_layout`` playbook role copies to the host as-is; Jinja never
re-derives it. The output is the plain block style the GPU shim's parser reads (see
``capi_gpu_sim/gpu_shim/nvidia_mig_parted.py``) and valid YAML for the real tool. Pure: text out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from capi_gpu.gpu import catalog, layout

# Plain scalars YAML 1.1 readers (PyYAML, hence Ansible's from_yaml) turn into booleans or null.
_YAML11_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def preset_name(profile: str) -> str:
    """``1g.24gb+gfx`` -> ``all-1g.24gb.gfx``; ``1g.24gb-me`` -> ``all-1g.24gb-me`` (mig-parted's scheme)."""
    return f"all-{profile.replace('+', '.')}"


def presets(model: catalog.GpuModel) -> dict[str, layout.Layout]:
    """Named layouts for ``model``: ``all-<profile>`` at the profile's limit, and ``all-balanced``."""
    named: dict[str, layout.Layout] = {}
    for p in model.profiles:
        candidate = layout.Layout.of({p.name: p.max_instances})
        if layout.is_valid(model, candidate):
            named[preset_name(p.name)] = candidate
    if model.balanced:
        named["all-balanced"] = layout.Layout.of(dict(model.balanced))
    return named


def resolve(model: catalog.GpuModel, spec: str | Mapping[str, int] | layout.Layout) -> layout.Layout:
    """A preset name or a layout spec, validated for ``model``."""
    if isinstance(spec, str) and spec.strip() in presets(model):
        chosen = presets(model)[spec.strip()]
    else:
        chosen = layout.parse_layout(spec)
    layout.validate(model, chosen)
    return chosen


def _devices_value(devices: str | Sequence[int]) -> str:
    if isinstance(devices, str):
        if devices != "all":
            raise layout.LayoutError(f"devices must be 'all' or a list of GPU indices, got {devices!r}")
        return "all"
    return json.dumps([int(d) for d in devices])


def render(
    model: catalog.GpuModel,
    configs: Mapping[str, layout.Layout | None],
    *,
    device_filter: str | Sequence[str] | None = None,
    devices: str | Sequence[int] = "all",
) -> str:
    """Render mig-parted ``version: v1`` YAML; each layout is validated against ``model`` first.

    A ``None`` layout renders ``mig-enabled: false``. ``device_filter`` is a PCI id (``0x2BB510DE``)
    or list of them; without it the entries apply to every GPU, which is what the host wants when the
    exact edition (Server / Max-Q) is not certain.
    """
    lines = ["version: v1", "mig-configs:"]
    for name, chosen in configs.items():
        if not name or any(c.isspace() or c in ":#{}[],\"'" for c in name) or name.lower() in _YAML11_WORDS:
            raise layout.LayoutError(f"config name {name!r} is not a plain mig-parted config name")
        lines.append(f"  {name}:")
        first = "    - "
        if device_filter is not None:
            filters = [device_filter] if isinstance(device_filter, str) else list(device_filter)
            ids = [catalog.format_pci_id(catalog.parse_pci_device_id(f)) for f in filters]
            lines.append(f"{first}device-filter: {json.dumps(ids)}")
            first = "      "
        lines.append(f"{first}devices: {_devices_value(devices)}")
        if chosen is None:
            lines.append("      mig-enabled: false")
            continue
        layout.validate(model, chosen)
        lines.append("      mig-enabled: true")
        if not chosen.counts:
            lines.append("      mig-devices: {}")
            continue
        lines.append("      mig-devices:")
        lines.extend(f"        {json.dumps(profile)}: {count}" for profile, count in chosen.counts)
    return "\n".join(lines) + "\n"


def render_one(
    model: catalog.GpuModel,
    spec: str | Mapping[str, int] | layout.Layout,
    *,
    name: str | None = None,
    device_filter: str | Sequence[str] | None = None,
) -> str:
    """Render a single layout (or preset) under ``name`` (default: the preset name or the layout key)."""
    chosen = resolve(model, spec)
    if name is None:
        name = spec.strip() if isinstance(spec, str) and spec.strip() in presets(model) else None
    return render(model, {name or layout.layout_key(chosen): chosen}, device_filter=device_filter)


def configs_for_device(document: Mapping[str, object], pci_id: str) -> dict[str, layout.Layout | None]:
    """From a parsed mig-parted document, the layout each config applies to a GPU with ``pci_id``.

    Entries with a ``device-filter`` that excludes the GPU are skipped, as mig-parted does (a config
    whose every entry is filtered out silently does nothing on that GPU, so it is left out here).
    """
    wanted = catalog.parse_pci_device_id(pci_id)
    out: dict[str, layout.Layout | None] = {}
    configs = document.get("mig-configs")
    if not isinstance(configs, Mapping):
        raise layout.LayoutError("mig-parted config has no 'mig-configs' mapping")
    for name, entries in configs.items():
        if not isinstance(entries, list):
            raise layout.LayoutError(f"mig-configs.{name} must be a list of entries")
        for entry in entries:
            flt = entry.get("device-filter")
            if flt is not None:
                filters = [flt] if isinstance(flt, str | int) else list(flt)
                if wanted not in {catalog.parse_pci_device_id(f) for f in filters}:
                    continue
            if not entry.get("mig-enabled", False):
                out[str(name)] = None
            else:
                out[str(name)] = layout.parse_layout(entry.get("mig-devices") or {})
            break
    return out
