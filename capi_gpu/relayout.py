"""Re-layout a GPU node in place: the runbook flow, as code, with a reason for every stop.

cordon -> DeviceTaintRule NoExecute on the node's NVIDIA pool (kube-controller-manager evicts the pods
using its devices) -> drain what is left -> apply the new layout with the same playbook that built the
node (mig-parted over SSH, boot unit and CDI updated) -> restart the NVIDIA DRA kubelet plugin (it reads
MIG state only at start) -> wait for slices that show the new layout -> remove the rule, uncordon.

An impossible layout is refused before anything is touched. A failure after that leaves the node
cordoned and tainted (safe), and says which step failed.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capi_gpu import domain
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.api.specs import GPUSpec, MigLayout
from capi_gpu.gpu import gpuplan
from capi_gpu.gpu import layout as miglayout
from capi_gpu.kube import DEVICETAINTRULES, JSON_PATCH, NODES, PODS, RESOURCESLICES, SECRETS, Kube, Res, ours
from capi_gpu.provisioning import ansible, playbook_vars, private_network
from capi_gpu.readiness import decisions, targets
from capi_gpu.runtime.deps import secret_value

MACHINES, HOSTS = ours("hetznergpumachines"), ours("hetznergpuhosts")
CLUSTERS = ours("hetznergpuclusters")
EVICTIONS = "eviction"
RELAYOUT_TAINT = f"{domain.DOMAIN}/relayout"


class RelayoutError(Exception):
    def __init__(self, step: str, message: str, usage: bool = False) -> None:
        super().__init__(f"{step}: {message}")
        self.step, self.usage = step, usage


@dataclass
class Relayout:
    mgmt: Kube
    workload: Kube
    namespace: str
    node: str
    spec: str  # preset or "1g.24gb=2,2g.48gb=1"
    artifacts: Path
    overrides: dict[str, Any]
    plugin_selector: str = domain.NVIDIA_PLUGIN_SELECTOR  # the kubelet plugin only, not the chart's other pods
    timeout: float = 600.0
    say: Callable[[str], None] = print

    def run(self) -> None:
        machine, host = self._find()
        network = self._private_network(machine, host)
        gpu = self._validate(machine, host)
        self.say(f"cordon {self.node}")
        self.workload.patch(NODES, self.node, {"spec": {"unschedulable": True}})
        rule = f"relayout-{self.node}"[:63]
        self.say(f"DeviceTaintRule {rule}: NoExecute on pool {self.node}")
        self.workload.apply(
            DEVICETAINTRULES,
            {
                "apiVersion": "resource.k8s.io/v1beta2",
                "kind": "DeviceTaintRule",
                "metadata": {"name": rule},
                "spec": {
                    "deviceSelector": {"driver": domain.NVIDIA_DRIVER, "pool": self.node},
                    "taint": {"key": RELAYOUT_TAINT, "value": "true", "effect": "NoExecute"},
                },
            },
        )
        self._drain()
        self._apply_layout(machine, host, gpu, network)
        self._restart_plugin()
        self._wait_slices(machine, host)
        self.say(f"remove {rule}, uncordon {self.node}")
        self.workload.delete(DEVICETAINTRULES, rule)
        self.workload.patch(NODES, self.node, {"spec": {"unschedulable": None}})

    def _find(self) -> tuple[HetznerGPUMachine, HetznerGPUHost]:
        node = self.workload.get_or_none(NODES, self.node)
        if node is None:
            raise RelayoutError("find", f"node {self.node} not found", usage=True)
        pid = node.get("spec", {}).get("providerID", "")
        for obj in self.mgmt.list(MACHINES, self.namespace):
            m = HetznerGPUMachine.model_validate(obj)
            if m.spec.provider_id == pid and m.status.host:
                return m, HetznerGPUHost.model_validate(self.mgmt.get(HOSTS, m.status.host, self.namespace))
        raise RelayoutError("find", f"no HetznerGPUMachine in {self.namespace} has providerID {pid!r}", usage=True)

    def _private_network(self, machine: HetznerGPUMachine, host: HetznerGPUHost) -> dict[str, Any] | None:
        """The VLAN interface and node IP the node was built with (as Configure passes them), when the
        machine's cluster has a private network: site.yml rewrites /etc/default/kubelet, so a run without
        them drops --node-ip. Refused before anything is touched when the host's record can't give them."""
        labels = machine.metadata.get("labels")
        cluster = labels.get(domain.CLUSTER_NAME_LABEL) if isinstance(labels, dict) else None
        for obj in self.mgmt.list(CLUSTERS, self.namespace):
            owners = obj["metadata"].get("ownerReferences") or []
            if not any(o.get("kind") == "Cluster" and o.get("name") == cluster for o in owners):
                continue
            hgc = HetznerGPUCluster.model_validate(obj)
            spec = hgc.spec.private_network
            if spec is None:
                return None
            name = str(host.metadata["name"])
            got = private_network.recorded_interface(
                spec, hgc.status.private_network, host.status.private_network, name
            )
            if isinstance(got, str):
                raise RelayoutError("private network", got, usage=True)
            try:  # checked as the run will take them, before the node is cordoned
                playbook_vars.PrivateNetworkVars.model_validate(got.playbook_vars()["private_network"])
            except ValueError as exc:
                raise RelayoutError("private network", f"variables refused: {exc} (nothing was changed)") from exc
            return got.playbook_vars()
        return None  # no HetznerGPUCluster for the machine's cluster (a CAPH cluster): no private network

    def _validate(self, machine: HetznerGPUMachine, host: HetznerGPUHost) -> GPUSpec:
        old = machine.spec.gpu or GPUSpec()
        parsed = self.spec.strip()
        new_layout = (
            MigLayout(preset=parsed)
            if parsed.startswith("all-")
            else MigLayout(profiles=dict(miglayout.parse_layout(parsed).as_dict()))
        )
        gpu = old.model_copy(update={"layout": new_layout})
        try:
            gpuplan.plan(
                gpu, next((g.model for g in (host.status.hardware.gpus if host.status.hardware else [])), None)
            )
        except gpuplan.PlanError as exc:
            raise RelayoutError("validate", f"{exc.reason}: {exc} (nothing was changed)", usage=True) from exc
        return gpu

    def _gpu_claim_pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.workload.list(PODS, field_selector=f"spec.nodeName={self.node}")
            if p.get("spec", {}).get("resourceClaims")
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def _drain(self) -> None:
        deadline = time.monotonic() + self.timeout / 3
        while self._gpu_claim_pods() and time.monotonic() < deadline:
            time.sleep(1)
        for pod in self._gpu_claim_pods():  # what the NoExecute eviction left: evict it ourselves
            meta = pod["metadata"]
            self.say(f"evict {meta['namespace']}/{meta['name']}")
            self.workload.create(
                Res("", "v1", f"pods/{meta['name']}/{EVICTIONS}"),
                {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                },
                meta["namespace"],
            )
        deadline = time.monotonic() + self.timeout / 3
        while self._gpu_claim_pods():
            if time.monotonic() > deadline:
                raise RelayoutError("drain", f"pods with GPU claims still on {self.node}")
            time.sleep(1)

    def _apply_layout(
        self, machine: HetznerGPUMachine, host: HetznerGPUHost, gpu: GPUSpec, network: dict[str, Any] | None
    ) -> None:
        model = next((g.model for g in (host.status.hardware.gpus if host.status.hardware else []) if g.model), None)
        plan = gpuplan.plan(gpu, model)
        secret = self.mgmt.get(SECRETS, host.spec.robot.ssh_key_secret, self.namespace)
        hostkey = self.mgmt.get(SECRETS, f"{host.metadata['name']}{domain.OS_HOSTKEY_SECRET_SUFFIX}", self.namespace)
        target = ansible.SSHTarget(
            name=str(host.metadata["name"]),
            address=host.status.ipv4 or "",
            host_key=" ".join(secret_value(hostkey, "ssh-host-publickey", "").split()[:2]),
            private_key=secret_value(secret, "ssh-privatekey", "SSH key"),
        )
        variables = playbook_vars.node_vars(
            machine.spec.kubernetes_version or "v1.36.3", plan, gpu.driver_branch, self.overrides
        )
        if network is not None:
            variables = playbook_vars.with_private_network(variables, network)
        self.say(f"apply layout {plan.key} on {host.status.ipv4} (mig-parted via the mig_layout role)")
        result = asyncio.run(ansible.AnsibleRunner(artifacts_root=self.artifacts).prepare_node(target, variables))
        if not result.ok:
            where = result.failed.label if result.failed else result.status.value
            raise RelayoutError("apply", f"playbook {result.status.value} at {where}")
        # Replaced whole (JSON patch): a merge patch would keep the old layout's preset beside new profiles, or
        # merge two profile maps, and the controller refuses a layout with both (ImpossibleLayout).
        self.mgmt.patch(
            MACHINES,
            str(machine.metadata["name"]),
            [{"op": "add", "path": "/spec/gpu", "value": gpu.wire()}],
            self.namespace,
            content_type=JSON_PATCH,
        )
        profiles = sorted(collections.Counter(plan.expected_profiles).elements())
        self.mgmt.patch(
            HOSTS,
            str(host.metadata["name"]),
            # The new instances' placements were not read: the gate counts by profile until the next provisioning.
            {"status": {"layout": plan.key, "migDevices": profiles, "migInstances": []}},
            self.namespace,
            sub="status",
        )

    def _restart_plugin(self) -> None:
        pods = self.workload.list(
            PODS, label_selector=self.plugin_selector, field_selector=f"spec.nodeName={self.node}"
        )
        for pod in pods:
            self.say(f"restart DRA plugin pod {pod['metadata']['namespace']}/{pod['metadata']['name']}")
            self.workload.delete(PODS, pod["metadata"]["name"], pod["metadata"]["namespace"])
        if not pods:
            self.say(f"no DRA plugin pod matched {self.plugin_selector} on {self.node}")

    def _wait_slices(self, machine: HetznerGPUMachine, host: HetznerGPUHost) -> None:
        fresh = HetznerGPUMachine.model_validate(self.mgmt.get(MACHINES, str(machine.metadata["name"]), self.namespace))
        host = HetznerGPUHost.model_validate(self.mgmt.get(HOSTS, str(host.metadata["name"]), self.namespace))
        expected = targets.expected_pool(fresh, host)
        assert expected is not None
        deadline = time.monotonic() + self.timeout / 3
        while True:
            verdict = decisions.pool_verdict(self.workload.list(RESOURCESLICES), self.node, expected)
            # The relayout rule's own NoExecute taint is on the devices via the rule, not the slice.
            if verdict.ready:
                self.say(f"slices show the new layout: {verdict.message}")
                return
            if time.monotonic() > deadline:
                raise RelayoutError("verify", f"slices never showed the new layout: {verdict.message}")
            time.sleep(1)
