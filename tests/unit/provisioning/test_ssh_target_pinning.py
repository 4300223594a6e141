"""SSHTarget and its known_hosts line: one pinned key per target, bracketed for non-22 ports, and
refusal of anything that is not a single well-formed key (wrong type, bad base64, type/blob mismatch,
an address that would smuggle options), and a repr without the private key."""

from __future__ import annotations

import base64

import pytest

from capi_gpu.provisioning import ansible

BLOB = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + b"k" * 32).decode()
KEY = f"ssh-ed25519 {BLOB}"


def test_the_known_hosts_line_pins_exactly_one_key() -> None:
    assert ansible.known_hosts_line("10.231.7.2", 22, KEY) == f"10.231.7.2 ssh-ed25519 {BLOB}\n"
    assert ansible.known_hosts_line("10.231.7.2", 2222, KEY + " root@host") == f"[10.231.7.2]:2222 ssh-ed25519 {BLOB}\n"


@pytest.mark.parametrize(
    ("address", "key", "match"),
    [
        ("10.0.0.2", "ssh-dss " + BLOB, "supported type"),
        ("10.0.0.2", "ssh-ed25519", "supported type"),
        ("10.0.0.2", "ssh-ed25519 not*base64", "not base64"),
        ("10.0.0.2", "ecdsa-sha2-nistp256 " + BLOB, "does not match its type"),
        ("10.0.0.2 ssh-rsa AAAA\n*", KEY, "bad address"),
    ],
)
def test_malformed_pins_are_refused(address: str, key: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ansible.known_hosts_line(address, 22, key)


def test_a_target_validates_its_pin_and_hides_its_private_key() -> None:
    target = ansible.SSHTarget(name="gex131-a", address="10.0.0.2", host_key=KEY, private_key="SECRET-KEY")
    assert "SECRET-KEY" not in repr(target)
    with pytest.raises(ValueError, match="supported type"):
        ansible.SSHTarget(name="gex131-a", address="10.0.0.2", host_key="nope", private_key="k")
    with pytest.raises(ValueError, match="DNS-label"):
        ansible.SSHTarget(name="../etc", address="10.0.0.2", host_key=KEY, private_key="k")
