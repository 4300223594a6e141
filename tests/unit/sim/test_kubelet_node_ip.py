"""The simulated kubelet's node IP comes from ``--node-ip`` in /etc/default/kubelet, as the real kubelet's does
through its unit's EnvironmentFile (the kubelet role writes the private network's address there)."""

from __future__ import annotations

import pytest

from capi_gpu_sim.kubelet import node_ip


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (None, None),
        (b"", None),
        (b'KUBELET_EXTRA_ARGS="--node-labels=a=b"\n', None),
        (b'KUBELET_EXTRA_ARGS="--node-labels=a=b --node-ip=10.0.1.2"\n', "10.0.1.2"),
        (b"KUBELET_EXTRA_ARGS=--node-ip=10.0.1.3\n", "10.0.1.3"),
        (b'KUBELET_EXTRA_ARGS="--node-ip 10.0.1.4"\n', "10.0.1.4"),
        (b'# KUBELET_EXTRA_ARGS="--node-ip=10.0.1.5"\nOTHER="--node-ip=10.0.1.6"\n', None),
        (b'KUBELET_EXTRA_ARGS="--node-ip=10.0.1.7 --node-ip=10.0.1.8"\n', "10.0.1.8"),
        (b'KUBELET_EXTRA_ARGS="--node-ip=not-an-ip"\n', None),
        (b'KUBELET_EXTRA_ARGS="--node-ip=$(id)"\n', None),
    ],
)
def test_node_ip_from_the_default_file(text: bytes | None, want: str | None) -> None:
    assert node_ip(text) == want
