"""HetznerGPUHost: one leased Robot server in the inventory, and everything learned about it.

Status holds what the world can't tell us again: the pinned SSH host keys, the destructive operations
requested and their outcome, the boot id, the error count. A restarted controller resumes from here and
never repeats an operation it already recorded (see ``provisioning.states``).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field

from capi_gpu.api.base import Conditions, KubeModel, ObjectReference, cel, immutable, validations
from capi_gpu.api.network import HostPrivateNetwork
from capi_gpu.api.specs import GPUSpec, InstallImageSpec


class HostState(StrEnum):
    REGISTERING = "Registering"
    INSPECTING = "Inspecting"
    AVAILABLE = "Available"
    STANDBY_PREPARING = "StandbyPreparing"
    STANDBY = "Standby"
    PROVISIONING = "Provisioning"
    PROVISIONED = "Provisioned"
    DEPROVISIONING = "Deprovisioning"
    ERROR = "Error"
    MAINTENANCE = "Maintenance"
    DELETING = "Deleting"


class Step(StrEnum):
    """Sub-steps of inspecting, preparing and provisioning, in order."""

    RESCUE = "Rescue"  # rescue activated in Robot, reset sent, waiting for rescue SSH
    INSPECT = "Inspect"  # disks by WWN, GPU from lspci
    CHECK_DISKS = "CheckDisks"  # SMART and other-Linux checks
    WIPE = "Wipe"
    INSTALL = "Install"  # installimage running detached
    REBOOT_OS = "RebootOS"  # reboot into the installed OS, waiting for pinned-key SSH
    CONFIGURE = "Configure"  # Ansible: driver, toolkit + CDI, MIG layout, DRA prerequisites, kubelet
    MIG_REBOOT = "MIGReboot"  # MIG mode needs a reboot; counted, never looping
    BOOTSTRAP = "Bootstrap"  # cloud-config, then the sentinel
    DONE = "Done"


class ErrorType(StrEnum):
    REGISTRATION = "RegistrationError"
    INSPECTION = "InspectionError"
    PROVISIONING = "ProvisioningError"
    REBOOT_TIMEOUT = "RebootTimeout"
    HOST_KEY_MISMATCH = "HostKeyMismatch"
    INSTALL_FAILED = "InstallImageFailed"
    ANSIBLE_FAILED = "AnsibleFailed"
    # Configure's variables were refused before Ansible ran (a driver branch below the GPU model's floor, the
    # operator's --playbook-vars the roles would not take): nothing ran on the host; fix the spec or the flag.
    CONFIGURATION_REFUSED = "ConfigurationRefused"
    BOOTSTRAP_FAILED = "BootstrapFailed"
    DISK_CHECK_FAILED = "DiskCheckFailed"
    OTHER_LINUX_FOUND = "OtherLinuxFound"
    DEPROVISIONING = "DeprovisioningError"
    ROBOT = "RobotError"
    IMAGE_CHECKSUM_MISMATCH = "ImageChecksumMismatch"  # spec.image's archive is not the one its sha256 names
    IMAGE_MISMATCH = "ImageMismatch"  # spec.image's manifest does not fit the machine, fallback Fail


WWN_PATTERN = r"^(0x|eui\.|nvme-eui\.|naa\.)?[0-9a-fA-F.]+$"


class RootDeviceHints(KubeModel):
    """Which disks to install on, by WWN (device names change between rescue and the OS)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!(has(self.wwn) && has(self.raidWWNs))",
                "wwn and raidWWNs are mutually exclusive: wwn names one disk, raidWWNs the disks of a RAID",
                reason="FieldValueForbidden",
            ),
        )
    )

    wwn: Annotated[str | None, Field(pattern=WWN_PATTERN)] = None
    """One disk by WWN."""
    # Each one lands in installimage's config (a DRIVE line), so each has the one form a WWN has.
    raid_wwns: Annotated[list[Annotated[str, Field(pattern=WWN_PATTERN)]] | None, Field(min_length=2, max_length=8)] = (
        None
    )
    """Two or more disks by WWN for software RAID."""


class HostStandby(KubeModel):
    """Keep this host prepared (installed OS, driver, MIG layout) but not joined."""

    install_image: InstallImageSpec = InstallImageSpec()
    """OS image settings."""
    gpu: GPUSpec = GPUSpec()
    """GPU stack and layout."""
    kubernetes_version: Annotated[str, Field(pattern=r"^v1\.[0-9]+\.[0-9]+$")] = "v1.36.3"
    """kubelet/kubeadm version."""
    template: str | None = None
    """HetznerGPUMachineTemplate whose standby pool set this; empty when set by hand."""


class RobotAccess(KubeModel):
    """How the controller reaches this server: Robot account and SSH key, as Secrets in the namespace.
    The Robot URL is the operator's (--robot-url), never an object's: a user who may edit hosts must not
    be able to send the account's credentials to a server of their choosing."""

    credentials_secret: Annotated[str, Field(min_length=1, max_length=253)] = "robot-credentials"
    """Secret with keys robot-user and robot-password (a Robot webservice user)."""
    ssh_key_secret: Annotated[str, Field(min_length=1, max_length=253)] = "robot-ssh"
    """Secret with ssh-privatekey and ssh-publickey; authorized in rescue and in the installed OS."""


class HetznerGPUHostSpec(KubeModel):
    """A leased Robot server offered to the pool."""

    server_number: Annotated[
        int,
        Field(
            ge=1,
            json_schema_extra=immutable(
                "serverNumber is immutable: create a new HetznerGPUHost for another server "
                "(and delete this one once it is not in use)"
            ),
        ),
    ]
    """Robot server number."""
    robot: RobotAccess = RobotAccess()
    """Robot account and SSH key used for this server."""
    description: Annotated[str | None, Field(max_length=1024)] = None
    """Free text for operators."""
    maintenance_mode: bool = False
    """Take the host out of the pool; a consumer Machine is marked for remediation."""
    root_device_hints: RootDeviceHints | None = None
    """Install target disks; the controller picks the inspected NVMe disks when unset."""
    standby: HostStandby | None = None
    """Prepare the host up to, not including, the join, so a scale-up costs one bootstrap."""
    consumer_ref: ObjectReference | None = None
    """The HetznerGPUMachine using this host. Set by the controller with a conflict-safe patch; in spec
    so clusterctl move (which never restores status) keeps it."""
    retired: bool = False
    """Retired hosts are never chosen again (remediation onExhaustion=Retire, or by hand)."""


class DiskInfo(KubeModel):
    """A disk seen in rescue."""

    wwn: str
    """World wide name (stable across boots)."""
    size_bytes: Annotated[int, Field(ge=0)]
    """Size."""
    model: str = ""
    """Model string."""
    serial: str = ""
    """Serial number."""
    rotational: bool = False
    """Spinning disk."""


class GPUInfo(KubeModel):
    """A GPU seen on the PCI bus."""

    vendor_id: Annotated[str, Field(pattern=r"^[0-9a-f]{4}$")]
    """PCI vendor id (10de is NVIDIA)."""
    device_id: Annotated[str, Field(pattern=r"^[0-9a-f]{4}$")]
    """PCI device id."""
    model: str = ""
    """Catalog name, e.g. rtx-pro-6000; empty if the catalog doesn't know it."""
    mig_capable: bool = False
    """MIG-capable according to the GPU catalog."""
    pci_address: str = ""
    """Bus address, e.g. 0000:01:00.0."""


class HardwareDetails(KubeModel):
    """What inspection found; the template controller derives scale-from-zero capacity from it."""

    cpu_threads: Annotated[int, Field(ge=0)] = 0
    """Logical CPUs."""
    memory_mib: Annotated[int, Field(ge=0)] = 0
    """RAM."""
    disks: list[DiskInfo] = []
    """Disks by WWN."""
    gpus: list[GPUInfo] = []
    """GPUs."""


class RescueHostKey(KubeModel):
    """A rescue host key as Robot reports it."""

    type: str
    """Key type as Robot names it (RSA, ED25519, ECDSA)."""
    fingerprint: Annotated[str, Field(pattern=r"^([0-9a-f]{2}:){15}[0-9a-f]{2}$")]
    """MD5 fingerprint."""


class HostKeys(KubeModel):
    """Pinned SSH host keys. Public material only."""

    rescue: list[RescueHostKey] = []
    """Keys of the current rescue activation, from Robot's rescue response."""
    os: str | None = None
    """The installed OS's public host key (OpenSSH line), generated by the controller."""


class MigInstance(KubeModel):
    """A GPU instance as the host's own ``nvidia-smi mig -lgi`` reported it after the layout was applied."""

    gpu: Annotated[int, Field(ge=0)]
    """GPU index."""
    minor: Annotated[int, Field(ge=0)] | None = None
    """The GPU's minor number (``nvidia-smi -q -x``), which the DRA driver names devices after."""
    profile: Annotated[str, Field(max_length=32)]
    """Profile name, e.g. 1g.24gb."""
    profile_id: Annotated[int, Field(ge=0)]
    """GPU instance profile ID."""
    instance_id: Annotated[int, Field(ge=0)]
    """GPU instance ID."""
    placement_start: Annotated[int, Field(ge=0)]
    """Placement start, the slot NVML chose."""
    placement_size: Annotated[int, Field(ge=0)]
    """Placement size."""


class Operation(KubeModel):
    """A step that must not be repeated blindly, recorded before it is sent and completed after."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z-]{0,31}$")]
    """What was sent: activate-rescue, reset-sw, reset-hw, reset-ssh, wipe, installimage, mig-reboot, bootstrap,
    kubeadm-reset, configure (an Ansible run, named on the server by its requestedAt)."""
    attempt: Annotated[int, Field(ge=1)] = 1
    """Attempt number within the current step."""
    requested_at: datetime
    """When it was recorded as requested (before sending)."""
    completed_at: datetime | None = None
    """When its outcome was recorded."""
    outcome: str | None = None
    """Sent, Failed: <reason>, ..."""


class HetznerGPUHostStatus(KubeModel):
    """Observed state of the host."""

    state: HostState = HostState.REGISTERING
    """Lifecycle state."""
    step: Step | None = None
    """Sub-step within Inspecting, StandbyPreparing or Provisioning."""
    step_started_at: datetime | None = None
    """When the current step began (drives the reboot ladder timeouts)."""
    server_name: str | None = None
    """Robot server name."""
    ipv4: str | None = None
    """Main IPv4."""
    ipv6: str | None = None
    """IPv6 address (server_ipv6_net + 1)."""
    datacenter: str | None = None
    """Robot dc, e.g. FSN1-DC14."""
    product: str | None = None
    """Robot product, e.g. GEX131."""
    reset_types: list[str] = []
    """Reset types Robot offers for this server."""
    hardware: HardwareDetails | None = None
    """Inspected hardware."""
    host_keys: HostKeys = HostKeys()
    """Pinned host keys."""
    boot_id: str | None = None
    """Boot id last seen over SSH; a change proves a reboot happened."""
    operations: Annotated[list[Operation], Field(max_length=32)] = []
    """Recent destructive operations, newest last."""
    reboot_attempts: Annotated[int, Field(ge=0)] = 0
    """MIG reboots in the current provisioning."""
    prepared: str | None = None
    """Key of the image + GPU settings the host is prepared with (standby matching)."""
    layout: str | None = None
    """MIG layout key applied on the host."""
    mig_devices: list[str] = []
    """MIG instances nvidia-smi reported after the layout was applied (profile names, sorted)."""
    mig_instances: Annotated[list[MigInstance], Field(max_length=16)] = []
    """The GPU instances and placements nvidia-smi reported at provisioning; the gate expects the DRA device
    names built from them. Empty when unknown (then the gate counts devices by profile)."""
    private_network: HostPrivateNetwork | None = None
    """The host's address on its cluster's vSwitch and its membership; set while a cluster with
    spec.privateNetwork holds the host, dropped when the host is released (which frees the address)."""
    error_type: ErrorType | None = None
    """Class of the last error."""
    error_permanent: bool = False
    """A human must act (remove the permanent-error annotation) before the host is used again."""
    resume_state: HostState | None = None
    """State to resume after a retryable error's backoff."""
    resume_step: Step | None = None
    """Step to resume after a retryable error's backoff."""
    error_count: Annotated[int, Field(ge=0)] = 0
    """Consecutive errors; drives backoff."""
    error_message: str | None = None
    """Last error, sanitized."""
    last_error_at: datetime | None = None
    """When the last error happened."""
    conditions: Conditions = []
    """Ready, Inspected, Provisioned, RobotReachable, ..."""


class HetznerGPUHost(KubeModel):
    """A leased Hetzner Robot GPU server in the host pool."""

    api_version: str = "infrastructure.cluster.x-k8s.io/v1alpha1"
    kind: str = "HetznerGPUHost"
    metadata: dict[str, object] = {}
    spec: HetznerGPUHostSpec
    status: HetznerGPUHostStatus = HetznerGPUHostStatus()
