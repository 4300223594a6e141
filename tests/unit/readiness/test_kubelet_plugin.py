"""Gate kubelet plugin over its unix sockets, driven as the kubelet does: registration, prepare, stop, CLI."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest

from capi_gpu import domain
from capi_gpu.readiness import kubeletplugin
from capi_gpu.readiness.proto import dra_v1_pb2 as dra
from capi_gpu.readiness.proto import dra_v1_pb2_grpc as dra_grpc
from capi_gpu.readiness.proto import pluginregistration_v1_pb2 as reg
from capi_gpu.readiness.proto import pluginregistration_v1_pb2_grpc as reg_grpc

CLAIMS = [
    dra.Claim(namespace="team-a", uid="7d1c6d4e-0000-4000-8000-000000000001", name="trainer-gpu-x1"),
    dra.Claim(namespace="team-a", uid="7d1c6d4e-0000-4000-8000-000000000002", name="trainer-gpu-x2"),
]


@pytest.fixture
def paths() -> Iterator[kubeletplugin.PluginPaths]:
    # Short base directory: unix socket paths are limited to 107 bytes, and pytest's tmp_path is long.
    base = pathlib.Path(tempfile.mkdtemp(prefix="gp-", dir="/tmp"))
    try:
        yield kubeletplugin.PluginPaths(domain.GATE_DRIVER, base / "plugins", base / "plugins_registry")
    finally:
        shutil.rmtree(base)


def wait_for_socket(path: pathlib.Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and stat.S_ISSOCK(path.stat().st_mode)):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def kubelet_registers(paths: kubeletplugin.PluginPaths, *, accept: bool = True) -> reg.PluginInfo:
    """What the kubelet's plugin watcher does when a socket appears in plugins_registry."""
    wait_for_socket(paths.registration_socket)
    with grpc.insecure_channel(f"unix://{paths.registration_socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg.InfoRequest(), timeout=5)
        # The DRA plugin manager's validation: known type, a supported service, an existing endpoint.
        ok = info.type == "DRAPlugin" and "v1.DRAPlugin" in info.supported_versions
        ok = ok and stat.S_ISSOCK(os.stat(info.endpoint).st_mode)
        stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=ok and accept, error="" if ok and accept else "rejected"),
            timeout=5,
        )
    return info


def test_kubelet_registration_then_prepare_and_unprepare(paths: kubeletplugin.PluginPaths) -> None:
    with kubeletplugin.GatePlugin(paths) as plugin:
        info = kubelet_registers(paths)
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin",
            domain.GATE_DRIVER,
            str(paths.dra_socket),
        )
        assert list(info.supported_versions) == ["v1.DRAPlugin"]
        assert plugin.wait_for_registration(5) == kubeletplugin.RegistrationResult(True, "")
        assert paths.registration_socket.name == f"{domain.GATE_DRIVER}-reg.sock"
        assert paths.dra_socket.parent.name == domain.GATE_DRIVER

        with grpc.insecure_channel(f"unix://{info.endpoint}") as channel:
            stub = dra_grpc.DRAPluginStub(channel)
            prepared = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=CLAIMS), timeout=5)
            assert set(prepared.claims) == {c.uid for c in CLAIMS}
            for result in prepared.claims.values():
                assert (result.error, list(result.devices)) == ("", [])
            unprepared = stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=CLAIMS), timeout=5)
            assert set(unprepared.claims) == {c.uid for c in CLAIMS}
            assert all(r.error == "" for r in unprepared.claims.values())
        assert kubeletplugin.probe(paths) is None

    # Stopping removes both sockets: the plugin watcher deregisters, and the probe now fails.
    assert not paths.registration_socket.exists()
    assert not paths.dra_socket.exists()
    assert kubeletplugin.probe(paths, timeout=1) is not None


def test_rejected_registration_is_reported(paths: kubeletplugin.PluginPaths) -> None:
    with kubeletplugin.GatePlugin(paths) as plugin:
        kubelet_registers(paths, accept=False)
        assert plugin.wait_for_registration(5) == kubeletplugin.RegistrationResult(False, "rejected")


def test_no_kubelet_callback_means_no_verdict(paths: kubeletplugin.PluginPaths) -> None:
    with kubeletplugin.GatePlugin(paths) as plugin:
        assert plugin.wait_for_registration(0.1) is None


def test_stale_sockets_from_a_previous_container_are_replaced(paths: kubeletplugin.PluginPaths) -> None:
    for socket in (paths.registration_socket, paths.dra_socket):
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.write_text("stale")
    with kubeletplugin.GatePlugin(paths):
        kubelet_registers(paths)
        assert kubeletplugin.probe(paths) is None


def test_probe_names_a_socket_that_answers_for_another_driver(paths: kubeletplugin.PluginPaths) -> None:
    with kubeletplugin.GatePlugin(paths):
        other = kubeletplugin.PluginPaths("other.example.com", paths.plugins_dir, paths.registry_dir)
        # Point the probe at our registration socket under another driver's name.
        other.registry_dir.joinpath("other.example.com-reg.sock").symlink_to(paths.registration_socket)
        problem = kubeletplugin.probe(other, timeout=2)
        assert problem is not None and domain.GATE_DRIVER in problem


CLI = """
import argparse, sys
from capi_gpu.cli import gate_plugin
parser = argparse.ArgumentParser()
gate_plugin.register(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def cli_argv(paths: kubeletplugin.PluginPaths, action: str) -> list[str]:
    argv = [sys.executable, "-c", CLI, "gate-plugin", action, "--plugins-dir", str(paths.plugins_dir)]
    return [*argv, "--registry-dir", str(paths.registry_dir)]


def run_cli(paths: kubeletplugin.PluginPaths, action: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cli_argv(paths, action), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def probe_cli(paths: kubeletplugin.PluginPaths) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_argv(paths, "probe"), capture_output=True, text=True, timeout=30, check=False)


def test_cli_serves_until_sigterm_and_probe_agrees(paths: kubeletplugin.PluginPaths) -> None:
    proc = run_cli(paths, "serve")
    try:
        kubelet_registers(paths)
        probe = probe_cli(paths)
        assert probe.returncode == 0, probe.stderr
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "registered with the kubelet" in out
    finally:
        proc.kill()
        proc.communicate()
    probe = probe_cli(paths)
    assert probe.returncode == 1
    assert "gate plugin unhealthy" in probe.stderr


def test_cli_exits_nonzero_when_the_kubelet_rejects_it(paths: kubeletplugin.PluginPaths) -> None:
    proc = run_cli(paths, "serve")
    try:
        kubelet_registers(paths, accept=False)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 1, out
        assert "rejected the registration" in out
    finally:
        proc.kill()
        proc.communicate()
