"""Host-key pins: Robot's MD5 fingerprints (any case, with or without the MD5: prefix, by key type) and
exact public keys match only the key they name; an empty pin is refused; pinned types restrict the key
exchange; credentials never show in repr."""

from __future__ import annotations

import paramiko
import pytest

from capi_gpu.provisioning import ssh, sshtransport
from capi_gpu_sim.hosts import keys


def _pkey(pair: keys.KeyPair) -> paramiko.PKey:
    return sshtransport.load_private_key(pair.private_openssh)


def test_robot_fingerprints_match_their_key_only() -> None:
    ed, rsa = keys.generate(), keys.generate("rsa")
    pin = ssh.HostKeyPin.from_robot(
        [
            {"key": {"fingerprint": ed.md5_fingerprint.upper(), "type": "ED25519", "size": 256}},
            {"key": {"fingerprint": rsa.md5_fingerprint, "type": "RSA", "size": 3072}},
        ]
    )
    assert sshtransport.pin_matches(pin, _pkey(ed))
    assert sshtransport.pin_matches(pin, _pkey(rsa))
    assert not sshtransport.pin_matches(pin, _pkey(keys.generate()))


def test_a_fingerprint_pinned_for_one_type_does_not_accept_another_type() -> None:
    ed = keys.generate()
    pin = ssh.HostKeyPin(fingerprints=(("RSA", ed.md5_fingerprint),))
    assert not sshtransport.pin_matches(pin, _pkey(ed))
    assert sshtransport._pin_algorithms(pin) == ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]


def test_exact_public_key_pin_ignores_the_comment() -> None:
    ed = keys.generate(comment="root@bm-1")
    pin = ssh.HostKeyPin.from_public_key(ed.public_line)
    assert pin.public_keys == (" ".join(ed.public_line.split()[:2]),)
    assert sshtransport.pin_matches(pin, _pkey(ed))
    assert not sshtransport.pin_matches(pin, _pkey(keys.generate()))


def test_an_empty_pin_is_refused() -> None:
    with pytest.raises(ValueError, match="accept nothing"):
        ssh.HostKeyPin()
    with pytest.raises(ValueError):
        ssh.HostKeyPin.from_robot([])  # Robot may answer "host_key": [] (sample boot_rescue_set_with_key)


def test_credentials_and_keys_stay_out_of_repr() -> None:
    pair = keys.generate()
    cred = ssh.Credentials(private_key=pair.private_openssh, password="hunter2")
    assert "hunter2" not in repr(cred) and pair.private_openssh[40:80] not in repr(cred)
    assert pair.private_openssh not in repr(pair)


def test_private_keys_load_from_text_in_openssh_and_pem_form() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    assert sshtransport.load_private_key(pem).get_name() == "ssh-rsa"
    assert isinstance(sshtransport.load_private_key(keys.generate().private_openssh), paramiko.Ed25519Key)
    with pytest.raises(ValueError, match="unreadable"):
        sshtransport.load_private_key("not a key")
