"""Every name this provider puts into the API server, defined once.

Labels, annotations, finalizers, condition types and taint keys are part of the provider's public
contract: users write selectors and runbooks against them. Keeping them in one module means a rename is
one diff, and nothing else in the code base spells a key as a string literal.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "infrastructure.cluster.x-k8s.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# The project's own domain, for labels, annotations, conditions and the gate DRA driver.
DOMAIN: Final = "gpu.infrastructure.cluster.x-k8s.io"
# kopf's progress records (a retried delete handler's attempts) live under a prefix of their own: kopf drops
# every annotation under its progress prefix from the diff it hands to on.update, so with DOMAIN there the
# host levers (annotations in DOMAIN) never reached their handlers. A "kopf." prefix also spares the
# "<prefix>/kopf-managed" marker kopf would otherwise write onto every object it handles.
KOPF_PROGRESS_PREFIX: Final = f"kopf.{DOMAIN}"

# CAPI core names we read or write.
CAPI_GROUP: Final = "cluster.x-k8s.io"
CAPI_VERSION: Final = "v1beta2"
CAPI_API_VERSION: Final = f"{CAPI_GROUP}/{CAPI_VERSION}"
CONTRACT_LABEL: Final = "cluster.x-k8s.io/v1beta2"
CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
WATCH_FILTER_LABEL: Final = "cluster.x-k8s.io/watch-filter"
PAUSED_ANNOTATION: Final = "cluster.x-k8s.io/paused"
MANAGED_BY_ANNOTATION: Final = "cluster.x-k8s.io/managed-by"
PROVIDER_LABEL: Final = "cluster.x-k8s.io/provider"
PROVIDER_NAME: Final = "infrastructure-hetzner-gpu"
REMEDIATE_MACHINE_ANNOTATION: Final = "cluster.x-k8s.io/remediate-machine"
DELETE_FOR_MOVE_ANNOTATION: Final = "clusterctl.cluster.x-k8s.io/delete-for-move"
BLOCK_MOVE_ANNOTATION: Final = "clusterctl.cluster.x-k8s.io/block-move"
MOVE_LABEL: Final = "clusterctl.cluster.x-k8s.io/move"
MOVE_HIERARCHY_LABEL: Final = "clusterctl.cluster.x-k8s.io/move-hierarchy"
# On a claimed host: its consumer's Cluster, so the host still finds its pause when clusterctl move has
# already deleted (source) or not yet created (target) the consumer machine; on a standby host, its pool's
# template's Cluster. Ours, not CAPI's cluster-name label, which CAPI tooling reads as ownership.
CONSUMER_CLUSTER_LABEL: Final = "gpu.infrastructure.cluster.x-k8s.io/consumer-cluster"
CA_MIN_SIZE_ANNOTATION: Final = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
CA_MAX_SIZE_ANNOTATION: Final = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
CA_CAPACITY_PREFIX: Final = "capacity.cluster-autoscaler.kubernetes.io/"
# Per node group: how long a scale-up may take before CA gives up on it (15 m default; bare metal needs
# far more: installimage, reboots, driver and MIG layout).
CA_MAX_NODE_PROVISION_TIME_ANNOTATION: Final = "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime"
# CA's clusterapi GPU label. Never put on our nodes or template nodes: CA 1.36 treats a node carrying it
# without nvidia.com/gpu allocatable (every DRA node) as having an unready GPU, for ever.
CA_ACCELERATOR_LABEL: Final = "cluster-api/accelerator"
# Scale-from-zero capacity annotations on a MachineDeployment (cluster-autoscaler's clusterapi provider).
CA_CAPACITY_CPU: Final = f"{CA_CAPACITY_PREFIX}cpu"
CA_CAPACITY_MEMORY: Final = f"{CA_CAPACITY_PREFIX}memory"
CA_CAPACITY_EPHEMERAL_DISK: Final = f"{CA_CAPACITY_PREFIX}ephemeral-disk"
CA_CAPACITY_MAX_PODS: Final = f"{CA_CAPACITY_PREFIX}maxPods"
CA_CAPACITY_GPU_TYPE: Final = f"{CA_CAPACITY_PREFIX}gpu-type"
CA_CAPACITY_GPU_COUNT: Final = f"{CA_CAPACITY_PREFIX}gpu-count"
CA_CAPACITY_DRA_DRIVER: Final = f"{CA_CAPACITY_PREFIX}dra-driver"
CA_CAPACITY_LABELS: Final = f"{CA_CAPACITY_PREFIX}labels"
CA_CAPACITY_TAINTS: Final = f"{CA_CAPACITY_PREFIX}taints"
# The device-plugin extended resource CA adds to a template node for gpu-type (and the DRA driver's
# gpu.nvidia.com class maps to it with DRAExtendedResource).
NVIDIA_GPU_RESOURCE: Final = "nvidia.com/gpu"
CAPI_DEPLOYMENT_NAME_LABEL: Final = "cluster.x-k8s.io/deployment-name"
BOOTSTRAP_SENTINEL: Final = "/run/cluster-api/bootstrap-success.complete"

# Provider identity of a Robot server; byte-identical on the Node and the InfraMachine.
PROVIDER_ID_PREFIX: Final = "hrobot://"

# Finalizers (CAPI convention: <kind plural>.<group>).
HOST_FINALIZER: Final = f"hetznergpuhosts.{GROUP}"
MACHINE_FINALIZER: Final = f"hetznergpumachines.{GROUP}"
CLUSTER_FINALIZER: Final = f"hetznergpuclusters.{GROUP}"

# Host labels written from inspected hardware, so hostSelector can match on facts.
LABEL_GPU_PRESENT: Final = f"{DOMAIN}/gpu"
LABEL_GPU_MODEL: Final = f"{DOMAIN}/gpu-model"
LABEL_GPU_DEVICE_ID: Final = f"{DOMAIN}/gpu-device-id"
LABEL_MIG_CAPABLE: Final = f"{DOMAIN}/mig-capable"
LABEL_PRODUCT: Final = f"{DOMAIN}/product"
LABEL_DATACENTER: Final = f"{DOMAIN}/datacenter"
LABEL_STANDBY: Final = f"{DOMAIN}/standby"
LABEL_LAYOUT: Final = f"{DOMAIN}/mig-layout"

# Host annotations (ops levers, as in CAPH).
ANNOTATION_WIPE_DISK: Final = f"{DOMAIN}/wipe-disk"
ANNOTATION_PERMANENT_ERROR: Final = f"{DOMAIN}/permanent-error"
ANNOTATION_REBOOT: Final = f"{DOMAIN}/reboot"
ANNOTATION_HOST: Final = f"{DOMAIN}/host"
ANNOTATION_SCALER_OWNER: Final = f"{DOMAIN}/scale-owner"
# The same key as a label on the MachineDeployment, so cluster-autoscaler's discovery can select only
# its own groups (--node-group-auto-discovery=clusterapi:<key>=cluster-autoscaler). Values: claim-scaler,
# cluster-autoscaler (capi_gpu.autoscaler.nodegroup.ScaleOwner).
LABEL_SCALER_OWNER: Final = ANNOTATION_SCALER_OWNER
# Relative price of one node of a MachineDeployment (e.g. EUR/h); breaks ties between equally small plans.
ANNOTATION_SCALE_COST: Final = f"{DOMAIN}/scale-cost"
ANNOTATION_LAYOUT: Final = f"{DOMAIN}/mig-layout"
# Set by `capi-gpu hosts inspect` (value: the request time, RFC 3339) to ask the host controller to inspect
# an unconsumed host again; the controller clears it once the new inspection is recorded.
ANNOTATION_REINSPECT: Final = f"{DOMAIN}/reinspect"
# On a HetznerGPUCluster (value: the VLAN), written before it asks Robot to create its vSwitch and kept: only a
# vSwitch found with this VLAN and name while it is there is one we created (and cancel with the cluster).
# Metadata, so clusterctl move carries it where the status (with the vSwitch id) is not.
ANNOTATION_VSWITCH_CREATE: Final = f"{DOMAIN}/vswitch-create"

# Readiness, three layers.
NODE_STARTUP_TAINT: Final = "readiness.k8s.io/gpu-not-ready"
GPU_READY_CONDITION: Final = "GPUReady"
GATE_DRIVER: Final = f"gate.{DOMAIN}"
GATE_BINDING_CONDITION: Final = f"{DOMAIN}/gpu-ready"
GATE_FAILURE_CONDITION: Final = f"{DOMAIN}/gpu-failed"
NVIDIA_DRIVER: Final = "gpu.nvidia.com"
NVIDIA_XID_TAINT_PREFIX: Final = "gpu.nvidia.com/"
# Where the dra-driver-nvidia-gpu chart runs its kubelet plugin (playbooks/addons.yml's release namespace) and
# the selector label it gives only those pods ("<chart name>-component"; app.kubernetes.io/name is on every
# pod of the chart, the webhook's too).
NVIDIA_PLUGIN_NAMESPACE: Final = "nvidia-dra-driver-gpu"
NVIDIA_PLUGIN_SELECTOR: Final = "dra-driver-nvidia-gpu-component=kubelet-plugin"
# Where the gate driver's kubelet plugin runs (config/dra/gate-plugin-daemonset.yaml) and its pods' label.
GATE_PLUGIN_NAMESPACE: Final = "kube-system"
GATE_PLUGIN_SELECTOR: Final = "app.kubernetes.io/name=capi-gpu-gate-plugin"
# The one device in each node's gate ResourceSlice, and the DeviceClass that selects it (named like the
# driver, as NVIDIA names gpu.nvidia.com's class).
GATE_DEVICE_NAME: Final = "gate"
GATE_DEVICE_CLASS: Final = GATE_DRIVER
# Device taint on the gate device while its node is not GPU ready, so new allocations avoid the node even
# for pods that tolerate the node's startup taint (KEP-5007: after a failure, stop the device being picked).
GATE_DEVICE_TAINT: Final = f"{DOMAIN}/gpu-not-ready"
# On shipped ResourceClaimTemplates: the exact MIG profile the template asks for.
ANNOTATION_MIG_PROFILE: Final = f"{DOMAIN}/mig-profile"
# Device taint for tenant reservations (a DeviceTaintRule on a node's NVIDIA pool; the tenant's claims
# tolerate it with value = tenant). Not a readiness signal: the pool verdict ignores DeviceTaintRules.
DEVICE_TAINT_RESERVED: Final = f"{DOMAIN}/reserved"

# A host's status (less conditions) as JSON, written before every status write and restored on a host that
# arrives without status: clusterctl move never copies status (Metal3's baremetalhost.metal3.io/status).
ANNOTATION_STATUS: Final = f"{DOMAIN}/status"

# Secrets the controller generates (never logged, never copied into status).
OS_HOSTKEY_SECRET_SUFFIX: Final = "-os-hostkey"
