"""The typed extra vars of ``playbooks/site.yml``: what the controller may tell the node playbooks.

Why a model and not a dict: the playbooks' variables are an interface between two languages, and a
typo in a dict key is silently ignored by Ansible (the role default wins). Here every variable the
controller sets has one field, validated before anything reaches a host, and ``extra_vars()`` is the
only place that spells the role variable names. The roles' ``defaults/main.yml`` stay the single
home of the defaults: a field left ``None`` is not sent, so the role default applies.

The MIG layout arrives already rendered: ``MigLayoutVars.of`` takes the layout the GPU plan
(``capi_gpu.gpu.gpuplan``) resolved and validated, and renders its mig-parted config with
``capi_gpu.gpu.migparted``; the model itself only checks that the text names the config it claims to.
The spec is resolved once, by the plan, whose refusal carries the condition reason; so a bad layout
never reaches the playbook, and neither this module nor Jinja re-derives one.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from capi_gpu import domain
from capi_gpu.api.specs import GPUSpec
from capi_gpu.gpu import catalog, gpuplan, layout, migparted

DEFAULT_DRIVER_FLOOR: Final = catalog.builtin_catalog().model(gpuplan.DEFAULT_MODEL).min_driver.floor
"""The default model's floor: what the nvidia_driver role's own ``nvidia_driver_min_branch`` says (a unit
test holds the two equal), so a run that sends no floor is checked against the floor the role applies."""

_PROFILE = re.compile(r"^[0-9]+g\.[0-9]+gb([+-][a-z.]+)?$")


class AptRepository(BaseModel):
    """One apt source, as roles/apt_source takes it: signed by a key, or a trusted local file: repo."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: Annotated[str, Field(min_length=1, max_length=512, pattern=r"^(https?|file):\S+$")]
    suite: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^\S+$")] = "/"
    components: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+$")], ...] = ()
    key_url: Annotated[str | None, Field(max_length=512, pattern=r"^https?://\S+$")] = None
    key_fingerprint: Annotated[str | None, Field(pattern=r"^[0-9A-F]{40}$")] = None
    """The signing key's pinned OpenPGP fingerprint: the key fetched from key_url must carry it."""
    trusted: bool = False

    @model_validator(mode="after")
    def _signed_or_local(self) -> Self:
        if self.trusted and not self.uri.startswith("file:"):
            raise ValueError("trusted (unsigned) is only allowed for a local file: repository")
        if not self.trusted and (self.key_url is None or self.key_fingerprint is None):
            raise ValueError("a network repository needs key_url and key_fingerprint (its pinned signing key)")
        return self

    def wire(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "suite": self.suite,
            "components": list(self.components),
            "key_url": self.key_url or "",
            "key_fingerprint": self.key_fingerprint or "",
            "trusted": self.trusted,
        }


class MigLayoutVars(BaseModel):
    """The validated layout, as the mig_layout role takes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config_yaml: Annotated[str, Field(min_length=1, max_length=65536)]
    """The mig-parted config text rendered by capi_gpu.gpu.layout."""
    config_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,62}$")]
    """The config inside ``config_yaml`` to apply."""
    expected_profiles: dict[str, Annotated[int, Field(ge=0, le=16)]]
    """Profile -> instance count ``nvidia-smi -L`` must show; empty means MIG disabled."""

    @field_validator("expected_profiles")
    @classmethod
    def _profile_names(cls, value: dict[str, int]) -> dict[str, int]:
        bad = [name for name in value if not _PROFILE.match(name)]
        if bad:
            raise ValueError(f"not MIG profile names: {bad}")
        return {name: count for name, count in value.items() if count > 0}

    @model_validator(mode="after")
    def _config_is_named(self) -> Self:
        try:
            doc = yaml.safe_load(self.config_yaml)
        except yaml.YAMLError as exc:
            raise ValueError(f"config_yaml is not YAML: {exc}") from exc
        configs = doc.get("mig-configs") if isinstance(doc, dict) else None
        if not isinstance(configs, dict) or self.config_name not in configs:
            raise ValueError(f"config_yaml has no mig-configs entry {self.config_name!r}")
        return self

    @property
    def mig_enabled(self) -> bool:
        return bool(self.expected_profiles)

    @classmethod
    def of(cls, plan: gpuplan.GPUPlan) -> MigLayoutVars:
        """The plan's layout as the role takes it; a whole GPU (or Dynamic MIG) renders MIG off."""
        return cls.render(plan.model, plan.layout, plan.preset)

    @classmethod
    def render(cls, model: catalog.GpuModel, chosen: layout.Layout | None, name: str | None = None) -> MigLayoutVars:
        """Render ``chosen`` (``None``: MIG off) under ``name`` (default: the layout key).

        ``chosen`` is a resolved layout, normally a ``GPUPlan``'s; ``migparted.render`` still refuses one the
        GPU cannot hold (``capi_gpu.gpu.layout.LayoutError``), so no path renders a bad layout.
        """
        if chosen is None:
            return cls(
                config_yaml=migparted.render(model, {"mig-disabled": None}),
                config_name="mig-disabled",
                expected_profiles={},
            )
        name = name or layout.layout_key(chosen)
        return cls(
            config_yaml=migparted.render(model, {name: chosen}),
            config_name=name,
            expected_profiles=chosen.as_dict(),
        )


class PrivateNetworkVars(BaseModel):
    """The VLAN interface on the NIC carrying the main IP (docs/private-network.md, Configure), as
    ``private_network.vlan_interface(...).playbook_vars()`` builds it: the role's ``private_network``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vlan: Annotated[int, Field(ge=4000, le=4091)]
    mtu: Annotated[int, Field(ge=1280, le=1400)]
    address: Annotated[str, Field(pattern=r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$")]
    """The host's address with the subnet's prefix, 10.0.1.10/24."""
    gateway: Annotated[str, Field(pattern=r"^([0-9]{1,3}\.){3}[0-9]{1,3}$")]
    routes: tuple[Annotated[str, Field(pattern=r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$")], ...] = ()
    """Networks reached through the gateway."""


class PlaybookVars(BaseModel):
    """Everything the controller sets for one run of site.yml; ``None`` fields keep the role default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kubernetes_version: Annotated[str, Field(pattern=r"^v?1\.[0-9]+\.[0-9]+$")]
    """The cluster's version; kubelet/kubeadm/kubectl are pinned to it (kubelet_kubernetes_version)."""
    mig: MigLayoutVars
    """The layout (mig_layout_config_yaml, mig_layout_config_name, mig_layout_expected_profiles)."""
    driver_branch: Annotated[str, Field(pattern=r"^[0-9]{3}$")] = "580"
    """NVIDIA driver branch (nvidia_driver_branch)."""
    driver_floor: Annotated[int, Field(ge=100, le=999)] | None = None
    """The GPU model's lowest branch, its catalog ``min_driver`` (nvidia_driver_min_branch); unset: the role's
    default, which is the default model's."""
    nvidia_repo: AptRepository | None = None
    """NVIDIA's CUDA repository (nvidia_driver_repo)."""
    container_toolkit_repo: AptRepository | None = None
    """NVIDIA's container toolkit repository (container_toolkit_repo)."""
    containerd_repo: AptRepository | None = None
    """Docker's repository for containerd.io (container_toolkit_containerd_repo)."""
    kubernetes_repo: AptRepository | None = None
    """pkgs.k8s.io for the version's minor (kubelet_repo)."""
    mig_parted: Annotated[str | None, Field(max_length=512, pattern=r"^/\S+$")] = None
    """The operator-local nvidia-mig-parted the role copies to the host (mig_layout_parted_src): the default
    route, the binary the operator ships (``shipped_mig_parted``)."""
    mig_parted_sha256: Annotated[str | None, Field(pattern=r"^[0-9a-f]{64}$")] = None
    """Its SHA-256, checked on the host after the copy and at every boot (mig_layout_parted_sha256)."""
    mig_parted_exec: Annotated[str | None, Field(max_length=256, pattern=r"^/[A-Za-z0-9._/-]+$")] = None
    """Test-only: the program the role and the boot unit run as nvidia-mig-parted (mig_layout_parted_exec). The
    simulation sets its GPU shim's, because the real binary needs NVML; the shipped binary is still copied,
    checked and run (``--version``). Unset on a real server: the copied binary itself."""
    mig_manager_deb: Annotated[str | None, Field(max_length=512, pattern=r"^(https://|/)\S+\.deb$")] = None
    """The optional .deb route: URL or node-local path of an nvidia-mig-manager .deb (mig_layout_manager_deb),
    for a user who vetted one; only with its checksum."""
    mig_manager_deb_sha256: Annotated[str | None, Field(pattern=r"^[0-9a-f]{64}$")] = None
    """The .deb's pinned SHA-256 (mig_layout_manager_deb_sha256): NVIDIA publishes none, so the user supplies it."""
    driver_route: Literal["auto", "nvidia-dkms", "ubuntu-precompiled"] | None = None
    """Where the NVIDIA kernel module comes from (nvidia_driver_route; the role's default is auto: Ubuntu's
    precompiled module where the archive has it for the running kernel); never mixed with the other's user space."""
    node_labels: dict[str, str] | None = None
    """Labels kubelet registers with (kubelet_node_labels)."""
    gate_driver: str = domain.GATE_DRIVER
    private_network: PrivateNetworkVars | None = None
    """The cluster's private network (private_network); unset: no VLAN interface."""
    kubelet_extra_args: tuple[Annotated[str, Field(pattern=r"^--[a-z-]+=\S+$")], ...] = ()
    """Extra kubelet flags (kubelet_extra_args), such as --node-ip=<private address>; empty: the role default."""
    """The gate DRA driver whose kubelet plugin dir dra_node creates (dra_node_gate_driver)."""

    @model_validator(mode="after")
    def _branch_meets_floor(self) -> Self:
        # The role would refuse it on the host; refused here, no host is touched. node_vars refuses it first
        # with the plan's reason (DriverTooOld), so this only guards a PlaybookVars built another way.
        floor = DEFAULT_DRIVER_FLOOR if self.driver_floor is None else self.driver_floor
        if int(self.driver_branch) < floor:
            raise ValueError(f"driver branch {self.driver_branch} is below the GPU model's floor {floor}")
        return self

    @model_validator(mode="after")
    def _one_vetted_mig_parted(self) -> Self:
        # The role refuses these too; refused here, the operator's flag is wrong before any host is touched.
        if self.mig_manager_deb is not None and self.mig_manager_deb_sha256 is None:
            raise ValueError(
                "mig_manager_deb needs mig_manager_deb_sha256: NVIDIA publishes no checksum for the .deb, "
                "so the route is only for a .deb whose checksum you computed from a vetted download"
            )
        if (self.mig_parted is None) != (self.mig_parted_sha256 is None):
            raise ValueError("mig_parted and mig_parted_sha256 go together: the host checks the copy against it")
        return self

    def extra_vars(self) -> dict[str, Any]:
        """The role variables, by their role-prefixed names; unset optionals are left out."""
        out: dict[str, Any] = {
            "kubelet_kubernetes_version": self.kubernetes_version.removeprefix("v"),
            "nvidia_driver_branch": self.driver_branch,
            "mig_layout_config_yaml": self.mig.config_yaml,
            "mig_layout_config_name": self.mig.config_name,
            "mig_layout_expected_profiles": dict(self.mig.expected_profiles),
            "dra_node_gate_driver": self.gate_driver,
        }
        repos = {
            "nvidia_driver_repo": self.nvidia_repo,
            "container_toolkit_repo": self.container_toolkit_repo,
            "container_toolkit_containerd_repo": self.containerd_repo,
            "kubelet_repo": self.kubernetes_repo,
        }
        out.update({name: repo.wire() for name, repo in repos.items() if repo is not None})
        optional = {
            "mig_layout_parted_src": self.mig_parted,
            "mig_layout_parted_sha256": self.mig_parted_sha256,
            "mig_layout_parted_exec": self.mig_parted_exec,
            "mig_layout_manager_deb": self.mig_manager_deb,
            "mig_layout_manager_deb_sha256": self.mig_manager_deb_sha256,
        }
        out.update({name: value for name, value in optional.items() if value is not None})
        if self.driver_floor is not None:
            out["nvidia_driver_min_branch"] = self.driver_floor
        if self.driver_route is not None:
            out["nvidia_driver_route"] = self.driver_route
        if self.node_labels is not None:
            out["kubelet_node_labels"] = dict(self.node_labels)
        if self.private_network is not None:
            out["private_network"] = {**self.private_network.model_dump(), "routes": list(self.private_network.routes)}
        if self.kubelet_extra_args:
            out["kubelet_extra_args"] = list(self.kubelet_extra_args)
        return out


PER_NODE: Final = frozenset({"kubernetes_version", "mig", "driver_branch", "driver_floor", "private_network"})
"""PlaybookVars each node gets from its own objects (the Machine's version, its layout and branch, the model's
floor, its cluster's private network): never the operator's --playbook-vars."""


def check_overrides(overrides: dict[str, Any]) -> None:
    """The operator's --playbook-vars as every node's run would take them, checked once when the operator (or
    ``nodes relayout``) starts, so a bad flag stops it with a message instead of failing each host's Configure.
    ValueError names the per-node keys, or each field the model refuses."""
    per_node = sorted(PER_NODE & overrides.keys())
    if per_node:
        raise ValueError(
            f"--playbook-vars sets {', '.join(per_node)}: each node takes these from its own Machine, layout and "
            "cluster; remove them from the file"
        )
    plan = gpuplan.plan(GPUSpec(), gpuplan.DEFAULT_MODEL)  # the default machine: what varies per node is not here
    try:
        node_vars("v1.36.0", plan, str(plan.model.min_driver.floor), overrides)
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'vars'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"--playbook-vars refused: {why}") from None


def node_vars(
    kubernetes_version: str, plan: gpuplan.GPUPlan, driver_branch: str, overrides: dict[str, Any] | None = None
) -> PlaybookVars:
    """site.yml's variables for one node: the one builder Configure and relayout share, so the hostile-field
    test drives the same code that a host's run does. ``overrides`` are the operator's --playbook-vars.

    Raises ``gpuplan.PlanError`` (DriverTooOld) for a branch below the plan's model's floor, the refusal
    admission and LayoutValid give, and pydantic's ``ValidationError`` for bad overrides; the role is sent
    the model's floor, so a host checks the same number."""
    gpuplan.check_driver(driver_branch, plan.model)
    if PER_NODE & (overrides or {}).keys():  # check_overrides refused these at start; never a TypeError here
        raise ValueError(f"--playbook-vars sets per-node variables {sorted(PER_NODE & (overrides or {}).keys())}")
    return PlaybookVars(
        kubernetes_version=kubernetes_version,
        mig=MigLayoutVars.of(plan),
        driver_branch=driver_branch,
        driver_floor=plan.model.min_driver.floor,
        **(overrides or {}),
    )


def with_private_network(variables: PlaybookVars, interface: dict[str, Any]) -> PlaybookVars:
    """``variables`` plus a private network's VLAN interface and node IP (``VLANInterface.playbook_vars()``),
    validated like every field; the operator's own kubelet flags stay, the node IP is added to them."""
    args = (*variables.kubelet_extra_args, *interface.get("kubelet_extra_args", ()))
    return PlaybookVars.model_validate(
        {**dict(variables), "private_network": interface["private_network"], "kubelet_extra_args": args}
    )
