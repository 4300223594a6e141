"""The runbooks' fleet commands, run for real on a simulated world: node readiness diagnostics (healthy and
with an XID taint), Robot password and SSH key rotation on an installed host, the catalog check against
the GPU shim's real ``-lgip``, a tenant reservation with the real scheduler, an in-place relayout that
evicts and verifies, and a host stuck in reboot cleared by hand.

Convention: an HTML comment ``<!-- e2e: STEP -->`` on the line right above a fenced ``sh`` (or ``bash``)
block in ``docs/runbooks/*.md`` means this module runs that block, as its own ``bash -c`` with
``set -euo pipefail``, against a world of two simulated GEX131s: the operator provisions one into a GPU
node (scale 1), the other stays free for the reboot runbook. The blocks get the variables the runbooks
name: ``NS``, ``CLUSTER``, ``NODE``, ``HOST``, ``WORK``, ``PLAYBOOK_VARS``, ``ROBOT_URL``, ``REPO``,
``HOSTS_NS``. STEP names are unique across runbooks. The tests below run every marked block in an order
that makes each one's precondition true, and inject what a diagnostic block must find (an XID taint, a
server that never boots); the test (not the runbook) stands in only for what a human does outside
Kubernetes (changing the password in Robot's web UI, fixing a boot order). A marked block no test runs,
or a step whose block is gone, fails ``test_every_marked_block_ran``. Unmarked ``sh`` blocks say in the
runbook why they are not run in CI (``tests/integration/test_runbooks.py`` checks that).

Budget: one world (about a minute to start and inspect), one provisioning, one playbook run for the
relayout; about five minutes on two cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from capi_gpu import domain
from capi_gpu.kube import NODES, PODS, Kube, ours
from capi_gpu_sim import binaries, devflow
from capi_gpu_sim.hosts.keys import md5_fingerprint
from capi_gpu_sim.world import World, wait_for

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((REPO / "docs" / "runbooks").glob("*.md"))
_MARKED = re.compile(r"^<!-- e2e: (?P<step>[a-z0-9-]+) -->\n```(?:bash|sh)\n(?P<body>.*?)^```", re.M | re.S)
HOSTS = ours("hetznergpuhosts")
TENANT = "team-a"


def marked_blocks() -> dict[str, tuple[str, str]]:
    """STEP -> (runbook, block body), over every runbook."""
    out: dict[str, tuple[str, str]] = {}
    for doc in RUNBOOKS:
        for m in _MARKED.finditer(doc.read_text()):
            assert m["step"] not in out, f"e2e step {m['step']} marked twice ({out[m['step']][0]}, {doc.name})"
            out[m["step"]] = (doc.name, m["body"])
    return out


@dataclass
class Fleet:
    """The world and the names the runbooks' variables take in it."""

    world: World
    node: str  # the GPU node, and its HetznerGPUHost
    server: int
    free_host: str  # an inspected host no Machine uses
    free_server: int
    env: dict[str, str]
    blocks: dict[str, tuple[str, str]] = field(default_factory=marked_blocks)
    ran: set[str] = field(default_factory=set)

    @property
    def k(self) -> Kube:
        return self.world.k

    def run(self, step: str, timeout: float = 240, **env: str) -> str:
        """Run one marked block; its stdout, or a failure with both streams and the world's dump."""
        doc, body = self.blocks[step]
        self.ran.add(step)
        return self.sh(body, timeout, f"{doc} [{step}]", **env)

    def run_until(self, step: str, ok: Callable[[str], bool], timeout: float = 60) -> str:
        """Re-run a reading block until ``ok``: for state the gate writes after the node's condition."""

        def reads_right() -> str | None:
            out = self.run(step)
            return out if ok(out) else None

        return wait_for(f"[{step}] to read right", reads_right, timeout, interval=1.0)

    def sh(self, script: str, timeout: float = 120, what: str = "setup", **env: str) -> str:
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail -x\n" + script],
            env={**self.env, **env},
            cwd=self.env["WORK"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (
            f"{what} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n"
            f"world: {self.world.dump()}"
        )
        return done.stdout

    def node_condition(self) -> dict[str, Any]:
        node = self.k.get(NODES, self.node)
        return next((c for c in node["status"].get("conditions", []) if c["type"] == "GPUReady"), {})

    def wait_gpu_ready(self, reason: str = "Ready", timeout: float = 120) -> None:
        wait_for(
            f"{self.node} GPUReady reason {reason}", lambda: self.node_condition().get("reason") == reason, timeout
        )

    def host(self, name: str) -> dict[str, Any]:
        return self.k.get(HOSTS, name, self.world.config.namespace)

    def pod_node(self, name: str, namespace: str) -> str | None:
        pod = self.k.get_or_none(PODS, name, namespace)
        return None if pod is None else (pod.get("spec") or {}).get("nodeName")

    def robot_keys(self) -> set[str]:
        assert self.world.robot is not None
        return set(self.world.robot.world.keys)


@pytest.fixture(scope="module")
def fleet(world_factory: Callable[..., World], tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    world = world_factory(hosts=2)
    # The world runs the NVIDIA plugin's pod on each GPU node and confirms pod deletions (sim/node_pods.py):
    # relayout restarts the one and drains through the other.
    assert world.fleet is not None and world.robot is not None and world.node_pods is not None
    world.scale(1)
    ns = world.config.namespace

    def gpu_node() -> str | None:
        for h in world.hosts():
            name = h["metadata"]["name"]
            node = world.k.get_or_none(NODES, name)
            ready = next(
                (c for c in (node or {}).get("status", {}).get("conditions", []) if c["type"] == "GPUReady"), {}
            )
            if h["spec"].get("consumerRef") and ready.get("status") == "True":
                return str(name)
        return None

    node = wait_for("a GPU-ready node", gpu_node, timeout=480, interval=1.0)
    hosts = {h["metadata"]["name"]: h for h in world.hosts()}
    free = next(name for name, h in hosts.items() if not h["spec"].get("consumerRef"))
    path = os.pathsep.join([str(Path(sys.executable).parent), str(binaries.ensure_built().kubectl.parent),
                            os.environ.get("PATH", "")])  # fmt: skip
    env = {
        **os.environ,
        "PATH": path,
        "KUBECONFIG": str(world.cp.kubeconfig),
        "NS": ns,
        "HOSTS_NS": ns,
        "CLUSTER": world.config.cluster,
        "NODE": node,
        "HOST": node,
        "WORK": str(tmp_path_factory.mktemp("runbook-work")),
        "PLAYBOOK_VARS": str(world.playbook_vars_file()),
        "CAPI_GPU_MIG_PARTED": str(binaries.ensure_mig_parted()),  # the binary the world's operator ships
        "ROBOT_URL": world.robot.url,
        "REPO": str(REPO),
    }
    servers = {name: int(h["spec"]["serverNumber"]) for name, h in hosts.items()}
    return Fleet(world, node, servers[node], free, servers[free], env)


def test_node_never_gpu_ready(fleet: Fleet) -> None:
    assert "True Ready: pool" in fleet.run("gpu-ready-node")
    assert f"{domain.PROVIDER_ID_PREFIX}{fleet.server}" in fleet.run("gpu-ready-owner")
    # The gate writes the node, then its gate slice, then the Machine: the fixture waited for the first.
    # One exclusive gate-<i> device per GPU device of the layout (CA rates a node by its busiest pool).
    fleet.run_until(
        "gpu-ready-gate", lambda out: re.search(r"^gate-0 taints= bindingConditions=", out, re.M) is not None
    )
    fleet.run_until("gpu-ready-machine", lambda out: "GPUReady" in out and "True Ready:" in out)
    host = fleet.run("gpu-ready-host")
    assert "MIG 1g.24gb" in host and "ActiveState=active" in host
    ns = fleet.world.config.namespace
    fleet.k.apply(PODS, devflow.claim_pod("rb-demo"), ns)
    wait_for("rb-demo bound", lambda: fleet.pod_node("rb-demo", ns), timeout=120)
    # On a GPU-ready node the gate device is bare: the pod bound without waiting, no condition to write.
    assert "rb-demo" in fleet.run("gpu-ready-claims") and domain.GATE_BINDING_CONDITION not in fleet.run(
        "gpu-ready-claims"
    )

    # An XID on one device: that device's problem, the node stays ready and the reading names the device.
    publisher = fleet.world.fleet.kubelets[fleet.server].publisher if fleet.world.fleet else None
    assert publisher is not None
    device = publisher.add_xid_taint()
    fleet.run_until("gpu-ready-node", lambda out: "True Ready:" in out and device in out)
    # An XID on every device: nothing usable is left, the reading names DeviceTainted and the gate device is tainted.
    for other in [d["name"] for d in publisher.devices if d["name"] != device]:
        publisher.add_xid_taint(other)
    fleet.wait_gpu_ready("DeviceTainted")
    tainted = fleet.run("gpu-ready-node")
    assert "False DeviceTainted:" in tainted and device in tainted
    assert f"{domain.NODE_STARTUP_TAINT}=:NoSchedule" in tainted
    fleet.run_until("gpu-ready-gate", lambda out: domain.GATE_DEVICE_TAINT in out)
    publisher.clear_faults()
    fleet.wait_gpu_ready()
    fleet.k.delete(PODS, "rb-demo", ns)  # the node-pods stand-in confirms it, as a kubelet would
    wait_for("rb-demo gone", lambda: fleet.k.get_or_none(PODS, "rb-demo", ns) is None, timeout=60)


def test_rotate_credentials(fleet: Fleet) -> None:
    robot, world = fleet.world.robot, fleet.world
    assert robot is not None
    # What the human does in Robot's web UI: a new webservice password (the old one stops working).
    robot.users[robot.username] = "rotated-" + robot.password
    fleet.run("robot-password", ROBOT_PASSWORD=robot.password)
    assert "servers in the account" in fleet.run("robot-password-check", timeout=420)

    old_fp = md5_fingerprint(world.key.public_line)
    assert old_fp in fleet.robot_keys()
    fleet.run("ssh-new-key")
    assert f"{fleet.node}: new key accepted" in fleet.run("ssh-authorize")
    fleet.run("ssh-swap")
    assert f"{fleet.node}: old key removed" in fleet.run("ssh-retire-old")
    fleet.run("robot-key-delete")
    assert old_fp not in fleet.robot_keys()
    assert "presents the key pinned" in fleet.run("hostkey-check")


def test_upgrade_the_driver(fleet: Fleet) -> None:
    # Logs in with the rotated key: the Secret and the host's authorized_keys now hold only the new one.
    assert "the catalog agrees" in fleet.run("driver-lgip")
    assert re.search(r"gpu-0-mig-\S+ driver 580\.", fleet.run("driver-check"))


def test_reserve_devices_for_a_tenant(fleet: Fleet) -> None:
    ns = fleet.world.config.namespace
    assert "1g.24gb" in fleet.run("reserve-pick")
    fleet.run("reserve", NS=TENANT)
    # Another tenant's 1g.24gb pod: free devices exist, but all of them are reserved.
    fleet.k.apply(PODS, devflow.claim_pod("rb-other"), ns)
    fleet.run("tenant-pod", NS=TENANT)
    assert fleet.pod_node(f"{TENANT}-job", TENANT) == fleet.node

    def unschedulable() -> bool:
        pod = fleet.k.get(PODS, "rb-other", ns)
        conds = (pod.get("status") or {}).get("conditions", [])
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

    wait_for("rb-other refused", unschedulable, timeout=60)
    assert fleet.pod_node("rb-other", ns) is None


def test_relayout_a_gpu(fleet: Fleet) -> None:
    assert re.search(r"\b1 pods? would be evicted", fleet.run("relayout-preview"))
    out = fleet.run("relayout", timeout=600)
    assert "restart DRA plugin pod" in out and "applied and verified" in out
    pods = fleet.world.node_pods
    assert pods is not None
    # The restart is counted just after the new slices are written, which is what relayout waited for.
    wait_for("the plugin restart counted", lambda: pods.restarts[fleet.node] == 1, 10)
    assert pods.restarts[fleet.node] == 1
    # The tenant's pod held a device of the old layout: the NoExecute rule evicted it.
    assert fleet.k.get_or_none(PODS, f"{TENANT}-job", TENANT) is None
    verify = fleet.run("relayout-verify")
    assert "True: pool" in verify and "1g.24gb=4" in verify
    assert len(re.findall(r"gpu-0-mig-1g24gb-14-\d+\t1g\.24gb", verify)) == 4


def test_reservation_ends(fleet: Fleet) -> None:
    ns = fleet.world.config.namespace
    fleet.k.delete(PODS, "rb-other", ns)  # its scheduling attempts are history; a new pod asks afresh
    wait_for("rb-other gone", lambda: fleet.k.get_or_none(PODS, "rb-other", ns) is None, timeout=60)
    fleet.run("reserve-end", NS=TENANT)
    fleet.k.apply(PODS, devflow.claim_pod("rb-after"), ns)
    assert wait_for("rb-after bound", lambda: fleet.pod_node("rb-after", ns), timeout=120) == fleet.node
    fleet.k.delete(PODS, "rb-after", ns)


def test_host_stuck_in_reboot(fleet: Fleet) -> None:
    world, host = fleet.world, fleet.free_host
    assert world.robot is not None and world.fleet is not None
    # The server stops booting (as with a boot order that skips the network), and is dark now.
    world.robot.set_faults(never_boot=[fleet.free_server])
    world.fleet.host(fleet.free_server).power_off(hard=True)
    fleet.sh(f'capi-gpu hosts inspect -n "$NS" {host}')

    def exhausted() -> bool:
        st = fleet.host(host).get("status") or {}
        return st.get("errorType") == "RebootTimeout"

    wait_for(f"{host} RebootTimeout", exhausted, timeout=240, interval=1.0)
    read = fleet.run("reboot-read", HOST=host)
    assert "RebootTimeout permanent=true" in read and "Error/Rescue" in read
    assert "reset-sw" in read and "reset-hw" in read
    assert re.search(r'"active":\s*true', fleet.run("reboot-robot", HOST=host))
    # The human fixes the boot order; then the runbook clears the error.
    world.robot.set_faults(never_boot=[])
    fleet.run("reboot-clear", HOST=host)
    assert "ErrorCleared" in fleet.run("reboot-recovered", HOST=host, timeout=300)
    # Its rescue activation used the rotated key: Robot's key store has it now.
    new_pub = (Path(fleet.env["WORK"]) / "robot-ssh-new.pub").read_text()
    assert md5_fingerprint(new_pub) in fleet.robot_keys()


def test_every_marked_block_ran(fleet: Fleet) -> None:
    assert set(fleet.blocks) - fleet.ran == set(), "marked runbook blocks no test ran"
