"""The kubeadm shim and the simulated kubelet against the real workload apiserver: CAPI bootstrap data
(cloud-config runcmd kubeadm join, v1beta4 list kubeletExtraArgs) registers a Node with providerID,
taints and labels and writes the sentinel; kubeadm reset deletes it; bootstrapped again (after the reset,
with the next Machine's instance-id) the host runs the new user-data. The NVIDIA-format DRA publisher's
slices pass the apiserver's ResourceSlice validation, carry the devices the MIG layout promises, and its
fault knobs (XID taint, stale generation, incomplete pool, stop) show up in the API."""

from __future__ import annotations

import base64
import os
import time
from importlib import resources

import pytest
from sim_helpers import BOOT_TIMEOUT_S, RobotApi, boot_rescue
from test_install_and_boot_targets import autosetup, post_install, wait_install

from capi_gpu import domain
from capi_gpu.gpu import catalog, layout
from capi_gpu.kube import NODES, RESOURCESLICES, Kube
from capi_gpu.provisioning import bootstrap, ssh
from capi_gpu.provisioning.model import CloudInitState, InstallProgress
from capi_gpu_sim import host_shims
from capi_gpu_sim.fleet import Fleet, install_on_disk
from capi_gpu_sim.hosts import keys
from capi_gpu_sim.hosts.host import Host

JOIN_CONFIG = """apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: 127.0.0.1:6443
    token: abcdef.0123456789abcdef
    caCertHashes: ["sha256:{hash}"]
nodeRegistration:
  name: {name}
  taints:
  - {{key: {startup}, effect: NoSchedule}}
  - {{key: node.cluster.x-k8s.io/uninitialized, effect: NoSchedule}}
  kubeletExtraArgs:
  - {{name: provider-id, value: "hrobot://{number}"}}
  - {{name: node-labels, value: "cluster-api/accelerator=rtx-pro-6000,node.cluster.x-k8s.io/gpu=true"}}
"""


def cloud_config(join_config: str) -> str:
    """The shape CABPK writes: the join config as a b64 file, runcmd kubeadm join && sentinel."""
    b64 = base64.b64encode(join_config.encode()).decode()
    return (
        "#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n  owner: root:root\n"
        f"  permissions: '0640'\n  encoding: b64\n  content: {b64}\nruncmd:\n"
        "- 'kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > "
        "/run/cluster-api/bootstrap-success.complete'\n"
    )


def install_os(
    fleet: Fleet, api: RobotApi, client: keys.KeyPair, user_data: str, extra: dict[str, host_shims.GuestFile]
) -> tuple[Host, ssh.HostKeyPin]:
    host = fleet.host()
    rescue = boot_rescue(host, api, client)
    os_key = keys.generate()
    with rescue.shell(client) as shell:
        shell.start_installimage(
            autosetup("/dev/nvme0n1", hostname=f"bm-{host.server_number}"),
            post_install(os_key, f"bm-{host.server_number}", user_data),
        )
        assert wait_install(shell).state is InstallProgress.SUCCEEDED
        install_on_disk(host, extra)  # what the playbooks' apt installs would have put there
        before = host.boot_count()
        shell.reboot()
    assert host.wait_up(BOOT_TIMEOUT_S, after_boot=before)
    return host, ssh.HostKeyPin.from_public_key(os_key.public_line)


def _labels(kube: Kube, node: str) -> dict[str, str]:
    labels: dict[str, str] = ((kube.get_or_none(NODES, node) or {}).get("metadata") or {}).get("labels") or {}
    return labels


def _wait(pred: object, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_bootstrap_registers_the_node_and_reset_removes_it(
    fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair, workload_kube: Kube
) -> None:
    number = fleet.host().server_number
    name = f"bm-{number}"
    join = JOIN_CONFIG.format(hash="0" * 64, name=name, startup=domain.NODE_STARTUP_TAINT, number=number)
    host, pin = install_os(fleet, robot_api, client_key, cloud_config(join), host_shims.kubeadm_files())
    kubelet = fleet.attach_workload(workload_kube, publish_dra=False)[number]
    try:
        assert kubelet.wait_node(60), kubelet.errors
        node = workload_kube.get(NODES, name)
        assert node["spec"]["providerID"] == f"{domain.PROVIDER_ID_PREFIX}{number}"
        assert {t["key"] for t in node["spec"]["taints"]} == {
            domain.NODE_STARTUP_TAINT,
            "node.cluster.x-k8s.io/uninitialized",
        }
        assert node["metadata"]["labels"]["cluster-api/accelerator"] == "rtx-pro-6000"
        assert node["status"]["capacity"]["cpu"] == "48" and node["status"]["capacity"]["pods"] == "110"
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert {"type": "InternalIP", "address": host.guest_ip} in node["status"]["addresses"]
        with ssh.ParamikoShell(
            ssh.Endpoint(host.guest_ip, pin), ssh.Credentials(private_key=client_key.private_openssh)
        ) as sh:
            assert sh.cloud_init_status() is CloudInitState.DONE
            assert sh.sentinel_present()
            sh.kubeadm_reset()
            assert not sh.sentinel_present()
        assert _wait(lambda: workload_kube.get_or_none(NODES, name) is None), "node not deleted after kubeadm reset"
    finally:
        kubelet.stop()


def test_a_reset_host_bootstrapped_with_a_new_instance_id_runs_the_new_user_data(
    fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair, workload_kube: Kube
) -> None:
    """A host back in the pool keeps cloud-init's record of its first bootstrap (kubeadm reset leaves it, as
    the real one does); what makes the next bootstrap run is the new Machine's instance-id, as in cloud-init."""
    number = fleet.host().server_number
    name = f"bm-{number}"
    join = JOIN_CONFIG.format(hash="0" * 64, name=name, startup=domain.NODE_STARTUP_TAINT, number=number)
    host, pin = install_os(fleet, robot_api, client_key, cloud_config(join), host_shims.kubeadm_files())
    second = cloud_config(join.replace("gpu=true", "gpu=true,capi-gpu.test/bootstrap=second"))
    kubelet = fleet.attach_workload(workload_kube, publish_dra=False)[number]
    try:
        assert kubelet.wait_node(60), kubelet.errors
        with ssh.ParamikoShell(
            ssh.Endpoint(host.guest_ip, pin), ssh.Credentials(private_key=client_key.private_openssh)
        ) as sh:
            assert sh.cloud_init_status() is CloudInitState.DONE
            sh.kubeadm_reset()
            assert _wait(lambda: workload_kube.get_or_none(NODES, name) is None), "node not deleted after reset"
            # The same instance-id again: cloud-init has finished that instance and runs nothing.
            sh.write_file("/var/lib/cloud/seed/nocloud-net/user-data", second)
            rerun = host.exec(["sh", "-c", bootstrap.START.replace(" &", "")], timeout=60)
            assert rerun.returncode == 0, rerun.stderr
            assert host.read_file("/var/lib/kubelet/sim-join.json") is None
            # The next Machine's instance-id: a new instance, the new user-data runs (init, then modules).
            sh.start_bootstrap(second, f"instance-id: machine-uid-2\nlocal-hostname: {name}\n")
            assert _wait(lambda: _labels(workload_kube, name).get("capi-gpu.test/bootstrap") == "second"), (
                "the new user-data's join did not register the node"
            )
            assert _wait(lambda: sh.cloud_init_status() is CloudInitState.DONE)
            assert sh.sentinel_present()
        assert os.readlink(host.guest_path("/var/lib/cloud/instance")) == "/var/lib/cloud/instances/machine-uid-2"
        assert host.read_file("/var/lib/cloud/instances/machine-uid-2/user-data.txt") == second.encode()
    finally:
        kubelet.stop()


def test_published_slices_match_the_layout_and_the_fault_knobs(
    fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair, workload_kube: Kube
) -> None:
    number = fleet.host().server_number
    name = f"bm-{number}"
    smi = resources.files("capi_gpu_sim.gpu_shim").joinpath("nvidia_smi.py").read_bytes()
    files = {**host_shims.kubeadm_files(), "/usr/bin/nvidia-smi": host_shims.GuestFile(smi)}
    host, _pin = install_os(fleet, robot_api, client_key, "#cloud-config\n{}\n", files)
    model = catalog.builtin_catalog().model("2bb5")
    placed = layout.validate(model, {"1g.24gb": 2, "2g.48gb": 1})  # as mig-parted would place them
    cgi = ",".join(f"{p.gi_profile_id}:{p.start}" for p in placed)
    # The image's kernel stand-in answers nvidia-smi only with the nvidia module loaded: put the module where
    # the driver's DKMS build would and load it, as the node playbook leaves a host.
    load = 'd="/lib/modules/$(uname -r)/updates/dkms" && mkdir -p "$d" && : > "$d/nvidia.ko" && modprobe nvidia'
    for argv in (["sh", "-c", load], ["nvidia-smi", "-i", "0", "-mig", "1"], ["nvidia-smi", "mig", "-cgi", cgi, "-C"]):
        res = host.exec(argv)
        assert res.returncode == 0, res.stdout + res.stderr
    join = JOIN_CONFIG.format(hash="0" * 64, name=name, startup=domain.NODE_STARTUP_TAINT, number=number)
    res = host.exec(["sh", "-c", "cat > /tmp/join.yaml && kubeadm join --config /tmp/join.yaml"], stdin=join.encode())
    assert res.returncode == 0, res.stderr
    kubelet = fleet.attach_workload(workload_kube)[number]
    try:
        assert kubelet.wait_published(60), kubelet.errors
        pub = kubelet.publisher
        assert pub is not None
        slices = workload_kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={name}")
        assert len(slices) == 1
        spec = slices[0]["spec"]
        assert slices[0]["metadata"]["name"].startswith(f"{name}-gpu.nvidia.com-")
        assert spec["driver"] == "gpu.nvidia.com" and spec["pool"]["name"] == name
        want = [d.name for d in layout.expected_devices(model, {"1g.24gb": 2, "2g.48gb": 1})]
        assert sorted(d["name"] for d in spec["devices"]) == sorted(want)
        dev = next(d for d in spec["devices"] if d["name"].startswith("gpu-0-mig-1g24gb-14-"))
        start = int(dev["name"].rsplit("-", 1)[1])
        assert dev["attributes"]["type"] == {"string": "mig"}
        assert dev["attributes"]["profile"] == {"string": "1g.24gb"}
        assert dev["attributes"]["driverVersion"]["version"].count(".") == 2
        slices_of_dev = {f"memorySlice{i}" for i in range(start, start + 3)}
        assert slices_of_dev | {"multiprocessors", "memory", "copyEngines", "ofaEngines"} <= set(dev["capacity"])
        assert dev["attributes"]["parentUUID"]["string"].startswith("GPU-")
        gen = spec["pool"]["generation"]

        tainted = pub.add_xid_taint(code=79)
        spec = workload_kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={name}")[0]["spec"]
        taint = next(d for d in spec["devices"] if d["name"] == tainted)["taints"][0]
        assert (taint["key"], taint["value"], taint["effect"]) == ("gpu.nvidia.com/xid", "79", "NoSchedule")
        assert spec["pool"]["generation"] == gen + 1

        pub.publish_stale()
        gens = sorted(
            s["spec"]["pool"]["generation"]
            for s in workload_kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={name}")
        )
        assert gens == [gen + 1, gen + 2]

        pub.publish_incomplete()
        pool = [s["spec"]["pool"] for s in workload_kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={name}")]
        assert len(pool) == 1 and pool[0]["resourceSliceCount"] == 2

        pub.stop()
        assert workload_kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={name}") == []

        host.gpu_fall_off_bus()  # until the next reboot
        lost = host.exec(["nvidia-smi", "-L"])
        assert lost.returncode == 15 and b"GPU is lost" in lost.stdout + lost.stderr
        assert b"(rev ff)" in host.exec(["lspci", "-nn"]).stdout
    finally:
        kubelet.stop()
    assert workload_kube.get_or_none(NODES, name) is None


def test_an_invalid_slice_is_refused_by_the_apiserver(workload_kube: Kube) -> None:
    """The schema check is the apiserver's: a device name that is not a DNS label is rejected."""
    from capi_gpu.kube import Invalid

    bad = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "bad-"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0-mig-1g.24gb-14-0"}],
        },
    }
    with pytest.raises(Invalid):
        workload_kube.create(RESOURCESLICES, bad)
