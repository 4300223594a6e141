"""Everything one host reconcile needs from the API, loaded up front: Secrets, the consumer, its
bootstrap data and GPU plan. Failures become typed ``AccessError``s (a condition reason) before any
probe or action, so a missing Secret or malformed bootstrap data never touches the server.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.host import HetznerGPUHost, HostState
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.api.specs import GPUSpec, InstallImageSpec, image_key, prepared_key
from capi_gpu.gpu import gpuplan
from capi_gpu.hetzner.robot import RobotClient
from capi_gpu.kube import CAPI_MACHINES, SECRETS, Conflict, Obj, ours
from capi_gpu.provisioning import bootstrap, hostkeys, move, private_network
from capi_gpu.runtime import pause
from capi_gpu.runtime.deps import AccessError, Deps, secret_value

HOSTS = ours("hetznergpuhosts")
MACHINES = ours("hetznergpumachines")


@dataclass(frozen=True)
class Consumer:
    machine: HetznerGPUMachine
    name: str
    install_image: InstallImageSpec
    gpu: GPUSpec | None
    kubernetes_version: str
    bootstrap: bootstrap.BootstrapData | None
    bootstrap_problem: str | None
    standby: bool = False
    paused: bool = False  # its Cluster is paused (spec.paused) or the machine carries the paused annotation

    @property
    def prepared(self) -> str:
        return prepared_key(self.install_image, self.gpu, self.kubernetes_version)

    @property
    def image(self) -> str:
        return image_key(self.install_image)


@dataclass(frozen=True)
class HostEnv:
    robot: RobotClient
    ssh_private: str
    ssh_public: str
    os_key: hostkeys.HostKeyPair
    consumer: Consumer | None
    private_network: private_network.VLANInterface | None = None  # set by host_vswitch for a claimed host

    def __repr__(self) -> str:
        return f"HostEnv(consumer={self.consumer.name if self.consumer else None})"


def hostname(host: HetznerGPUHost) -> str:
    """The installed OS's hostname (and so the Node name): the HetznerGPUHost's name."""
    return str(host.metadata["name"])


async def load_ssh(deps: Deps, namespace: str, secret_name: str) -> tuple[str, str]:
    secret = await deps.robots.secrets.get(deps.kube, namespace, secret_name)  # shared by the fleet: cached
    if secret is None:
        raise AccessError("SecretMissing", f"SSH key Secret {namespace}/{secret_name} not found")
    return (
        secret_value(secret, "ssh-privatekey", "SSH private key"),
        secret_value(secret, "ssh-publickey", "SSH public key"),
    )


async def ensure_os_hostkey(deps: Deps, host: HetznerGPUHost, namespace: str) -> hostkeys.HostKeyPair:
    """The host's OS host key pair, generated once and kept in ``<host>-os-hostkey`` (owned by the host)."""
    meta = host.metadata
    key, uid = (namespace, str(meta["name"])), str(meta.get("uid", ""))
    cached = deps.os_keys.get(key)
    if cached is not None and cached[0] == uid:
        return cached[1]
    name = f"{hostname(host)}{domain.OS_HOSTKEY_SECRET_SUFFIX}"
    secret = await deps.kube.get_or_none(SECRETS, name, namespace)
    if secret is not None:
        if not owned_by(secret, uid):
            # Whoever planted it knows the private key: pinning it would let them answer as the node.
            raise AccessError(
                c.Reason.OS_HOST_KEY_UNTRUSTED,
                f"Secret {namespace}/{name} is not owned by this HetznerGPUHost (uid {uid}); an OS host key is "
                "used only from the Secret the controller created. Delete it (if no key is pinned yet) to get one",
            )
        pair = hostkeys.HostKeyPair(
            secret_value(secret, "ssh-host-privatekey", "OS host key"),
            secret_value(secret, "ssh-host-publickey", "OS host key"),
        )
        deps.os_keys[key] = (uid, pair)
        return pair
    if host.status.host_keys.os:
        # A key is pinned (the installed OS may carry it): a new one would lock us out of a live node. After
        # clusterctl move the Secret arrives after its host (it is the host's child), so wait for it.
        raise AccessError(
            move.Reason.OS_HOST_KEY_MISSING,
            f"OS host key Secret {namespace}/{name} not found while a key is pinned; waiting for it",
        )
    pair = hostkeys.generate(comment=hostname(host))
    await deps.kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {domain.MOVE_LABEL: ""},
                "ownerReferences": [
                    {
                        "apiVersion": domain.API_VERSION,
                        "kind": "HetznerGPUHost",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    }
                ],
            },
            "stringData": {"ssh-host-privatekey": pair.private, "ssh-host-publickey": pair.public},
        },
        namespace,
    )
    deps.os_keys[key] = (uid, pair)
    return pair


def owned_by(secret: Obj, host_uid: str) -> bool:
    """Created by this controller for this host: owned by the HetznerGPUHost with this uid (clusterctl move
    rewrites owner references to the new uids, so a moved Secret still qualifies)."""
    owners = secret["metadata"].get("ownerReferences") or []
    return bool(host_uid) and any(
        o.get("kind") == "HetznerGPUHost" and o.get("uid") == host_uid and o.get("apiVersion") == domain.API_VERSION
        for o in owners
    )


async def _bootstrap_for(
    deps: Deps, capi_machine: Obj | None, namespace: str
) -> tuple[bootstrap.BootstrapData | None, str | None]:
    secret_name = ((capi_machine or {}).get("spec", {}).get("bootstrap") or {}).get("dataSecretName")
    if not secret_name:
        return None, "WaitingForBootstrapData"
    secret = await deps.kube.get_or_none(SECRETS, secret_name, namespace)
    if secret is None:
        return None, f"{bootstrap.Problem.MISSING.value}: Secret {secret_name} not found"
    try:
        return bootstrap.decode_secret(secret.get("data")), None
    except bootstrap.BootstrapError as exc:
        return None, f"{exc.problem.value}: {exc}"


async def load_consumer(deps: Deps, host: HetznerGPUHost, namespace: str) -> Consumer | None:
    ref = host.spec.consumer_ref
    if ref is not None:
        obj = await deps.kube.get_or_none(MACHINES, ref.name, ref.namespace or namespace)
        if obj is None:
            # Never "unclaimed": a release clears the ref first, so a missing machine is one not moved here
            # yet (clusterctl move creates hosts before machines) or one removed by force. Either way: wait.
            raise AccessError(
                move.Reason.CONSUMER_MISSING,
                f"consumerRef names HetznerGPUMachine {ref.namespace or namespace}/{ref.name}, which does not"
                " exist (yet); waiting, the server is left alone (clear spec.consumerRef if it was force-deleted)",
            )
        paused = await _consumer_paused(deps, obj, ref.namespace or namespace)
        uid = str(obj["metadata"]["uid"])
        if ref.uid and uid != ref.uid and not paused:  # no write while paused
            # Matched by name and namespace; a uid that changed (clusterctl move recreates the machine) is
            # written back.
            await _patch_host(deps, host, {"spec": {"consumerRef": {"uid": uid}}}, namespace, "consumerRef.uid")
            ref.uid = uid
        cluster = (obj["metadata"].get("labels") or {}).get(domain.CLUSTER_NAME_LABEL)
        if cluster and _labels(host).get(domain.CONSUMER_CLUSTER_LABEL) != cluster and not paused:
            labels = {domain.CONSUMER_CLUSTER_LABEL: cluster}  # hosts claimed before the label existed
            await _patch_host(deps, host, {"metadata": {"labels": labels}}, namespace, "its cluster")
            host.metadata["labels"] = {**_labels(host), **labels}
        machine = HetznerGPUMachine.model_validate(obj)
        owner = next((o for o in obj["metadata"].get("ownerReferences", []) if o.get("kind") == "Machine"), None)
        capi = await deps.kube.get_or_none(CAPI_MACHINES, owner["name"], namespace) if owner else None
        data, problem = await _bootstrap_for(deps, capi, namespace)
        version = machine.spec.kubernetes_version or ((capi or {}).get("spec", {}).get("version")) or "v1.36.3"
        return Consumer(
            machine, ref.name, machine.spec.install_image, machine.spec.gpu, version, data, problem, paused=paused
        )
    if host.spec.standby is not None and host.status.state in (
        HostState.STANDBY_PREPARING,
        HostState.AVAILABLE,
        HostState.STANDBY,
    ):
        sb = host.spec.standby
        return Consumer(
            HetznerGPUMachine(), "", sb.install_image, sb.gpu, sb.kubernetes_version, None, None, standby=True
        )
    return None


def _labels(host: HetznerGPUHost) -> dict[str, str]:
    raw = host.metadata.get("labels")
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


async def _patch_host(deps: Deps, host: HetznerGPUHost, body: Obj, namespace: str, what: str) -> None:
    """A write with a resourceVersion precondition, so a concurrent release wins; the new resourceVersion
    becomes the precondition of the pass's later writes."""
    meta = {**(body.get("metadata") or {}), "resourceVersion": host.metadata.get("resourceVersion")}
    try:
        written = await deps.kube.patch(HOSTS, hostname(host), {**body, "metadata": meta}, namespace)
    except Conflict as exc:
        raise AccessError(move.Reason.CONSUMER_CHANGED, f"host changed while writing {what}") from exc
    host.metadata["resourceVersion"] = written["metadata"]["resourceVersion"]


async def recorded_cluster_paused(deps: Deps, obj: Obj) -> bool:
    """A claimed host's pause, found through the Cluster recorded at the claim: during clusterctl move its
    consumer machine is deleted (source) or not yet created (target) while the Cluster stays paused."""
    if not (obj.get("spec") or {}).get("consumerRef"):
        return False
    cluster = (obj["metadata"].get("labels") or {}).get(domain.CONSUMER_CLUSTER_LABEL)
    return await pause.cluster_paused(deps, obj["metadata"]["namespace"], cluster)


async def standby_cluster_paused(deps: Deps, obj: Obj) -> bool:
    """An unclaimed standby host's pause: the Cluster of the template whose pool it is in (the template loop
    labels it), so a host being prepared stops with the rest of that Cluster's objects during a move."""
    spec = obj.get("spec") or {}
    if spec.get("consumerRef") or not spec.get("standby"):
        return False
    cluster = (obj["metadata"].get("labels") or {}).get(domain.CONSUMER_CLUSTER_LABEL)
    return await pause.cluster_paused(deps, obj["metadata"]["namespace"], cluster)


async def _consumer_paused(deps: Deps, machine: Obj, namespace: str) -> bool:
    """The claiming machine's pause: the machine's annotation or its Cluster (``runtime.pause``)."""
    return await pause.paused(
        deps, namespace, machine, (machine["metadata"].get("labels") or {}).get(domain.CLUSTER_NAME_LABEL)
    )


async def load(deps: Deps, host: HetznerGPUHost, namespace: str) -> HostEnv:
    access = host.spec.robot
    robot = await deps.robots.get(deps.kube, namespace, access.credentials_secret)
    private, public = await load_ssh(deps, namespace, access.ssh_key_secret)
    os_key = await ensure_os_hostkey(deps, host, namespace)
    consumer = await load_consumer(deps, host, namespace)
    return HostEnv(robot, private, public, os_key, consumer)


def gpu_model_name(host: HetznerGPUHost) -> str | None:
    hw = host.status.hardware
    return next((g.model for g in hw.gpus if g.model), None) if hw else None


def plan_for(host: HetznerGPUHost, consumer: Consumer) -> gpuplan.GPUPlan | None:
    return gpuplan.plan(consumer.gpu, gpu_model_name(host)) if consumer.gpu is not None else None


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
