"""From a GPUSpec and a host's GPU to the concrete layout: one resolution shared by the machine
controller (before any claim), the Configure step (what Ansible applies) and the readiness gate (what
the DRA slices must show). Pure.

The plan carries the resolved, validated ``Layout`` (and the preset name that chose it, which names the
mig-parted config), so the playbook vars render what the plan resolved and never resolve the spec again.
``DEFAULT_MODEL`` is the one place that says which GPU a spec without ``gpu.model`` means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from capi_gpu.api.conditions import Reason
from capi_gpu.api.specs import GPUSpec, MigMode
from capi_gpu.gpu import catalog, catalog_data, migparted
from capi_gpu.gpu import layout as miglayout

DEFAULT_MODEL: Final = catalog_data.RTX_PRO_6000.key
"""The GEX131's GPU: what a spec without gpu.model means before inspection, for every reader (controllers,
autoscaler, readiness gate, CLI), so a template and the machines made from it never disagree."""


class PlanError(ValueError):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class GPUPlan:
    model: catalog.GpuModel
    layout: miglayout.Layout | None  # None: whole GPU (MIG off) or Dynamic MIG
    key: str
    preset: str | None = None
    """The preset the spec named, if any: it names the mig-parted config, as mig-parted's own presets do."""

    @property
    def expected_profiles(self) -> dict[str, int]:
        return dict(self.layout.as_dict()) if self.layout is not None else {}

    def expected_devices(self) -> tuple[miglayout.ExpectedDevice, ...]:
        return miglayout.expected_devices(self.model, self.layout) if self.layout is not None else ()


def _spec(gpu: GPUSpec) -> str | dict[str, int] | None:
    if gpu.layout is None:
        return None
    if gpu.layout.preset and gpu.layout.profiles:
        raise PlanError(Reason.IMPOSSIBLE_LAYOUT, "layout sets both preset and profiles; choose one")
    if gpu.layout.preset:
        return gpu.layout.preset
    return dict(gpu.layout.profiles or {})


def model_for(name_or_id: str | None, cat: catalog.Catalog | None = None) -> catalog.GpuModel:
    cat = cat or catalog.builtin_catalog()
    if not name_or_id:
        raise PlanError(Reason.UNKNOWN_GPU_MODEL, "no GPU model: the host has no inspected GPU and the spec names none")
    try:
        return cat.model(name_or_id)
    except (KeyError, catalog.CatalogError) as exc:
        raise PlanError(Reason.UNKNOWN_GPU_MODEL, f"GPU model {name_or_id!r} is not in the catalog") from exc


def check_driver(driver_branch: str, model: catalog.GpuModel) -> None:
    """The model's floor (catalog ``min_driver``), for every mode: the node install refuses a lower branch
    whether MIG is used or not (``nvidia_driver_min_branch``), so a spec below it is refused here, before a
    host is claimed, and not at Configure."""
    need = model.min_driver.floor
    if int(driver_branch) < need:
        raise PlanError(
            Reason.DRIVER_TOO_OLD,
            f"driverBranch {driver_branch} is below {model.key}'s driver floor {model.min_driver.branch} "
            f"(>= {model.min_driver.minimum}, the first with MIG on it): use driverBranch {need} or later "
            "(580 is a long-term branch)",
        )


def plan(gpu: GPUSpec, model_name: str | None, cat: catalog.Catalog | None = None) -> GPUPlan:
    """Raises PlanError (with a condition reason) for anything a host must never be touched for."""
    model = model_for(gpu.model or model_name, cat)
    spec = _spec(gpu)
    if gpu.mig_mode is MigMode.DYNAMIC and spec is not None:
        raise PlanError(
            Reason.DYNAMIC_MIG_WITH_LAYOUT,
            "migMode Dynamic lets the DRA driver create instances and destroys pre-made ones; "
            "remove spec.gpu.layout or use migMode Static",
        )
    check_driver(gpu.driver_branch, model)
    if gpu.mig_mode is MigMode.DYNAMIC:
        return GPUPlan(model, None, "dynamic")
    if spec is None:
        return GPUPlan(model, None, "none")
    try:
        chosen = migparted.resolve(model, spec)
    except miglayout.LayoutError as exc:
        raise PlanError(Reason.IMPOSSIBLE_LAYOUT, str(exc)) from exc
    preset = spec.strip() if isinstance(spec, str) and spec.strip() in migparted.presets(model) else None
    return GPUPlan(model, chosen, miglayout.layout_key(chosen), preset)
