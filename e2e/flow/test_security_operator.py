"""The operator as a tenant of the management cluster, across one whole run (two GPU Machines provisioned, one
deprovisioned, one moved away): installed from the release, it runs as its own ServiceAccount under exactly the
shipped RBAC (config/rbac, the pod's TokenRequest token) and never meets a Forbidden; a clusterctl-move style delete
(Cluster paused, delete-for-move on the HetznerGPUMachine and its host) releases both finalizers without
touching the server (no Robot call about it, no kubeadm reset, its OS and node keep running), and the objects
created again the way clusterctl move creates them on the target (no status, new uids, the host before its
machine and OS host-key Secret) are adopted without touching it either; and no secret
(the Robot password, a rescue root password, the SSH private key, an OS host private key, the bootstrap token,
the ServiceAccount and workload tokens) appears in any operator log, Ansible artifact, Event, or object of ours."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import release_kit
from fault_kit import (
    GPU_MACHINES,
    HOSTS,
    condition,
    converged,
    gpu_machines,
    host_name,
    host_obj,
    machine_of,
    robot_log,
    secret_text,
    status,
    until,
)

from capi_gpu import domain
from capi_gpu.kube import CAPI_CLUSTERS, CAPI_MACHINES, EVENTS, JSON_PATCH, NODES, SECRETS, Forbidden, Kube, Res, ours
from capi_gpu_sim import identity
from capi_gpu_sim.world import World

OUR_KINDS = ("hetznergpuhosts", "hetznergpumachines", "hetznergpuclusters", "hetznergpumachinetemplates",
             "hetznergpuremediations")  # fmt: skip
SELF_REVIEWS = Res("authentication.k8s.io", "v1", "selfsubjectreviews", namespaced=False)


@pytest.fixture(scope="module")
def sec_world(world_factory: Callable[..., World]) -> Iterator[World]:
    world = world_factory(hosts=2)
    yield world


def _operator_kube(world: World) -> Kube:
    """The manager's ServiceAccount, with a token of its own from the TokenRequest API."""
    path = world.config.state_dir / "sa.kubeconfig"
    return Kube.from_kubeconfig(str(identity.service_account_kubeconfig(world.cp, path)))


def test_as_its_service_account_under_the_shipped_rbac_the_operator_provisions_without_a_forbidden(
    sec_world: World,
) -> None:
    world = sec_world
    assert world.fleet is not None
    sa = _operator_kube(world)
    try:
        review = sa.create(SELF_REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review["status"]["userInfo"]["username"] == (
            f"system:serviceaccount:{identity.SA_NAMESPACE}:{identity.SA_NAME}"
        )
        with pytest.raises(Forbidden):  # least privilege: Secrets by name only, never listed
            sa.list(SECRETS, world.config.namespace)
        with pytest.raises(Forbidden):
            sa.delete(HOSTS, host_name(next(iter(world.fleet.hosts))), world.config.namespace)
    finally:
        sa.close()
    # The manager runs as that ServiceAccount, with no kubeconfig of ours: in-cluster config only.
    pods = world.operator_pods()
    assert pods and all(p["spec"]["serviceAccountName"] == identity.SA_NAME for p in pods), pods
    assert not [a for p in pods for c in p["spec"]["containers"] for a in c.get("args", []) if "kubeconfig" in a]

    numbers = list(world.fleet.hosts)
    world.scale(2)
    until("both Machines provisioned, nodes joined", lambda: all(converged(world, n) for n in numbers), 360, world)
    world.scale(1)
    until(
        "one host deprovisioned back to Available (its HetznerGPUMachine gone), the other still serving",
        lambda: (
            sorted(str(status(world, n).get("state")) for n in numbers) == ["Available", "Provisioned"]
            and len(gpu_machines(world)) == 1
        ),
        180,
        world,
    )
    logs = world.operator_logs()
    forbidden = [line for line in logs.splitlines() if "forbidden" in line.lower()]
    assert not forbidden, "\n".join(forbidden[:20])
    # The apiserver's word, not the log's: the only Forbidden answers to the ServiceAccount are the two this
    # test provoked above with a token of its own.
    audit = release_kit.operator_audit(world)
    forbidden = [(r.verb, r.resource) for r in audit["forbidden"]]
    assert audit["requests"] > 0 and forbidden == [("list", "secrets"), ("delete", "hetznergpuhosts")], forbidden


def test_delete_for_move_releases_the_finalizers_and_never_touches_the_server(sec_world: World) -> None:
    world = sec_world
    assert world.fleet is not None
    ns = world.config.namespace
    number = next(n for n in world.fleet.hosts if status(world, n).get("state") == "Provisioned")
    host = world.fleet.host(number)
    machine = machine_of(world, number)
    assert machine is not None and converged(world, number)
    boot_id, boots = host.boot_id, host.boot_count()
    # As clusterctl move does: pause the Cluster, mark what it deletes from the source, then delete.
    world.k.patch(CAPI_CLUSTERS, world.config.cluster, {"spec": {"paused": True}}, ns)
    since, log_from = len(robot_log(world)), len(world.operator_logs())
    saved = {
        "host": world.k.get(HOSTS, host_name(number), ns),
        "machine": world.k.get(GPU_MACHINES, machine, ns),
        "key": world.k.get(SECRETS, f"{host_name(number)}{domain.OS_HOSTKEY_SECRET_SUFFIX}", ns),
    }
    sessions = _ssh_logins(host)
    # clusterctl v1.14's own mark (mover.go addDeleteForMoveAnnotationPatch): a JSON patch that adds
    # /metadata/annotations whole, so every other annotation (our status snapshot, block-move) goes with it.
    marked = [{"op": "add", "path": "/metadata/annotations", "value": {domain.DELETE_FOR_MOVE_ANNOTATION: ""}}]
    world.k.patch(GPU_MACHINES, machine, marked, ns, content_type=JSON_PATCH)
    world.k.patch(HOSTS, host_name(number), marked, ns, content_type=JSON_PATCH)
    assert world.k.get(GPU_MACHINES, machine, ns)["metadata"].get("finalizers"), "nothing to release"
    assert world.k.get(HOSTS, host_name(number), ns)["metadata"].get("finalizers"), "nothing to release"
    world.k.delete(GPU_MACHINES, machine, ns)
    world.k.delete(HOSTS, host_name(number), ns)
    until(
        "both objects gone (finalizers released)",
        lambda: (
            world.k.get_or_none(GPU_MACHINES, machine, ns) is None
            and world.k.get_or_none(HOSTS, host_name(number), ns) is None
        ),
        60,
        world,
    )
    # Robot: not one request about this server.
    about = [e for e in robot_log(world, since) if f"/{number}" in e.path]
    assert about == [], [(e.method, e.path) for e in about]
    # The server: same boot, still the installed OS, still joined (no kubeadm reset ran).
    assert (host.boot_id, host.boot_count(), host.running.value) == (boot_id, boots, "installed")
    assert host.read_file("/var/lib/kubelet/sim-join.json") is not None
    assert host.read_file("/var/lib/kubelet/sim-reset.json") is None
    assert world.k.get_or_none(NODES, host_name(number)) is not None
    assert "kubeadm-reset" not in world.operator_logs()[log_from:]
    _recreate_as_clusterctl_move_does(world, number, saved)
    # Across the whole move: not one Robot request about the server, not one reboot, no new SSH login.
    about = [e for e in robot_log(world, since) if f"/{number}" in e.path]
    assert about == [], [(e.method, e.path) for e in about]
    assert (host.boot_id, host.boot_count(), host.running.value) == (boot_id, boots, "installed")
    assert host.read_file("/var/lib/kubelet/sim-reset.json") is None
    assert _ssh_logins(host) == sessions
    mine = [line for line in world.operator_logs()[log_from:].splitlines() if host_name(number) in line]
    steps = ("activate-rescue", "reset-sw", "reset-hw", "reset-ssh", "installimage", "kubeadm-reset")
    assert not [line for line in mine if any(s in line for s in steps)], mine[-20:]


def _ssh_logins(host: Any) -> int:
    console = host.state_dir / "boots" / str(host.boot_count()) / "console.log"
    return console.read_text(errors="replace").count("Accepted publickey")


def _copy(obj: dict[str, Any], **owner_uids: str) -> dict[str, Any]:
    """What clusterctl move's create sends: the object without status, uid, resourceVersion or the source's
    delete-for-move mark, its ownerReferences pointing at the owners' new uids."""
    meta = obj["metadata"]
    out = {k: v for k, v in obj.items() if k != "status"}
    out["metadata"] = {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "labels": meta.get("labels") or {},
        "annotations": {
            k: v for k, v in (meta.get("annotations") or {}).items() if k != domain.DELETE_FOR_MOVE_ANNOTATION
        },
        "ownerReferences": [
            {**o, "uid": owner_uids.get(o["kind"], o["uid"])} for o in meta.get("ownerReferences") or []
        ],
    }
    return out


def _wait_paused_only(world: World, number: int) -> dict[str, Any]:
    def paused() -> dict[str, Any] | None:
        st = status(world, number)
        cond = condition({"status": st}, "Paused")
        return st if cond is not None and cond["status"] == "True" else None

    st = until("the recreated host paused through its recorded Cluster", paused, 60, world)
    time.sleep(3)  # a few host polls: still nothing but the Paused condition
    st = status(world, number)
    assert st.get("state") == "Provisioned" and st["hostKeys"]["os"], st  # restored from the snapshot
    assert [c["type"] for c in st["conditions"]] == ["Paused"], st["conditions"]
    return st


def _recreate_as_clusterctl_move_does(world: World, number: int, saved: dict[str, dict[str, Any]]) -> None:
    ns = world.config.namespace
    # The host first (it has no owner), with its consumerRef still naming the old machine's uid: its status
    # comes back from the snapshot, and it waits for its OS host-key Secret (a new key would lock it out).
    key_name = saved["key"]["metadata"]["name"]
    if world.k.get_or_none(SECRETS, key_name, ns) is not None:  # the GC takes it with its host, maybe not yet
        world.k.delete(SECRETS, key_name, ns)
    until("the OS host-key Secret gone with its host", lambda: world.k.get_or_none(SECRETS, key_name, ns) is None, 30)
    created = world.k.create(HOSTS, _copy(saved["host"]), ns)
    # The Cluster is still paused, and the host finds it through the Cluster its claim recorded (its
    # consumer-cluster label): its status comes back from the snapshot (what move dropped), then it says
    # Paused and nothing else (no wait reason, no step) until clusterctl resumes the Cluster.
    _wait_paused_only(world, number)
    # Then its Secret (clusterctl creates an owner's children after it, owned by the new uid).
    key = _copy(saved["key"], HetznerGPUHost=created["metadata"]["uid"])
    world.k.create(SECRETS, {**key, "type": saved["key"].get("type", "Opaque")}, ns)
    # Then the machine, owned by the CAPI Machine, and clusterctl resumes the Cluster.
    capi_name = next(o["name"] for o in saved["machine"]["metadata"]["ownerReferences"] if o["kind"] == "Machine")
    capi = world.k.get(CAPI_MACHINES, capi_name, ns)
    new = world.k.create(GPU_MACHINES, _copy(saved["machine"], Machine=capi["metadata"]["uid"]), ns)
    assert new["metadata"]["uid"] != saved["machine"]["metadata"]["uid"]
    world.k.patch(CAPI_CLUSTERS, world.config.cluster, {"spec": {"paused": False}}, ns)
    until(
        "the moved machine adopted (consumerRef.uid refreshed) and the chain whole again",
        lambda: (
            host_obj(world, number)["spec"]["consumerRef"]["uid"] == new["metadata"]["uid"] and converged(world, number)
        ),
        120,
        world,
    )
    restored = status(world, number)
    assert restored["state"] == "Provisioned" and restored["hostKeys"]["os"], restored
    node = world.k.get(NODES, host_name(number))
    gpu_ready = next(c for c in node["status"]["conditions"] if c["type"] == domain.GPU_READY_CONDITION)
    assert gpu_ready["status"] == "True"
    assert domain.NODE_STARTUP_TAINT not in {t["key"] for t in node["spec"].get("taints") or []}


def _key_lines(private: str) -> list[str]:
    return [line for line in private.splitlines() if len(line) >= 16 and "PRIVATE KEY" not in line]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _secrets(world: World) -> dict[str, list[str]]:
    assert world.robot is not None and world.pods is not None
    ns = world.config.namespace
    with world.robot.locked() as account:
        rescue_passwords = [s.last_rescue.password for s in account.servers.values() if s.last_rescue]
    bootstrap = secret_text(world, f"{world.config.cluster}-gpu-bootstrap", "value")
    tokens = re.findall(r"token: ([a-z0-9]{6}\.[a-z0-9]{16})", bootstrap)
    assert tokens, "no bootstrap token in the bootstrap data"
    os_keys: list[str] = []
    for s in world.k.list(SECRETS, ns):
        if s["metadata"]["name"].endswith(domain.OS_HOSTKEY_SECRET_SUFFIX):
            private = base64.b64decode(s["data"]["ssh-host-privatekey"]).decode()
            os_keys += [*_key_lines(private), _b64(private.rstrip("\n") + "\n")]
    assert os_keys, "no OS host key Secret"
    return {
        "Robot password": [world.robot.password],
        "rescue root password": rescue_passwords,
        "SSH private key": [*_key_lines(world.key.private_openssh), _b64(world.key.private_openssh)],
        "OS host private key": os_keys,
        "bootstrap token": [*tokens, *(t.split(".")[1] for t in tokens), _b64(bootstrap)],
        "ServiceAccount token": list(world.pods.tokens),  # every token the kubelet stand-in handed a pod
        "workload (admin) token": [world.cp.token],
    }


def _haystacks(world: World) -> dict[str, str]:
    ns = world.config.namespace
    out = {"operator logs": world.operator_logs()}
    out["Ansible artifacts"] = "\n".join(
        p.read_text(errors="replace") for d in world.artifacts_dirs() for p in sorted(d.rglob("*")) if p.is_file()
    )
    out["Events"] = json.dumps(world.k.list(EVENTS))
    objects: list[Any] = [world.k.list(ours(kind), ns) for kind in OUR_KINDS]
    out["our objects"] = json.dumps(objects)
    out["CAPI Machines' status"] = json.dumps([m.get("status") for m in world.k.list(CAPI_MACHINES, ns)])
    return out


def test_no_secret_in_any_log_artifact_event_or_status(sec_world: World) -> None:
    world = sec_world
    secrets, haystacks = _secrets(world), _haystacks(world)
    assert len(haystacks["operator logs"]) > 10_000 and len(haystacks["Ansible artifacts"]) > 10_000
    # The haystacks hold a whole run: provisioning, deprovisioning, the moved machine.
    assert all(reason in haystacks["Events"] for reason in ("Bootstrapped", "Configured", "Deprovisioned"))
    assert "HetznerGPUHost" in haystacks["our objects"] and "HetznerGPUMachine" in haystacks["our objects"]
    leaks = [
        f"{what} in {where}"
        for what, values in secrets.items()
        for value in values
        for where, text in haystacks.items()
        if value and value in text
    ]
    assert not leaks, sorted(set(leaks))
