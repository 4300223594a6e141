"""PlaybookVars: what reaches site.yml as extra vars (names the roles define, unset fields left to role
defaults), and what is refused before a host is touched (low driver branch, unsigned network repository,
a config text that does not contain the named config, bad profile names)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from capi_gpu import domain
from capi_gpu.api.conditions import Reason
from capi_gpu.api.network import PrivateNetworkSpec
from capi_gpu.api.specs import GPUSpec, MigLayout, MigMode
from capi_gpu.gpu import catalog, gpuplan, layout
from capi_gpu.provisioning import ansible, private_network
from capi_gpu.provisioning import playbook_vars as pv

ROLES = ansible.default_playbook_dir() / "roles"
CONFIG = """version: v1
mig-configs:
  capi-gpu-2x1g.24gb-1x2g.48gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.24gb": 2, "2g.48gb": 1}
"""


def sample_layout() -> pv.MigLayoutVars:
    return pv.MigLayoutVars(
        config_yaml=CONFIG, config_name="capi-gpu-2x1g.24gb-1x2g.48gb", expected_profiles={"1g.24gb": 2, "2g.48gb": 1}
    )


def role_defaults() -> set[str]:
    names: set[str] = set()
    for path in ROLES.glob("*/defaults/main.yml"):
        names |= set(yaml.safe_load(path.read_text()) or {})
    return names


def test_every_extra_var_is_a_variable_some_role_defines() -> None:
    repo = pv.AptRepository(uri="file:/srv/capi-gpu-apt/nvidia", suite="./", trusted=True)
    full = pv.PlaybookVars(
        kubernetes_version="v1.36.3",
        mig=sample_layout(),
        nvidia_repo=repo,
        container_toolkit_repo=repo,
        containerd_repo=repo,
        kubernetes_repo=repo,
        mig_parted="/opt/capi-gpu/libexec/nvidia-mig-parted",
        mig_parted_sha256="1" * 64,
        mig_parted_exec="/usr/lib/capi-gpu-sim/nvidia-mig-parted",
        mig_manager_deb="/srv/capi-gpu-apt/nvidia/nvidia-mig-manager_0.15.0-1_amd64.deb",
        mig_manager_deb_sha256="0" * 64,
        driver_route="ubuntu-precompiled",
        node_labels={"nvidia.com/gpu.present": "true"},
    )
    assert set(full.extra_vars()) <= role_defaults()


def test_unset_fields_are_left_to_the_role_defaults() -> None:
    extra = pv.PlaybookVars(kubernetes_version="v1.36.3", mig=sample_layout()).extra_vars()
    assert extra == {
        "kubelet_kubernetes_version": "1.36.3",
        "nvidia_driver_branch": "580",
        "mig_layout_config_yaml": CONFIG,
        "mig_layout_config_name": "capi-gpu-2x1g.24gb-1x2g.48gb",
        "mig_layout_expected_profiles": {"1g.24gb": 2, "2g.48gb": 1},
        "dra_node_gate_driver": domain.GATE_DRIVER,
    }


def test_a_repository_is_sent_in_the_shape_apt_source_takes() -> None:
    repo = pv.AptRepository(
        uri="https://pkgs.k8s.io/core:/stable:/v1.36/deb/",
        key_url="https://pkgs.k8s.io/core:/stable:/v1.36/deb/Release.key",
        key_fingerprint="DE15B14486CD377B9E876E1A234654DA9A296436",
    )
    extra = pv.PlaybookVars(kubernetes_version="1.36.3", mig=sample_layout(), kubernetes_repo=repo).extra_vars()
    assert extra["kubelet_repo"] == {
        "uri": "https://pkgs.k8s.io/core:/stable:/v1.36/deb/",
        "suite": "/",
        "components": [],
        "key_url": "https://pkgs.k8s.io/core:/stable:/v1.36/deb/Release.key",
        "key_fingerprint": "DE15B14486CD377B9E876E1A234654DA9A296436",
        "trusted": False,
    }


def test_a_driver_branch_without_mig_on_this_gpu_is_refused() -> None:
    with pytest.raises(ValidationError, match="575"):
        pv.PlaybookVars(kubernetes_version="v1.36.3", mig=sample_layout(), driver_branch="570")
    assert (
        pv.PlaybookVars(kubernetes_version="v1.36.3", mig=sample_layout(), driver_branch="575").driver_branch == "575"
    )


def test_only_a_local_file_repository_may_be_unsigned() -> None:
    with pytest.raises(ValidationError, match="only allowed for a local file"):
        pv.AptRepository(uri="https://example.invalid/repo", trusted=True)
    with pytest.raises(ValidationError, match="needs key_url"):
        pv.AptRepository(uri="https://example.invalid/repo")
    with pytest.raises(ValidationError, match="key_fingerprint"):
        pv.AptRepository(uri="https://example.invalid/repo", key_url="https://example.invalid/key")
    with pytest.raises(ValidationError, match="needs key_url"):
        pv.AptRepository(uri="file:/srv/repo")


def test_the_config_text_must_contain_the_named_config() -> None:
    with pytest.raises(ValidationError, match="no mig-configs entry"):
        pv.MigLayoutVars(config_yaml=CONFIG, config_name="all-balanced", expected_profiles={"1g.24gb": 2})
    with pytest.raises(ValidationError, match="not YAML"):
        pv.MigLayoutVars(config_yaml="a: [", config_name="x", expected_profiles={})


def test_profile_names_are_checked_and_zero_counts_dropped() -> None:
    with pytest.raises(ValidationError, match="not MIG profile names"):
        pv.MigLayoutVars(config_yaml=CONFIG, config_name="capi-gpu-2x1g.24gb-1x2g.48gb", expected_profiles={"1g": 1})
    mig = pv.MigLayoutVars(
        config_yaml=CONFIG,
        config_name="capi-gpu-2x1g.24gb-1x2g.48gb",
        expected_profiles={"1g.24gb": 2, "4g.96gb": 0, "1g.24gb+me": 0},
    )
    assert mig.expected_profiles == {"1g.24gb": 2} and mig.mig_enabled


def plan(layout_spec: MigLayout | None = None, mig_mode: MigMode = MigMode.STATIC) -> gpuplan.GPUPlan:
    return gpuplan.plan(GPUSpec(layout=layout_spec, mig_mode=mig_mode), "rtx-pro-6000")


def test_the_plans_layout_renders_the_config_the_role_copies() -> None:
    mig = pv.MigLayoutVars.of(plan(MigLayout(profiles={"1g.24gb": 2, "2g.48gb": 1})))
    assert mig.config_name == "2x1g.24gb_1x2g.48gb"
    assert mig.expected_profiles == {"1g.24gb": 2, "2g.48gb": 1}
    entry = yaml.safe_load(mig.config_yaml)["mig-configs"][mig.config_name][0]
    assert entry == {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.24gb": 2, "2g.48gb": 1}}
    assert pv.MigLayoutVars.of(plan(MigLayout(preset="all-balanced"))).config_name == "all-balanced"
    for whole in (plan(), plan(mig_mode=MigMode.DYNAMIC)):
        off = pv.MigLayoutVars.of(whole)
        assert not off.mig_enabled and "mig-enabled: false" in off.config_yaml


def test_a_layout_the_gpu_cannot_hold_never_becomes_playbook_vars() -> None:
    # The plan refuses it, with the condition reason, before any vars exist; the renderer refuses it too.
    with pytest.raises(gpuplan.PlanError, match="at most 2 fit") as err:
        plan(MigLayout(profiles={"2g.48gb": 3}))
    assert err.value.reason is Reason.IMPOSSIBLE_LAYOUT
    model = catalog.builtin_catalog().model("rtx-pro-6000")
    with pytest.raises(layout.LayoutError, match="at most 2 fit"):
        pv.MigLayoutVars.render(model, layout.Layout.of({"2g.48gb": 3}))


def test_a_private_network_reaches_the_run_as_the_vlan_interface_and_the_node_ip() -> None:
    """``VLANInterface.playbook_vars()`` is the contract with the role: passed through unchanged, validated,
    and the operator's own kubelet flags kept beside the node IP."""
    spec = PrivateNetworkSpec.model_validate(
        {"vswitch": {"vlan": 4000}, "subnet": "10.0.1.0/24", "routes": ["10.0.0.0/16"]}
    )
    allocated = private_network.allocate(spec, {}, "gpu/h1")
    assert isinstance(allocated, private_network.Allocated)
    interface = private_network.vlan_interface(spec, 4000, allocated).playbook_vars()
    base = pv.PlaybookVars(kubernetes_version="v1.36.3", mig=sample_layout(), kubelet_extra_args=("--v=2",))
    extra = pv.with_private_network(base, interface).extra_vars()
    assert extra["private_network"] == interface["private_network"]
    assert extra["private_network"] == {
        "vlan": 4000,
        "mtu": 1400,
        "address": "10.0.1.2/24",
        "gateway": "10.0.1.1",
        "routes": ["10.0.0.0/16"],
    }
    assert extra["kubelet_extra_args"] == ["--v=2", "--node-ip=10.0.1.2"]
    with pytest.raises(ValidationError):
        pv.with_private_network(base, {**interface, "private_network": {**interface["private_network"], "vlan": 1}})
