"""What the webhook refuses and the controllers' plan agrees on: an impossible MIG layout (with the nearest
valid ones), a driver branch below the model's floor, an unknown GPU model, a second host for one Robot server; and
what it lets through (valid layouts, a host updating itself)."""

from __future__ import annotations

from typing import Any

import pytest

from capi_gpu.api.conditions import Reason
from capi_gpu.api.specs import GPUSpec
from capi_gpu.controllers import webhook
from capi_gpu.gpu import catalog, gpuplan
from capi_gpu.provisioning import admission

CAT = catalog.builtin_catalog()
API = "infrastructure.cluster.x-k8s.io/v1alpha1"


def machine(gpu: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "HetznerGPUMachine", "metadata": {"name": "m"}, "spec": {"gpu": gpu}}


def host(name: str, namespace: str, server: int, **spec: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": API, "kind": "HetznerGPUHost", "metadata": meta, "spec": {"serverNumber": server, **spec}}


def test_impossible_layout_is_refused_with_the_nearest_valid_ones() -> None:
    gpu = {"model": "rtx-pro-6000", "layout": {"profiles": {"1g.24gb": 3, "2g.48gb": 1}}}
    [found] = admission.refusals("HetznerGPUMachine", machine(gpu), [], CAT)
    assert found.field == "spec.gpu.layout"
    assert found.reason == Reason.IMPOSSIBLE_LAYOUT
    assert "needs 5 memory slices, the GPU has 4" in found.message
    assert "Nearest valid layouts: 1g.24gb=2,2g.48gb=1" in found.message


def test_the_refusal_is_the_message_the_controller_condition_carries() -> None:
    gpu = {"model": "rtx-pro-6000", "layout": {"profiles": {"1g.24gb": 3, "2g.48gb": 1}}}
    [found] = admission.refusals("HetznerGPUMachine", machine(gpu), [], CAT)
    with pytest.raises(gpuplan.PlanError) as err:
        gpuplan.plan(GPUSpec.model_validate(gpu), None)
    assert (err.value.reason.value, str(err.value)) == (found.reason, found.message)


def test_a_layout_without_model_is_checked_against_the_default_gpu() -> None:
    [found] = admission.refusals("HetznerGPUMachine", machine({"layout": {"profiles": {"4g.96gb": 2}}}), [], CAT)
    assert found.reason == Reason.IMPOSSIBLE_LAYOUT
    assert "rtx-pro-6000" in found.message


def test_template_layout_is_checked_under_its_path() -> None:
    body = {
        "apiVersion": API,
        "kind": "HetznerGPUMachineTemplate",
        "metadata": {"name": "t"},
        "spec": {"template": {"spec": {"gpu": {"layout": {"profiles": {"1g.24gb": 5}}}}}},
    }
    [found] = admission.refusals("HetznerGPUMachineTemplate", body, [], CAT)
    assert found.field == "spec.template.spec.gpu.layout"
    assert "1g.24gb: 5 instances requested, at most 4 fit" in found.message


def test_driver_branch_below_the_models_floor_is_refused_in_every_mig_mode() -> None:
    # The node install refuses a branch below the floor whether MIG is used or not, so admission does too.
    old = {"driverBranch": "570", "layout": {"preset": "all-1g.24gb"}}
    [found] = admission.refusals("HetznerGPUMachine", machine(old), [], CAT)
    assert (found.field, found.reason) == ("spec.gpu.driverBranch", Reason.DRIVER_TOO_OLD)
    assert "use driverBranch 575 or later" in found.message
    [dynamic] = admission.refusals("HetznerGPUMachine", machine({"driverBranch": "570", "migMode": "Dynamic"}), [], CAT)
    assert dynamic.reason == Reason.DRIVER_TOO_OLD
    [whole] = admission.refusals("HetznerGPUMachine", machine({"driverBranch": "570"}), [], CAT)
    assert (whole.field, whole.reason) == ("spec.gpu.driverBranch", Reason.DRIVER_TOO_OLD)


def test_unknown_model_is_refused_on_the_model_field() -> None:
    [found] = admission.refusals("HetznerGPUMachine", machine({"model": "gtx-1080"}), [], CAT)
    assert (found.field, found.reason) == ("spec.gpu.model", Reason.UNKNOWN_GPU_MODEL)


def test_valid_layouts_and_presets_pass() -> None:
    for gpu in (
        {"layout": {"profiles": {"1g.24gb": 2, "2g.48gb": 1}}},
        {"layout": {"preset": "all-balanced"}},
        {"model": "h100-80gb", "layout": {"preset": "all-1g.10gb"}},
        {"migMode": "Dynamic"},
        {},
    ):
        assert admission.refusals("HetznerGPUMachine", machine(gpu), [], CAT) == [], gpu


def test_standby_layout_uses_the_inspected_gpu() -> None:
    h = host("a", "ns", 1, standby={"gpu": {"layout": {"preset": "all-1g.10gb"}}})
    [found] = admission.refusals("HetznerGPUHost", h, [], CAT)
    assert found.field == "spec.standby.gpu.layout"
    h["status"] = {"hardware": {"gpus": [{"vendorId": "10de", "deviceId": "2330", "model": "h100-80gb"}]}}
    assert admission.refusals("HetznerGPUHost", h, [], CAT) == []


def test_second_host_for_a_server_is_refused_in_any_namespace() -> None:
    existing = [host("gex-1", "team-a", 1234567), host("gex-2", "team-a", 7654321)]
    [found] = admission.refusals("HetznerGPUHost", host("again", "team-b", 1234567), existing, CAT)
    assert (found.field, found.reason) == ("spec.serverNumber", Reason.DUPLICATE_SERVER)
    assert "server 1234567 already has HetznerGPUHost team-a/gex-1" in found.message
    # The host itself (an update) and other servers pass.
    assert admission.refusals("HetznerGPUHost", host("gex-1", "team-a", 1234567), existing, CAT) == []
    assert admission.refusals("HetznerGPUHost", host("new", "team-b", 42), existing, CAT) == []


def test_only_the_younger_of_two_hosts_of_one_server_is_held_or_refused() -> None:
    older = host("first", "a", 1234567)
    older["metadata"]["creationTimestamp"] = "2026-12-03T10:00:00Z"
    younger = host("second", "b", 1234567)
    younger["metadata"]["creationTimestamp"] = "2026-12-03T11:00:00Z"
    parsed = {
        name: admission.HetznerGPUHost.model_validate({**doc, "status": {}})
        for name, doc in (("older", older), ("younger", younger))
    }
    held = admission.duplicate_server(parsed["younger"], [older, younger])
    assert held is not None and held.reason == Reason.DUPLICATE_SERVER
    assert "already has HetznerGPUHost a/first" in held.message
    assert admission.duplicate_server(parsed["older"], [older, younger]) is None


def test_patches_to_the_older_of_two_duplicates_pass_and_to_the_younger_are_refused() -> None:
    """Two hosts written while the webhook was down: the older keeps working on the server, so its claim,
    release, standby and retire patches must pass; the younger's are refused."""
    older = host("first", "a", 1234567)
    older["metadata"]["creationTimestamp"] = "2026-12-03T10:00:00Z"
    younger = host("second", "b", 1234567)
    younger["metadata"]["creationTimestamp"] = "2026-12-03T11:00:00Z"
    stored = [older, younger]
    patches: list[dict[str, Any]] = [
        {"consumerRef": {"apiVersion": API, "kind": "HetznerGPUMachine", "name": "m", "namespace": "a"}},
        {"consumerRef": None},
        {"retired": True},
        {"maintenanceMode": True},
    ]
    for patch in patches:
        assert admission.refusals("HetznerGPUHost", older | {"spec": older["spec"] | patch}, stored, CAT) == []
        [found] = admission.refusals("HetznerGPUHost", younger | {"spec": younger["spec"] | patch}, stored, CAT)
        assert found.reason == Reason.DUPLICATE_SERVER
        assert "already has HetznerGPUHost a/first" in found.message


async def test_a_new_host_stamped_in_the_same_second_as_the_older_is_still_the_younger() -> None:
    """The apiserver stamps creationTimestamp before the webhook sees a CREATE; within one second of the older
    host, the (namespace, name) tie-break alone could call the new one older. The webhook never does."""
    stamp = "2026-12-03T10:00:00Z"
    older = host("zz-first", "z", 1234567)
    older["metadata"]["creationTimestamp"] = stamp
    new = host("aa-second", "a", 1234567)
    new["metadata"]["creationTimestamp"] = stamp

    class Hosts:
        async def list(self, *_: Any) -> list[dict[str, Any]]:
            return [older]

    review = {"apiVersion": "admission.k8s.io/v1", "request": {"uid": "1", "operation": "CREATE", "object": new}}
    out = await webhook.answer(review, "validate-hetznergpuhost", Hosts())  # type: ignore[arg-type]
    assert out["response"]["allowed"] is False
    assert "already has HetznerGPUHost z/zz-first" in out["response"]["status"]["message"]
