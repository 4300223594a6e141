"""Rescue SSH over a real sshd: only Robot's reported host key is accepted, no credential goes to another,
the previous OS's unknown key fails its pin, auth failures and refused ports are classified, secrets stay
out of logs."""

from __future__ import annotations

import logging

import pytest
from sim_helpers import Rescue

from capi_gpu.provisioning import ssh
from capi_gpu_sim.fleet import Fleet
from capi_gpu_sim.hosts import keys
from capi_gpu_sim.hosts.host import Running, State


def test_rescue_accepts_the_host_key_robot_reported(rescue: Rescue, client_key: keys.KeyPair) -> None:
    assert rescue.activation["host_key"], "Robot reported no host key"
    with rescue.shell(client_key) as shell:
        assert shell.hostname() == "rescue"
        assert len(shell.boot_id()) == 36
    assert rescue.host.running is Running.RESCUE


def test_a_swapped_host_key_is_a_mismatch_before_any_credential(rescue: Rescue, client_key: keys.KeyPair) -> None:
    other = keys.generate()
    pin = ssh.HostKeyPin(fingerprints=(("ED25519", other.md5_fingerprint),))
    shell = ssh.ParamikoShell(
        ssh.Endpoint(rescue.host.guest_ip, pin), ssh.Credentials(private_key=client_key.private_openssh)
    )
    console = rescue.host.state_dir / "boots" / str(rescue.host.boot_count()) / "console.log"
    before = console.read_text()
    with pytest.raises(ssh.HostKeyMismatch) as err:
        shell.hostname()
    assert other.md5_fingerprint in str(err.value)
    new = console.read_text()[len(before) :]
    assert "Accepted" not in new and "Failed" not in new and "publickey" not in new


def test_exact_public_key_pin_and_wrong_type_pin(rescue: Rescue, client_key: keys.KeyPair) -> None:
    private = rescue.host.guest_path("/etc/ssh/ssh_host_ed25519_key").read_text()
    public = keys.KeyPair(private, _public_of(private))
    exact = ssh.HostKeyPin.from_public_key(public.public_line)
    with ssh.ParamikoShell(
        ssh.Endpoint(rescue.host.guest_ip, exact), ssh.Credentials(private_key=client_key.private_openssh)
    ) as shell:
        assert shell.hostname() == "rescue"
    rsa_only = ssh.HostKeyPin(fingerprints=(("RSA", keys.generate("rsa").md5_fingerprint),))
    with pytest.raises(ssh.HostKeyMismatch):
        ssh.ParamikoShell(
            ssh.Endpoint(rescue.host.guest_ip, rsa_only), ssh.Credentials(private_key=client_key.private_openssh)
        ).hostname()


def test_previous_os_has_an_unknown_key_so_any_pin_fails(fleet: Fleet, client_key: keys.KeyPair) -> None:
    host = fleet.host()
    assert host.running is Running.PREVIOUS
    pin = ssh.HostKeyPin(fingerprints=(("ED25519", keys.generate().md5_fingerprint),))
    with pytest.raises(ssh.HostKeyMismatch):
        ssh.ParamikoShell(
            ssh.Endpoint(host.guest_ip, pin), ssh.Credentials(private_key=client_key.private_openssh)
        ).hostname()


def test_auth_failure_password_login_and_refused_port(rescue: Rescue, client_key: keys.KeyPair) -> None:
    stranger = keys.generate()
    with pytest.raises(ssh.AuthenticationFailed):
        rescue.shell(stranger).hostname()
    with ssh.ParamikoShell(
        ssh.Endpoint(rescue.host.guest_ip, rescue.pin), ssh.Credentials(password=rescue.password)
    ) as sh:
        assert sh.hostname() == "rescue"
    with pytest.raises(ssh.ConnectionRefused):
        rescue.shell(client_key, port=2222).hostname()


def test_secrets_never_reach_logs(rescue: Rescue, client_key: keys.KeyPair, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret_script = "#!/bin/sh\necho bootstrap-token-abcdef.0123456789abcdef\n"
    with rescue.shell(client_key) as shell:
        shell.write_file("/root/secret.sh", secret_script, 0o700)
        assert shell.hostname() == "rescue"
    with ssh.ParamikoShell(
        ssh.Endpoint(rescue.host.guest_ip, rescue.pin), ssh.Credentials(password=rescue.password)
    ) as sh:
        sh.boot_id()
    with pytest.raises(ssh.AuthenticationFailed) as err:
        rescue.shell(keys.generate()).hostname()
    text = caplog.text + str(err.value) + repr(ssh.Credentials(private_key=client_key.private_openssh, password="x"))
    key_body = client_key.private_openssh.splitlines()[1]
    assert key_body not in text
    assert rescue.password not in text
    assert "bootstrap-token" not in text
    assert rescue.host.guest_path("/root/secret.sh").stat().st_mode & 0o777 == 0o700


def test_a_host_that_never_boots_back(fleet: Fleet, robot_api: object, client_key: keys.KeyPair) -> None:
    from capi_gpu_sim.robot import RobotSim

    host = fleet.host()
    robot = fleet.robot
    assert isinstance(robot, RobotSim)
    robot.set_faults(never_boot=[host.server_number])
    before = host.boot_count()
    robot_api.reset(host.server_number, "hw")  # type: ignore[attr-defined]
    assert host.wait_state(State.DOWN, 10)
    assert not host.wait_up(3, after_boot=before)
    with pytest.raises((ssh.ConnectionRefused, ssh.ConnectTimeout)):
        ssh.ParamikoShell(
            ssh.Endpoint(host.guest_ip, ssh.HostKeyPin(fingerprints=(("ED25519", "00"),)), connect_timeout_s=2),
            ssh.Credentials(private_key=client_key.private_openssh),
        ).hostname()


def _public_of(private_openssh: str) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private_openssh.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
