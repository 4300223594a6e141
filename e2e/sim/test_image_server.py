"""The fleet's image server as a host's rescue system sees it: the real curl of the rescue image, resolving
the server's name from rescue's /etc/hosts and trusting its CA from rescue's bundle, downloads a file
byte for byte over https; a missing name, a path out of the directory and plain http are all refused.
(test_node_image_install and the standby e2e then install from it through the product's Install step.)"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_helpers import BOOT_TIMEOUT_S, RobotApi, boot_rescue

from capi_gpu_sim import image_server
from capi_gpu_sim.fleet import Fleet, FleetConfig
from capi_gpu_sim.hosts import keys
from capi_gpu_sim.robot import RobotSim


@pytest.fixture
def images_fleet(robot: RobotSim, tmp_path: Path) -> Iterator[Fleet]:
    images = tmp_path / "images"
    images.mkdir()
    with Fleet(FleetConfig(hosts=1, first_server_number=2_400_001, images_dir=images), robot=robot) as f:
        assert f.host().wait_up(BOOT_TIMEOUT_S), "the previous OS never came up"
        yield f


def test_rescue_downloads_an_image_over_https_and_nothing_else(
    images_fleet: Fleet, robot_api: RobotApi, client_key: keys.KeyPair
) -> None:
    images = images_fleet.config.images_dir
    assert images is not None
    payload = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and a bit: more than one chunk
    (images / "node-amd64.tar.gz").write_bytes(payload)
    (images / "sub").mkdir()
    (images / "sub" / "inner.tar").write_bytes(b"x")
    host = boot_rescue(images_fleet.host(), robot_api, client_key).host

    url = images_fleet.image_url("node-amd64.tar.gz")
    assert url == f"https://{image_server.NAME}/node-amd64.tar.gz"
    got = host.exec(["sh", "-c", f"curl -q -fsS --proto =https -o /tmp/img '{url}' && sha256sum /tmp/img"])
    assert got.returncode == 0, got
    assert got.stdout.decode().split()[0] == hashlib.sha256(payload).hexdigest()

    def code(argv: list[str]) -> str:
        done = host.exec(["curl", "-q", "-sS", "-o", "/dev/null", "-w", "%{http_code}", *argv])
        return done.stdout.decode()

    base = f"https://{image_server.NAME}"
    assert code([f"{base}/missing.tar"]) == "404"
    assert code(["--path-as-is", f"{base}/../etc/passwd"]) == "404", "a path out of the directory"
    assert code([f"{base}/sub/inner.tar"]) == "404", "only files directly in the directory"
    assert code([f"{base}/sub"]) == "404", "no directory listing, no redirect"
    plain = host.exec(["curl", "-q", "-sS", "-o", "/dev/null", f"http://{image_server.NAME}/node-amd64.tar.gz"])
    assert plain.returncode != 0, "plain http is not served"
    # The name is the server's only identity: the same server by its address fails verification.
    by_ip = host.exec(["curl", "-q", "-sS", "-o", "/dev/null", f"https://{host.hn.host_ip}/node-amd64.tar.gz"])
    assert by_ip.returncode == 60, by_ip  # CURLE_PEER_FAILED_VERIFICATION
