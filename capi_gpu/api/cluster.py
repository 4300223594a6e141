"""HetznerGPUCluster(+Template): the CAPI InfraCluster: credentials, SSH keys, control-plane endpoint.

Secrets are referenced, never copied: status says whether they could be read, not what they hold.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import ConfigDict, Field

from capi_gpu import domain
from capi_gpu.api.base import (
    Conditions,
    Initialization,
    KubeModel,
    ObjectMetaTemplate,
    cel,
    immutable,
    list_map,
    validations,
)
from capi_gpu.api.network import PrivateNetworkSpec, PrivateNetworkStatus


class APIEndpoint(KubeModel):
    """host:port of the workload cluster's API."""

    host: Annotated[str, Field(min_length=1, max_length=512)]
    """DNS name or IP."""
    port: Annotated[int, Field(ge=1, le=65535)] = 6443
    """Port."""


class RobotCredentials(KubeModel):
    """Where the Robot webservice user lives."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    """Secret name in the cluster's namespace."""
    user_key: str = "robot-user"
    """Key holding the webservice user."""
    password_key: str = "robot-password"
    """Key holding the webservice password."""


class SSHKeyRef(KubeModel):
    """An SSH key pair in a Secret, and its name in Robot."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    """Secret name."""
    robot_key_name: Annotated[str | None, Field(max_length=64)] = None
    """Name of the public key in Robot's key store; the Secret name when unset."""
    private_key_key: str = "ssh-privatekey"
    """Key holding the private key (OpenSSH PEM)."""
    public_key_key: str = "ssh-publickey"
    """Key holding the public key (OpenSSH line)."""


class SSHKeys(KubeModel):
    """Keys the controller logs in with."""

    rescue: SSHKeyRef
    """Authorized in Robot's rescue system."""
    os: SSHKeyRef | None = None
    """Authorized in the installed OS; the rescue key when unset."""


class LoadBalancerSpec(KubeModel):
    """An hcloud Load Balancer in front of the control-plane hosts."""

    enabled: bool = False
    """Create or adopt a Load Balancer and set controlPlaneEndpoint from it."""
    name: Annotated[str | None, Field(max_length=63)] = None
    """Name to create or adopt; <cluster>-kube-apiserver when unset."""
    type: str = "lb11"
    """Load Balancer type."""
    location: str = "fsn1"
    """hcloud location (eu-central zone for Robot targets)."""
    port: Annotated[int, Field(ge=1, le=65535)] = 6443
    """Listen and destination port."""
    token_ref: RobotCredentials | None = None
    """Secret with the hcloud token (key: passwordKey)."""


# A Kubernetes label selector (equality- and set-based terms, comma-separated), so a typo is refused at
# admission instead of leaving the gate's pod watch failing with 400 and every node unready.
_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_TERM = rf"(!?{_KEY}|{_KEY} *(=|==|!=) *{_VALUE}|{_KEY} +(in|notin) *\( *{_VALUE}( *, *{_VALUE})* *\))"
LABEL_SELECTOR_PATTERN = rf"^({_TERM}( *, *{_TERM})*)?$"


class DRADriverAddon(KubeModel):
    """NVIDIA's DRA driver chart (dra-driver-nvidia-gpu), installed into the workload cluster by the operator."""

    managed: bool = True
    """Install and upgrade the chart with capi-gpu's values; false when you manage the NVIDIA DRA driver
    yourself (the gate driver and the claim templates are still installed)."""
    chart_version: Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$")] = "0.4.1"
    """Chart version (strict semver, no v)."""
    chart_ref: Annotated[str | None, Field(max_length=512)] = None
    """Where the chart comes from: an OCI reference or an archive path inside the operator; the chart's
    registry when unset (the operator's --addons-chart overrides that default, e.g. for a mirror)."""
    kubelet_plugin_namespace: Annotated[str, Field(max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")] = (
        domain.NVIDIA_PLUGIN_NAMESPACE
    )
    """Namespace of the driver's kubelet-plugin pods (empty: any namespace)."""
    kubelet_plugin_selector: Annotated[str, Field(max_length=1024, pattern=LABEL_SELECTOR_PATTERN)] = (
        domain.NVIDIA_PLUGIN_SELECTOR
    )
    """Label selector of the driver's kubelet-plugin pods. A node is GPU-ready only while one of them is Running
    and Ready on it: the kubelet keeps a departed plugin's slices for 30 s, so slices alone would call a node
    without a plugin ready. Empty turns this check off (the slices alone decide)."""
    plugin_max_unavailable: Annotated[str, Field(pattern=r"^([1-9][0-9]{0,3}|([1-9][0-9]?|100)%)$")] = "1"
    """How many GPU nodes' kubelet-plugin pods a chart upgrade or values change restarts at once: a count
    ("1") or a percentage of the GPU nodes ("25%"), as a string. A node whose plugin restarts loses GPU-ready
    (startup taint back, claims wait) until the new pod publishes its slices; the chart's own default,
    100%, would take every GPU node out at once."""


class Addons(KubeModel):
    """What the operator installs into the workload cluster once its control plane answers."""

    dra_driver: DRADriverAddon = DRADriverAddon()
    """NVIDIA's DRA driver chart."""
    claim_namespaces: Annotated[
        list[Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]], Field(max_length=50)
    ] = ["default"]
    """Namespaces that get the shipped ResourceClaimTemplates (created when missing)."""


class AddonsStatus(KubeModel):
    """What the last successful add-ons run applied."""

    applied_digest: str | None = None
    """Digest of the request and the shipped files the run applied; a new one runs the playbook again."""
    chart_version: str | None = None
    """The DRA driver chart version installed; unset when the driver is not managed."""
    applied_time: datetime | None = None
    """When that run finished; the playbook runs again after an hour to undo drift."""


class ClusterRef(KubeModel):
    """A CAPI Cluster in the same namespace."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    """The Cluster's name."""


_ADD_ON = "has(self.clusterRef)"


# A host's node IP comes from the private network, so the network exists for the cluster's whole life or not
# at all; and an address or a membership must never refer to a vSwitch or subnet the spec no longer names.
_PRIVATE_NETWORK_FIXED = cel(
    "self.vswitch == oldSelf.vswitch && self.subnet == oldSelf.subnet",
    "privateNetwork.vswitch and privateNetwork.subnet can't change: hosts hold addresses on them "
    "(addresses, mtu and routes may change)",
)


class HetznerGPUClusterSpec(KubeModel):
    """Desired state of the infrastructure of one workload cluster."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                f"!{_ADD_ON} || !has(self.controlPlaneEndpoint)",
                "controlPlaneEndpoint is the Cluster's own infrastructure provider's to set: with clusterRef "
                "(add-on mode) leave it unset",
                field=".controlPlaneEndpoint",
                reason="FieldValueForbidden",
            ),
            cel(
                f"!{_ADD_ON} || !has(self.controlPlaneLoadBalancer) || !self.controlPlaneLoadBalancer.enabled",
                "controlPlaneLoadBalancer: with clusterRef (add-on mode) the Cluster's own infrastructure provider "
                "fronts its control plane; leave it disabled",
                field=".controlPlaneLoadBalancer",
                reason="FieldValueForbidden",
            ),
            cel(
                f"!{_ADD_ON} || !has(self.failureDomains) || size(self.failureDomains) == 0",
                "failureDomains are published by the Cluster's infrastructureRef: with clusterRef (add-on mode) "
                "set them there and leave these empty",
                field=".failureDomains",
                reason="FieldValueForbidden",
            ),
            cel(
                "has(self.clusterRef) == has(oldSelf.clusterRef) && (!has(self.clusterRef) || "
                "self.clusterRef.name == oldSelf.clusterRef.name)",
                "clusterRef can't be set, changed or removed after creation: create another HetznerGPUCluster",
                field=".clusterRef",
            ),
            cel(
                "has(self.privateNetwork) == has(oldSelf.privateNetwork)",
                "privateNetwork is set when the cluster is created and can't be added or removed later: "
                "its hosts take their node IPs from it",
                field=".privateNetwork",
            ),
        )
    )

    cluster_ref: ClusterRef | None = None
    """Add-on mode: the CAPI Cluster these GPU workers join when another provider's InfraCluster (CAPH's
    HetznerCluster, for example) is its infrastructureRef. The operator makes that Cluster this object's owner,
    so clusterctl move and the Cluster's deletion take it along, and never sets a control-plane endpoint, a
    Load Balancer or failure domains. Unset: this object is the Cluster's infrastructureRef."""
    control_plane_endpoint: APIEndpoint | None = None
    """Set by the user, or by the controller from the Load Balancer."""
    robot_credentials: RobotCredentials
    """Robot webservice credentials."""
    ssh_keys: SSHKeys
    """SSH keys for rescue and the installed OS."""
    control_plane_load_balancer: LoadBalancerSpec = LoadBalancerSpec()
    """Optional hcloud Load Balancer."""
    failure_domains: Annotated[list[str], Field(max_length=100)] = []
    """Hetzner datacenters offered as failure domains, e.g. fsn1-dc14."""
    addons: Addons = Addons()
    """The DRA add-ons installed into the workload cluster (docs/addons.md)."""
    private_network: Annotated[
        PrivateNetworkSpec | None, Field(json_schema_extra=validations(_PRIVATE_NETWORK_FIXED))
    ] = None
    """Hosts join this Robot vSwitch before they join the cluster, and the kubelet uses their address on it
    as the node IP (docs/private-network.md). Unset: hosts use their public address, as before."""


class FailureDomain(KubeModel):
    """A v1beta2 failure domain (list form)."""

    name: Annotated[str, Field(min_length=1, max_length=256)]
    """Datacenter name."""
    control_plane: bool | None = None
    """Whether control-plane machines may go here."""
    attributes: dict[str, str] | None = None
    """Free-form attributes."""


class HetznerGPUClusterStatus(KubeModel):
    """Observed state."""

    initialization: Initialization = Initialization()
    """initialization.provisioned: credentials work and the endpoint is known."""
    failure_domains: Annotated[list[FailureDomain], Field(max_length=100, json_schema_extra=list_map("name"))] = []
    """Failure domains."""
    credentials_hash: str | None = None
    """Version of the credentials Secret the conditions were computed from (its uid and resourceVersion).
    Never derived from the Secret's content: a hash of a password in status would be an offline oracle."""
    addons: AddonsStatus = AddonsStatus()
    """The add-ons the operator last applied."""
    private_network: PrivateNetworkStatus | None = None
    """The vSwitch of spec.privateNetwork, as last seen."""
    conditions: Conditions = []
    """Ready, RobotCredentialsValid, LoadBalancerReady, AddonsReady."""


class HetznerGPUCluster(KubeModel):
    """The CAPI InfraCluster for a cluster whose machines are Hetzner Robot servers."""

    api_version: str = "infrastructure.cluster.x-k8s.io/v1alpha1"
    kind: str = "HetznerGPUCluster"
    metadata: dict[str, object] = {}
    spec: HetznerGPUClusterSpec
    status: HetznerGPUClusterStatus = HetznerGPUClusterStatus()


class HetznerGPUClusterTemplateResource(KubeModel):
    """What a HetznerGPUCluster is created from (ClusterClass)."""

    metadata: ObjectMetaTemplate | None = None
    """Labels and annotations."""
    spec: HetznerGPUClusterSpec
    """Cluster spec."""


class HetznerGPUClusterTemplateSpec(KubeModel):
    """Template spec."""

    template: Annotated[
        HetznerGPUClusterTemplateResource,
        Field(
            json_schema_extra=immutable(
                "spec.template is immutable, as CAPI templates are: create a new HetznerGPUClusterTemplate "
                "and point the ClusterClass at it"
            )
        ),
    ]
    """The cluster template."""


class HetznerGPUClusterTemplate(KubeModel):
    """Template for HetznerGPUClusters (ClusterClass)."""

    api_version: str = "infrastructure.cluster.x-k8s.io/v1alpha1"
    kind: str = "HetznerGPUClusterTemplate"
    metadata: dict[str, object] = {}
    spec: HetznerGPUClusterTemplateSpec
