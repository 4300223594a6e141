"""Condition types and reasons, and the one pure function that sets a condition.

Reasons are part of the API (runbooks say "if the reason is X, do Y"), so they are enums here: the
reasons on our own objects, and the readiness gate's on objects that are not ours (Nodes, CAPI Machines,
ResourceClaims), so that a reason is spelled in one module whoever writes it. As in CAPI core, conditions
are derived in one place from what a reconcile found, never read back to decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from capi_gpu.api.base import Condition, ConditionStatus


class Type(StrEnum):
    READY = "Ready"
    PAUSED = "Paused"
    # host
    INSPECTED = "Inspected"
    PROVISIONED = "Provisioned"
    ROBOT_REACHABLE = "RobotReachable"
    # machine
    HOST_ASSOCIATED = "HostAssociated"
    HOST_READY = "HostReady"
    LAYOUT_VALID = "LayoutValid"
    BOOTSTRAP_DATA_READY = "BootstrapDataReady"
    # cluster
    ROBOT_CREDENTIALS_VALID = "RobotCredentialsValid"
    LOAD_BALANCER_READY = "LoadBalancerReady"
    WORKLOAD_KUBECONFIG_VALID = "WorkloadKubeconfigValid"
    ADDONS_READY = "AddonsReady"
    GATE_FEATURES_AVAILABLE = "GateFeaturesAvailable"
    # cluster and host: spec.privateNetwork's vSwitch (docs/private-network.md)
    PRIVATE_NETWORK_READY = "PrivateNetworkReady"
    # template
    CAPACITY_KNOWN = "CapacityKnown"
    STANDBY_POOL_READY = "StandbyPoolReady"


class Reason(StrEnum):
    READY = "Ready"
    PAUSED = "Paused"
    NOT_PAUSED = "NotPaused"
    WAITING_FOR_INFRASTRUCTURE = "WaitingForClusterInfrastructure"
    WAITING_FOR_BOOTSTRAP_DATA = "WaitingForBootstrapData"
    WAITING_FOR_MACHINE_OWNER = "WaitingForMachineOwner"
    NO_MATCHING_HOST = "NoMatchingHost"
    HOST_CLAIMED = "HostClaimed"
    PROVISIONING = "Provisioning"
    PROVISIONED = "Provisioned"
    DELAYED = "Delayed"
    HOST_ERROR = "HostError"
    IMPOSSIBLE_LAYOUT = "ImpossibleLayout"
    UNKNOWN_GPU_MODEL = "UnknownGPUModel"
    DYNAMIC_MIG_WITH_LAYOUT = "DynamicMIGWithLayout"
    DRIVER_TOO_OLD = "DriverTooOld"
    DUPLICATE_SERVER = "DuplicateServer"
    SECRET_MISSING = "SecretMissing"
    SECRET_INVALID = "SecretInvalid"
    CREDENTIALS_REJECTED = "CredentialsRejected"
    RATE_LIMITED = "RateLimited"
    ROBOT_UNAVAILABLE = "RobotUnavailable"
    DELETING = "Deleting"
    INSPECTING = "Inspecting"
    AVAILABLE = "Available"
    STANDBY = "Standby"
    MAINTENANCE = "Maintenance"
    NO_HOSTS = "NoMatchingHosts"
    CAPACITY_FROM_HOSTS = "CapacityFromHosts"
    STANDBY_SHORT = "StandbyPoolShort"
    LOAD_BALANCER_DISABLED = "LoadBalancerDisabled"
    ADD_ON = "AddOn"  # add-on mode (spec.clusterRef): the Cluster's own provider fronts its control plane
    CLUSTER_NOT_FOUND = "ClusterNotFound"  # spec.clusterRef names a Cluster that does not exist (yet)
    LOAD_BALANCER_FAILED = "LoadBalancerFailed"
    KUBECONFIG_REJECTED = "KubeconfigRejected"
    OS_HOST_KEY_UNTRUSTED = "OSHostKeyUntrusted"
    ADDONS_INSTALLED = "AddonsInstalled"
    CHART_REF_NOT_ALLOWED = "ChartRefNotAllowed"
    PRIVATE_NETWORK_CONFLICT = "PrivateNetworkConflict"
    NO_PRIVATE_NETWORK = "NoPrivateNetwork"  # the cluster has no spec.privateNetwork
    VSWITCH_NOT_FOUND = "VSwitchNotFound"  # spec.privateNetwork.vswitch.id (or the recorded id) is not in Robot
    VSWITCH_REFUSED = "VSwitchRefused"  # Robot refused a vSwitch request for good (a 4xx we did not foresee)
    JOINING_VSWITCH = "JoiningVSwitch"  # the host's port is being configured; the kubeadm join waits for it
    LEAVING_VSWITCH = "LeavingVSwitch"  # after kubeadm reset, until Robot shows the server off the vSwitch
    WAITING_FOR_CONTROL_PLANE = "WaitingForControlPlane"
    FEATURES_AVAILABLE = "FeaturesAvailable"
    FEATURES_MISSING = "FeaturesMissing"
    DYNAMIC_MIG_UNSUPPORTED = "DynamicMIGUnsupported"
    # spec.image, a baked node image (docs/node-images.md)
    IMAGE_GPU_MODEL_MISMATCH = "ImageGPUModelMismatch"
    IMAGE_DRIVER_MISMATCH = "ImageDriverMismatch"  # another branch than the spec's, or below the model's floor
    IMAGE_KERNEL_MISMATCH = "ImageKernelMismatch"
    IMAGE_KUBERNETES_MISMATCH = "ImageKubernetesMismatch"
    IMAGE_MANIFEST_UNSUPPORTED = "ImageManifestUnsupported"  # a format version this release can't read


# The gate's reasons are two enums, not members of ``Reason``: each lands on its own field (the first on
# GPUReady, the second on a claim's device), a verdict or a finding can carry only a reason of its kind,
# and the claim gate's match over ``PoolReason`` stays exhaustive. No table maps one onto the other:
# every ``PoolReason`` but ``READY`` is ``GateReason.NODE_NOT_READY`` on a claim, the node's reason in
# the message. Two words recur on purpose: ``Ready`` (as on our objects) and ``DeviceTainted`` (the whole
# GPU for a node, the claim's own device for a claim).


class PoolReason(StrEnum):
    """The ``GPUReady`` reason on a Node and on its CAPI Machine: why the node's NVIDIA pool is (not) the
    one its layout promises (``readiness.decisions.pools``). Declaration order is report priority: the
    first problem found names the verdict."""

    READY = "Ready"
    HOST_MISMATCH = "HostMismatch"
    PLUGIN_NOT_RUNNING = "PluginNotRunning"
    NO_SLICES = "NoSlices"
    POOL_INCOMPLETE = "PoolIncomplete"
    STALE_GENERATION = "StaleGeneration"
    LAYOUT_MISMATCH = "LayoutMismatch"
    DEVICE_TAINTED = "DeviceTainted"


class GateReason(StrEnum):
    """The reason on a claim's gate device conditions (and in the scheduler's PreBind error), from
    ``readiness.decisions.claims``."""

    GPU_READY = "GPUReady"
    NODE_UNKNOWN = "NodeUnknown"
    NODE_NOT_READY = "NodeNotReady"
    DEVICE_MISSING = "DeviceMissing"
    DEVICE_TAINTED = "DeviceTainted"
    NOT_COLOCATED = "NotColocated"


def set_condition(
    conditions: Sequence[Condition],
    type_: Type | str,
    status: bool | ConditionStatus,
    reason: Reason | str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """A new list with the condition set; lastTransitionTime moves only when status flips."""
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    out = [c.model_copy() for c in conditions if c.type != str(type_)]
    old = next((c for c in conditions if c.type == str(type_)), None)
    when = old.last_transition_time if old is not None and old.status == status else now
    out.append(
        Condition(
            type=str(type_),
            status=status,
            reason=str(reason),
            message=message[:2000],
            last_transition_time=when,
            observed_generation=observed_generation,
        )
    )
    return sorted(out, key=lambda c: c.type)


def get(conditions: Sequence[Condition], type_: Type | str) -> Condition | None:
    return next((c for c in conditions if c.type == str(type_)), None)


def is_true(conditions: Sequence[Condition], type_: Type | str) -> bool:
    c = get(conditions, type_)
    return c is not None and c.status is ConditionStatus.TRUE
