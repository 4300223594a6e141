"""The driver floor per GPU model, from the catalog's ``min_driver``, in every place that checks it: admission,
the machine's LayoutValid, the playbook variables and Configure's refusal, and the nvidia_driver role (its
default floor and the floor each run sends). Every catalog model at its floor passes each of them, in every
MIG mode; one branch below is refused with DriverTooOld and a message that names the model and the floor."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from capi_gpu.api.conditions import Reason, Type
from capi_gpu.api.host import ErrorType
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.api.specs import GPUSpec
from capi_gpu.controllers import host_actions, machine_loop
from capi_gpu.gpu import catalog, catalog_data, gpuplan, migparted
from capi_gpu.provisioning import admission, ansible
from capi_gpu.provisioning import playbook_vars as pv
from capi_gpu.provisioning.model import ActionResult, Outcome

CAT = catalog.builtin_catalog()
API = "infrastructure.cluster.x-k8s.io/v1alpha1"
ROLE_DEFAULTS = ansible.default_playbook_dir() / "roles/nvidia_driver/defaults/main.yml"
MODELS = [pytest.param(m, id=m.key) for m in catalog_data.MODELS]


def floor(model: catalog.GpuModel) -> int:
    return int(model.min_driver.branch.removeprefix("R"))


def specs(model: catalog.GpuModel, branch: int) -> dict[str, dict[str, Any]]:
    """The model at ``branch`` in each MIG mode: a whole GPU, a static preset, Dynamic MIG."""
    base = {"model": model.key, "driverBranch": str(branch)}
    preset = sorted(migparted.presets(model))[0]
    return {
        "whole GPU": base,
        "static": {**base, "layout": {"preset": preset}},
        "dynamic": {**base, "migMode": "Dynamic"},
    }


def assert_names_the_floor(message: str, model: catalog.GpuModel) -> None:
    assert f"below {model.key}'s driver floor {model.min_driver.branch}" in message, message
    assert f"use driverBranch {floor(model)} or later" in message, message


def machine(gpu: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "HetznerGPUMachine", "metadata": {"name": "m", "uid": "u"}, "spec": {"gpu": gpu}}


def test_the_catalog_floors_are_the_mig_user_guides() -> None:
    assert {m.key: m.min_driver.floor for m in catalog_data.MODELS} == {
        "rtx-pro-6000": 575,
        "h100-80gb": 525,
        "h200-141gb": 550,
    }
    with pytest.raises(catalog.CatalogError, match="not R<number>"):
        _ = catalog.DriverRequirement("latest", "1.0").floor


@pytest.mark.parametrize("model", MODELS)
def test_admission_takes_the_floor_and_refuses_one_below(model: catalog.GpuModel) -> None:
    for mode, gpu in specs(model, floor(model)).items():
        assert admission.refusals("HetznerGPUMachine", machine(gpu), [], CAT) == [], mode
    for mode, gpu in specs(model, floor(model) - 1).items():
        [found] = admission.refusals("HetznerGPUMachine", machine(gpu), [], CAT)
        assert (found.field, found.reason) == ("spec.gpu.driverBranch", Reason.DRIVER_TOO_OLD), mode
        assert_names_the_floor(found.message, model)


def layout_valid(gpu: dict[str, Any]) -> tuple[bool, str, str]:
    obj = machine(gpu)
    scope = machine_loop.Scope(obj, HetznerGPUMachine.model_validate(obj), "ns", "m")
    machine_loop._layout_ok(scope)
    return scope.conds[Type.LAYOUT_VALID.value]


@pytest.mark.parametrize("model", MODELS)
def test_layout_valid_takes_the_floor_and_refuses_one_below(model: catalog.GpuModel) -> None:
    for mode, gpu in specs(model, floor(model)).items():
        if mode == "dynamic":  # refused for another reason (DynamicMIGUnsupported), whatever the branch
            continue
        ok, reason, message = layout_valid(gpu)
        assert (ok, reason) == (True, Reason.READY), (mode, message)
    for mode, gpu in specs(model, floor(model) - 1).items():
        ok, reason, message = layout_valid(gpu)
        assert (ok, reason) == (False, Reason.DRIVER_TOO_OLD), mode
        assert_names_the_floor(message, model)


@pytest.mark.parametrize("model", MODELS)
def test_playbook_vars_send_the_models_floor_and_refuse_one_below(model: catalog.GpuModel) -> None:
    for gpu in specs(model, floor(model)).values():
        plan = gpuplan.plan(GPUSpec.model_validate(gpu), None)
        extra = pv.node_vars("v1.36.3", plan, str(floor(model))).extra_vars()
        assert (extra["nvidia_driver_branch"], extra["nvidia_driver_min_branch"]) == (str(floor(model)), floor(model))
    # A plan made for another branch (or by hand) still cannot carry a branch below the floor into the vars.
    plan = gpuplan.plan(GPUSpec(model=model.key), None)
    with pytest.raises(gpuplan.PlanError) as err:
        pv.node_vars("v1.36.3", plan, str(floor(model) - 1))
    assert err.value.reason is Reason.DRIVER_TOO_OLD
    assert_names_the_floor(str(err.value), model)
    with pytest.raises(ValueError, match=f"below the GPU model's floor {floor(model)}"):
        pv.PlaybookVars(
            kubernetes_version="v1.36.3",
            mig=pv.MigLayoutVars.of(plan),
            driver_branch=str(floor(model) - 1),
            driver_floor=floor(model),
        )


@pytest.mark.parametrize("model", MODELS)
def test_configure_refuses_a_branch_below_the_floor_as_a_permanent_failure(model: catalog.GpuModel) -> None:
    plan = gpuplan.plan(GPUSpec(model=model.key), None)
    assert isinstance(host_actions.configure_vars("v1.36.3", plan, str(floor(model)), {}), pv.PlaybookVars)
    refused = host_actions.configure_vars("v1.36.3", plan, str(floor(model) - 1), {})
    assert isinstance(refused, ActionResult)
    assert (refused.outcome, refused.error_type, refused.permanent) == (
        Outcome.FAILED,
        ErrorType.CONFIGURATION_REFUSED,  # Ansible never ran: not AnsibleFailed
        True,
    )
    assert refused.message.startswith(f"{Reason.DRIVER_TOO_OLD}: ")
    assert_names_the_floor(refused.message, model)


def test_configure_refuses_bad_operator_vars_without_raising() -> None:
    plan = gpuplan.plan(GPUSpec(), gpuplan.DEFAULT_MODEL)
    refused = host_actions.configure_vars("v1.36.3", plan, "580", {"driver_route": "rpm"})
    assert isinstance(refused, ActionResult) and refused.permanent
    assert refused.error_type is ErrorType.CONFIGURATION_REFUSED
    assert refused.message.startswith("playbook variables refused: driver_route: ")


def test_the_roles_default_floor_is_the_default_models() -> None:
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    default_model = CAT.model(gpuplan.DEFAULT_MODEL)
    assert defaults["nvidia_driver_min_branch"] == default_model.min_driver.floor == pv.DEFAULT_DRIVER_FLOOR
    # A PlaybookVars that sends no floor is checked against that same default, which the role then applies.
    unset = pv.PlaybookVars(
        kubernetes_version="v1.36.3", mig=pv.MigLayoutVars.of(gpuplan.plan(GPUSpec(), gpuplan.DEFAULT_MODEL))
    )
    assert "nvidia_driver_min_branch" not in unset.extra_vars()
