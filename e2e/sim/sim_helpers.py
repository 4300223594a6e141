"""Helpers for the simulated-fleet tests: the few Robot calls they make, and a booted rescue system."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from capi_gpu.provisioning import ssh
from capi_gpu_sim.hosts import keys
from capi_gpu_sim.hosts.host import Host
from capi_gpu_sim.robot import RobotSim

BOOT_TIMEOUT_S = 60.0


class RobotApi:
    """The handful of documented Robot calls these tests make, over HTTP (Basic auth, form bodies)."""

    def __init__(self, robot: RobotSim) -> None:
        self._http = httpx.Client(base_url=robot.url, auth=(robot.username, robot.password), timeout=10)

    def add_key(self, name: str, public_line: str) -> str:
        r = self._http.post("/key", data={"name": name, "data": public_line})
        assert r.status_code in (201, 409), r.text
        return str(keys.md5_fingerprint(public_line))

    def activate_rescue(self, n: int, fingerprints: list[str]) -> dict[str, Any]:
        r = self._http.post(f"/boot/{n}/rescue", data={"os": "linux", "authorized_key[]": fingerprints})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()["rescue"]
        return body

    def reset(self, n: int, kind: str = "hw") -> None:
        r = self._http.post(f"/reset/{n}", data={"type": kind})
        assert r.status_code == 200, r.text

    def close(self) -> None:
        self._http.close()


@dataclass
class Rescue:
    host: Host
    pin: ssh.HostKeyPin
    password: str
    activation: dict[str, Any]

    def shell(self, key: keys.KeyPair, **endpoint: Any) -> ssh.ParamikoShell:
        return ssh.ParamikoShell(
            ssh.Endpoint(self.host.guest_ip, self.pin, **endpoint), ssh.Credentials(private_key=key.private_openssh)
        )


def boot_rescue(host: Host, api: RobotApi, key: keys.KeyPair) -> Rescue:
    fp = api.add_key("e2e", key.public_line)
    activation = api.activate_rescue(host.server_number, [fp])
    before = host.boot_count()
    api.reset(host.server_number, "hw")
    assert host.wait_up(BOOT_TIMEOUT_S, after_boot=before), "rescue never came up"
    return Rescue(host, ssh.HostKeyPin.from_robot(activation["host_key"]), str(activation["password"]), activation)
