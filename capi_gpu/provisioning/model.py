"""The vocabulary of the host state machine: what it observes, what it asks for, what comes back.

Kept apart from ``states`` so the controller, the executors and the tests share one closed set of
probes, actions and results, and ``states`` stays a set of pure decisions over them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any

from capi_gpu.api.host import ErrorType, HardwareDetails, HetznerGPUHostStatus, MigInstance, RescueHostKey


class Probe(StrEnum):
    """Read-only looks the controller takes before a decision (cheap, never destructive)."""

    ROBOT_SERVER = "robot-server"  # cached server list
    ROBOT_RESCUE = "robot-rescue"  # GET /boot/{n}/rescue
    SSH_RESCUE = "ssh-rescue"  # connect with the rescue pin
    SSH_OS = "ssh-os"  # connect with the OS pin
    INSTALL = "install"  # installimage progress (needs SSH_RESCUE)
    BOOTSTRAP = "bootstrap"  # sentinel + cloud-init status (needs SSH_OS)


class SSHOutcome(StrEnum):
    OK = "ok"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    AUTH_FAILED = "auth-failed"
    KEY_MISMATCH = "key-mismatch"
    ERROR = "error"


class PresentedKey(StrEnum):
    """On a key mismatch: which of our pins the server's key matches instead, if any."""

    RESCUE = "rescue"
    OS = "os"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SSHProbe:
    outcome: SSHOutcome
    hostname: str | None = None
    boot_id: str | None = None
    presented: PresentedKey | None = None
    message: str = ""


@dataclass(frozen=True)
class ServerFacts:
    number: int
    name: str
    ipv4: str | None
    ipv6: str | None
    datacenter: str
    product: str
    status: str  # "ready" or "in process"
    cancelled: bool = False


class InstallProgress(StrEnum):
    NOT_STARTED = "not-started"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class CloudInitState(StrEnum):
    """``cloud-init status`` as ``hostfacts.parse_cloud_init_status`` reads it off the host: the parser and the
    state machine share this one enum, so a new value cannot be read without being decided on."""

    NOT_STARTED = "not started"
    RUNNING = "running"
    DONE = "done"
    ERROR = "error"
    DISABLED = "disabled"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Observations:
    """What the controller saw; ``None`` means "not probed this time"."""

    server: ServerFacts | None = None
    server_missing: bool = False
    reset_types: tuple[str, ...] = ()
    rescue_active: bool | None = None
    rescue_keys: tuple[RescueHostKey, ...] = ()
    ssh: SSHProbe | None = None
    install: InstallProgress | None = None
    install_log: str = ""
    sentinel: bool | None = None
    cloud_init: CloudInitState | None = None
    claimed: bool = False  # spec.consumerRef is set
    consumer_prepared: str | None = None  # prepared key the consumer wants
    consumer_image_key: str | None = None  # image-only key the consumer wants (re-prepare shortcut)
    bootstrap_ready: bool = False  # the consumer's bootstrap data is readable and well-formed
    deprovision: bool = False  # consumer released the host (machine deleted)
    reboot_requested: bool = False  # remediation asked for a hardware reset
    reinspect: bool = False  # an operator asked for a fresh inspection (capi-gpu hosts inspect)
    mig_reboot_needed: bool = False
    vswitch_before_join: str | None = None  # why the kubeadm join waits for the vSwitch (None: it need not)
    private_network_configure: bool = False  # the claim's cluster has spec.privateNetwork (built or not yet)
    vswitch_before_configure: str | None = None  # why Configure waits for the VLAN interface (None: it need not)
    vswitch_before_release: str | None = None  # why Deprovisioning waits for the vSwitch leave (None: it need not)


class ActionKind(StrEnum):
    ACTIVATE_RESCUE = "activate-rescue"  # ensure the rescue key in Robot, POST /boot/{n}/rescue
    RESET_SW = "reset-sw"
    RESET_HW = "reset-hw"
    SSH_REBOOT = "reset-ssh"
    INSPECT = "inspect"  # disks by WWN, GPU from lspci, RAM, CPUs
    CHECK_DISKS = "check-disks"  # SMART + other-Linux
    WIPE = "wipe"
    START_INSTALL = "installimage"
    CONFIGURE = "configure"  # Ansible
    MIG_REBOOT = "mig-reboot"
    BOOTSTRAP = "bootstrap"
    KUBEADM_RESET = "kubeadm-reset"


# Destructive actions are recorded in status.operations before they are sent.
DESTRUCTIVE: frozenset[ActionKind] = frozenset(
    {
        ActionKind.ACTIVATE_RESCUE,
        ActionKind.RESET_SW,
        ActionKind.RESET_HW,
        ActionKind.SSH_REBOOT,
        ActionKind.WIPE,
        ActionKind.START_INSTALL,
        ActionKind.MIG_REBOOT,
    }
)
# Recorded so a restarted controller knows they were (maybe) sent. Configure too: its requestedAt names the
# Ansible run in the marker it leaves on the server, which a host moved mid-run reads (``handover``).
RECORDED: frozenset[ActionKind] = DESTRUCTIVE | {ActionKind.BOOTSTRAP, ActionKind.KUBEADM_RESET, ActionKind.CONFIGURE}
# Actions during which a host carries clusterctl's block-move. Not Configure: a real run outlasts clusterctl's
# wait (about 6 minutes), and the server's run marker hands it over instead (``handover``).
BLOCK_MOVE_WHILE: frozenset[ActionKind] = frozenset(ActionKind) - {ActionKind.CONFIGURE}
RESETS: frozenset[ActionKind] = frozenset(
    {
        ActionKind.RESET_SW,
        ActionKind.RESET_HW,
        ActionKind.SSH_REBOOT,
        ActionKind.MIG_REBOOT,
    }
)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    standby: bool = False  # preparing for standby (no bootstrap) rather than for a consumer


class Outcome(StrEnum):
    OK = "ok"
    FAILED = "failed"
    DEFERRED = "deferred"  # not sent: budget, circuit, concurrency limit or missing input


@dataclass(frozen=True)
class ActionResult:
    outcome: Outcome
    message: str = ""
    error_type: ErrorType | None = None
    permanent: bool = False
    retry_after: float | None = None
    rescue_keys: tuple[RescueHostKey, ...] = ()
    hardware: HardwareDetails | None = None
    reboot_needed: bool = False
    mig_devices: tuple[str, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()  # -lgi after CONFIGURE; empty when it could not be read
    boot_id: str | None = None
    prepared: str | None = None  # key of image + GPU settings the host now carries (after CONFIGURE)
    layout: str | None = None  # MIG layout key applied (after CONFIGURE)

    @classmethod
    def ok(cls, **kw: object) -> ActionResult:
        return cls(Outcome.OK, **kw)  # type: ignore[arg-type]

    @classmethod
    def failed(cls, error_type: ErrorType, message: str, permanent: bool = False) -> ActionResult:
        return cls(Outcome.FAILED, message=message, error_type=error_type, permanent=permanent)

    @classmethod
    def deferred(cls, retry_after: float, message: str = "") -> ActionResult:
        return cls(Outcome.DEFERRED, message=message, retry_after=retry_after)


@dataclass(frozen=True)
class Note:
    """An Event to emit: reason (CamelCase), message, warning or not."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Decision:
    status: HetznerGPUHostStatus
    action: Action | None = None
    requeue_after: float | None = None
    notes: tuple[Note, ...] = ()
    probes: frozenset[Probe] = field(default_factory=frozenset)


_COUNTS = frozenset({"max_retries", "max_mig_reboots"})
# Bounds on work the host does at its own speed (installimage, cloud-init and the join): a time-compressed
# simulation compresses boots, resets and Robot, not this work, so scaling these bounds would fail hosts
# that are merely busy (at 20 hosts on 2 CPUs, 20 installimages at once outran a 40 s bound).
_WORK = frozenset({"install", "bootstrap"})


@dataclass(frozen=True)
class Timing:
    """Timeouts in seconds; defaults from CAPH (GPU servers boot slowly, so they are not shorter)."""

    ssh_reboot: float = 8 * 60.0  # SSH reboot -> escalate to Robot sw
    reset_sw: float = 10 * 60.0  # sw -> escalate to hw
    reset_hw: float = 10 * 60.0  # hw -> error
    refused_grace: float = 10 * 60.0  # connection refused after a boot, before it counts as failure
    reboot_debounce: float = 15.0  # never re-trigger sooner
    install: float = 40 * 60.0
    bootstrap: float = 20 * 60.0
    poll: float = 10.0  # how often a waiting step looks again
    error_backoff_base: float = 60.0
    error_backoff_cap: float = 8 * 3600.0
    max_retries: int = 3  # retryable failures before the error becomes permanent
    max_mig_reboots: int = 1

    def scaled(self, factor: float) -> Timing:
        """The waits on hardware and Robot, the polls and the backoff divided by ``factor`` (tests and the
        time-compressed simulator); the bounds on the host's own work are kept."""
        if factor <= 0:
            raise ValueError("factor must be positive")
        kw: dict[str, Any] = {
            k: float(v) / factor for k, v in self.__dict__.items() if k not in _COUNTS and k not in _WORK
        }
        return replace(self, **kw)

    def backoff(self, error_count: int) -> timedelta:
        seconds = min(self.error_backoff_cap, self.error_backoff_base * (2 ** max(0, error_count - 1)))
        return timedelta(seconds=seconds)
