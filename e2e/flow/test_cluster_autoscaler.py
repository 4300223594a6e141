"""The real cluster-autoscaler 1.36.1 (clusterapi provider, its own process, two kubeconfigs) on the simulated
world, layout all-1g.24gb (four 1g.24gb per node), claim scaler off, its Cluster CAPH's (a HetznerCluster as
infrastructureRef, the GPU workers attached in add-on mode, on a private network): scale-up from zero for
eight 1g claims to exactly two nodes, all bound through the gate (CA knows the group's node from the one the
world provisioned first, as CA 1.36.1 needs for a DRA group: kubernetes/autoscaler#10199); an emptied node removed and its host back in the pool, no
other host touched; CA's status and metrics count GPU-ready nodes as ready, never unready or not started;
two lightly used nodes consolidated into one (the gate pool is as busy as the MIG pool); CA never goes below the
group's min size. CA discovers only groups labelled scale-owner=cluster-autoscaler (label also on the Machines).

Tests share one world and CA, and run in file order (each builds on the last one's state).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import re
import subprocess
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ca_kit import (
    Watch,
    all_bound,
    ca_sees_ready,
    gate_devices,
    owner_labelled,
    placement,
    pods,
    remove,
    replicas,
    set_group_size,
    set_owner,
    submit,
    wait_sampling,
)
from flow_kit import (
    MD_NAME,
    gpu_nodes,
    host_state,
    hosts,
    machines,
    ns,
    provisioned,
    ready_nodes,
    robot_refusals,
    sim_host,
    wait,
    where,
)

from capi_gpu import domain
from capi_gpu.kube import CAPI_CLUSTERS, CAPI_MACHINES, EVENTS, NODES, ours
from capi_gpu_sim import binaries, caph
from capi_gpu_sim.cluster_autoscaler import ClusterAutoscaler, Options
from capi_gpu_sim.private_link import reaches
from capi_gpu_sim.world import World

HOST_COUNT = 3
TIMEOUT_S = 420.0
STABLE_S = 62.0  # CA copies a node as its group's template once it has been Ready for a minute
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "add-gpu-workers-to-caph.md"
PRIVATE = {"vswitch": {"vlan": 4000}, "subnet": "10.0.1.0/24"}


@pytest.fixture(scope="module")
def world(world_factory: Callable[..., World]) -> World:
    # The Cluster is CAPH's (issue 32): its infrastructureRef a HetznerCluster on CAPH's real CRDs, as CAPH
    # leaves it provisioned; the GPU workers join it through our HetznerGPUCluster in add-on mode.
    # Its GPU nodes are on a private network over a Robot vSwitch the operator creates (VLAN 4000): each host
    # joins before its kubelet does, and registers its vSwitch address as the node's InternalIP.
    w = world_factory(hosts=HOST_COUNT, layout="all-1g.24gb", release=True, caph=True, private_network=PRIVATE)
    set_group_size(w, MD_NAME, 1, 4)
    set_owner(w, MD_NAME, "cluster-autoscaler")
    provisioned(w, 1)
    wait(w, "the owner label on dev-gpu's Machines", lambda: owner_labelled(w, MD_NAME, "cluster-autoscaler"), 60)
    return w


@pytest.fixture(scope="module")
def ca(world: World) -> Iterator[ClusterAutoscaler]:
    # CA 1.36.1 scales a DRA group from zero only from a node it has seen (#10199): the world's first node,
    # Ready for a minute before CA starts, becomes the group's template in CA's node-info cache.
    (node,) = gpu_nodes(world)
    wait(
        world,
        "dev-gpu's node Ready for a minute",
        lambda: ready_for(world.k.get(NODES, node["metadata"]["name"])) > STABLE_S,
        120,
    )
    opts = Options(
        namespace=ns(world),
        cluster=world.config.cluster,
        state_dir=world.config.state_dir,
        discovery_extra=f"{domain.LABEL_SCALER_OWNER}=cluster-autoscaler",
    )
    autoscaler = ClusterAutoscaler(world.k, world.cp.kubeconfig, opts).start()
    try:
        wait(
            world,
            "cluster-autoscaler counting the one GPU node ready",
            lambda: ca_sees_ready(world, autoscaler, 1),
            120,
        )
        yield autoscaler
    finally:
        autoscaler.stop()
        print(f"\ncluster-autoscaler log: {autoscaler.log_path}")


def ready_for(node: dict[str, Any]) -> float:
    """Seconds the Node's Ready condition has been True (API clock)."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return (dt.datetime.now(dt.UTC) - _ts(c["lastTransitionTime"])).total_seconds()
    return 0.0


def test_gpu_workers_join_a_cluster_whose_infrastructure_is_caphs(world: World, ca: ClusterAutoscaler) -> None:
    """Add-on mode: CAPI reads the Cluster's infrastructure from CAPH's HetznerCluster (v1beta1 contract), our
    HetznerGPUCluster is owned by the Cluster without being its infrastructureRef and sets no endpoint, and the
    GPU node the world provisioned joined it (the gate, the add-ons, CA all found it through that owner)."""
    cluster = world.k.get(CAPI_CLUSTERS, world.config.cluster, ns(world))
    assert cluster["spec"]["infrastructureRef"]["kind"] == caph.KIND
    assert cluster["status"]["initialization"]["infrastructureProvisioned"] is True
    hgc = world.k.get(ours("hetznergpuclusters"), world.config.cluster, ns(world))
    assert [(o["kind"], o["name"]) for o in hgc["metadata"]["ownerReferences"]] == [("Cluster", world.config.cluster)]
    assert "controlPlaneEndpoint" not in hgc["spec"]
    assert not (hgc["status"].get("initialization") or {}).get("provisioned")
    assert len(ready_nodes(world) or []) == 1
    on_the_vswitch(world)
    out = guide_block(world, "caph-check-attachment")
    lines = out.strip().splitlines()
    assert lines[0] == f"{caph.KIND} true" and lines[1] == "True Ready", out
    assert '"vlan":4000' in lines[2] and '"created":true' in lines[2], out


def guide_block(world: World, step: str) -> str:
    """Run the ``<!-- e2e: STEP -->`` sh block of docs/add-gpu-workers-to-caph.md as its own ``bash -c`` (``set
    -euo pipefail``) with the real kubectl, the variables the guide names set for this world; its stdout."""
    text = GUIDE.read_text()
    found = re.search(rf"^ *<!-- e2e: {step} -->\n *```sh\n(?P<body>.*?)^ *```", text, re.M | re.S)
    assert found, f"{GUIDE.name} has no block marked {step}"
    path = os.pathsep.join([str(binaries.ensure_built().kubectl.parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "KUBECONFIG": str(world.cp.kubeconfig), "NS": ns(world)}
    env |= {"CLUSTER": world.config.cluster, "GPU_CLUSTER": world.config.cluster}
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + textwrap.dedent(found["body"])],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def private_addresses(world: World) -> dict[str, tuple[str, str]]:
    """Each GPU node: (its InternalIP, the address its host holds on the vSwitch)."""
    out = {}
    for g in ready_nodes(world) or []:
        internal = next(a["address"] for a in g.node["status"]["addresses"] if a["type"] == "InternalIP")
        held = ((g.host.get("status") or {}).get("privateNetwork") or {}).get("address", "")
        out[g.name] = (internal, held)
    return out


def on_the_vswitch(world: World) -> None:
    """Every GPU node's InternalIP is its host's vSwitch address, inside the subnet; Robot lists each host as a
    ready member of the cluster's vSwitch; and the nodes reach each other over it (a TCP probe from inside one
    guest to the other's private address, the link the simulator builds only between ready members)."""
    hgc = world.k.get(ours("hetznergpuclusters"), world.config.cluster, ns(world))
    pn = hgc["status"]["privateNetwork"]
    assert pn["vlan"] == 4000 and pn["created"] is True, pn
    nodes = ready_nodes(world) or []
    addresses = private_addresses(world)
    assert nodes and all(ip == held and ip.startswith("10.0.1.") for ip, held in addresses.values()), addresses
    assert world.robot is not None
    members = world.robot.vswitch_links()[int(pn["vswitchID"])][1]
    assert {g.server_number for g in nodes} <= set(members), (members, [g.server_number for g in nodes])
    for a, b in itertools.pairwise(nodes):
        assert reaches(sim_host(world, a.server_number), addresses[b.name][0]), (a.name, addresses[b.name])


def _hold(h: dict[str, object]) -> tuple[str, object, object]:
    """What a scale-down must not change on a host it does not remove: state, consumer, operations."""
    status = h.get("status") or {}
    assert isinstance(status, dict)
    spec = h.get("spec") or {}
    assert isinstance(spec, dict)
    return host_state(h), spec.get("consumerRef"), status.get("operations")


def ca_events(world: World, pod: str) -> list[tuple[str, str]]:
    """CA's scale-up Events on a pod: (reason, message)."""
    return [
        (str(e.get("reason")), str(e.get("message")))
        for e in world.k.list(EVENTS, ns(world))
        if e["involvedObject"].get("name") == pod and e.get("reason") in ("TriggeredScaleUp", "NotTriggerScaleUp")
    ]


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def pending_to_trigger_s(world: World) -> float | None:
    """From the first pod marked Unschedulable to CA's first TriggeredScaleUp Event (API clock, 1 s)."""
    pending = [
        _ts(c["lastTransitionTime"])
        for p in pods(world).values()
        for c in (p.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
    ]
    events = [e for e in world.k.list(EVENTS, ns(world)) if e.get("reason") == "TriggeredScaleUp"]
    stamps = [_ts(t) for e in events if (t := e.get("firstTimestamp") or e.get("eventTime"))]
    if not pending or not stamps:
        return None
    return (min(stamps) - min(pending)).total_seconds()


def robot_calls(world: World, since: int) -> int:
    assert world.robot is not None
    return len(world.robot.log) - since


def test_scale_up_from_zero_binds_eight_1g_claims_on_two_nodes(world: World, ca: ClusterAutoscaler) -> None:
    watch = Watch(world, ca)
    assert world.robot is not None
    set_group_size(world, MD_NAME, 0, 4)
    world.scale(0, MD_NAME)
    wait(world, "dev-gpu at zero, its node gone", lambda: not gpu_nodes(world), 180)
    wait(world, "dev-gpu's Machines gone", lambda: not machines(world), 120)
    mark = len(world.robot.log)
    names = [f"w{i}" for i in range(8)]
    started = time.monotonic()
    submit(world, names)
    wait_sampling(world, watch, "CA raising the MachineDeployment from zero", lambda: replicas(world) > 0, 120)
    decided = time.monotonic() - started
    assert replicas(world) == 2, "four 1g.24gb per node: 8 claims need exactly 2 nodes, raised in one step"
    from_pending = pending_to_trigger_s(world)  # read now: the pods' Unschedulable condition goes once bound
    bound = wait_sampling(world, watch, "all 8 pods bound through the gate", lambda: all_bound(world, names), TIMEOUT_S)
    took = time.monotonic() - started
    assert replicas(world) == 2, "CA did not scale again while the nodes came up"
    assert Counter(bound.values()) == Counter({n: 4 for n in set(bound.values())}) and len(set(bound.values())) == 2
    # One exclusive gate device per claim: the gate pool is exactly as full as the MIG pool.
    gates = gate_devices(world, [p["metadata"]["name"] for p in pods(world).values()])
    assert len(set(gates)) == 8, gates
    seen = wait_sampling(world, watch, "CA counting both nodes ready", lambda: ca_sees_ready(world, ca, 2), 60)
    assert watch.lagging == [], watch.lagging
    assert "seems to have unready GPU" not in ca.log()
    assert any(
        r == "TriggeredScaleUp" for p in pods(world).values() for r, _ in ca_events(world, p["metadata"]["name"])
    )
    on_the_vswitch(world)
    calls = robot_calls(world, mark)
    set_group_size(world, MD_NAME, 1, 4)  # the next tests: CA never goes below one node
    print(
        f"\nCA scale-up 0->2 for 8x 1g.24gb: replicas raised {decided:.1f}s after the pods were created "
        f"({'n/a' if from_pending is None else f'{from_pending:.0f}s'} from the first Unschedulable to CA's "
        f"TriggeredScaleUp), all 8 bound after {took:.0f}s; "
        f"Robot calls for the two new nodes: {calls}; CA: {seen}"
    )


def test_emptied_node_is_removed_and_its_host_returns(world: World, ca: ClusterAutoscaler) -> None:
    watch = Watch(world, ca)
    nodes = ready_nodes(world)
    assert nodes is not None and len(nodes) == 2, where(world)
    on = placement(world)
    newest = max(nodes, key=lambda n: n.machine["metadata"]["creationTimestamp"])
    keep = next(n for n in nodes if n is not newest)
    before = {name: _hold(h) for name, h in hosts(world).items()}
    victim_host = newest.host["metadata"]["name"]
    started = time.monotonic()
    remove(world, [rs for rs, node in on.items() if node == newest.name])
    wait_sampling(world, watch, "CA scaling the MachineDeployment 2->1", lambda: replicas(world) == 1, 180)
    decided = time.monotonic() - started
    wait(world, "the emptied node gone", lambda: world.k.get_or_none(NODES, newest.name) is None, 180)
    wait(
        world,
        f"{victim_host} back in the pool",
        lambda: (
            host_state(hosts(world)[victim_host]) in ("Available", "Standby")
            and not hosts(world)[victim_host]["spec"].get("consumerRef")
        ),
        180,
    )
    took = time.monotonic() - started
    kept = [keep.machine["metadata"]["name"]]
    wait(
        world, "only the busy node's Machine left", lambda: [m["metadata"]["name"] for m in machines(world)] == kept, 60
    )
    assert (
        world.k.get(CAPI_MACHINES, keep.machine["metadata"]["name"], ns(world))["metadata"].get("deletionTimestamp")
        is None
    )
    still = all_bound(world, [rs for rs, node in on.items() if node == keep.name])
    assert still is not None and set(still.values()) == {keep.name}, "the busy node's pods were not touched"
    # No other host was touched: the kept node's host and the idle one are as they were.
    after = {name: _hold(h) for name, h in hosts(world).items() if name != victim_host}
    assert after == {h: v for h, v in before.items() if h != victim_host}, "a host other than the victim changed"
    assert watch.lagging == [], watch.lagging
    print(f"\nCA scale-down 2->1 of an emptied node: decision after {decided:.0f}s, host back after {took:.0f}s")


def test_two_lightly_used_nodes_are_consolidated(world: World, ca: ClusterAutoscaler) -> None:
    watch = Watch(world, ca)
    busy = [rs for rs, node in placement(world).items() if node]
    assert len(busy) == 4, placement(world)
    submit(world, ["w8"])  # the fifth 1g.24gb: CA adds a node again
    wait_sampling(
        world, watch, "CA raising the MachineDeployment for the fifth claim", lambda: replicas(world) == 2, 120
    )
    wait_sampling(world, watch, "the fifth pod bound", lambda: all_bound(world, [*busy, "w8"]), TIMEOUT_S)
    # Leave one claim on each node: 1 of 4 MIG devices and 1 of 4 gate devices used on both, under CA's 0.5.
    remove(world, busy[1:])
    light = [busy[0], "w8"]
    assert len(set(placement(world)[rs] for rs in light)) == 2, placement(world)
    started = time.monotonic()
    wait_sampling(world, watch, "CA consolidating 2 nodes into 1", lambda: replicas(world) == 1, 180)
    decided = time.monotonic() - started
    moved = wait_sampling(
        world,
        watch,
        "both claims bound on the one remaining node",
        lambda: (b := all_bound(world, light)) and len(set(b.values())) == 1 and len(machines(world)) == 1 and b,
        TIMEOUT_S,
    )
    (node,) = set(moved.values())
    assert world.k.get_or_none(NODES, node) is not None
    wait(world, "the drained node gone", lambda: len(gpu_nodes(world)) == 1, 180)
    assert watch.lagging == [], watch.lagging
    print(f"\nCA consolidation 2->1 (one 1g claim per node): decision after {decided:.0f}s")


def test_cleanup_leaves_min_size(world: World, ca: ClusterAutoscaler) -> None:
    remove(world, list(pods(world)))
    wait(world, "the workloads gone", lambda: not pods(world), 60)
    time.sleep(20)  # longer than CA's unneeded time: it must not go below min size 1
    assert replicas(world) == 1
    assert robot_refusals(world) == [], where(world)
