"""roles/apt_source's key decision (filter apt_source_usable_key) on gpg's --with-colons records: a key in place
is kept only while it holds the pinned fingerprint alone, as a primary key that can still sign; an expired or
revoked key, one whose signing subkeys all expired, another key, a file that also holds another primary key
(signed-by would trust it), or no output at all means fetching it again. The container toolkit key's shape
(primary [SCE] valid, an old subkey expired) stays usable."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

from capi_gpu.provisioning import ansible

PLUGIN = ansible.default_playbook_dir() / "roles" / "apt_source" / "filter_plugins" / "apt_source_keys.py"
FPR = "FAA6D7E54D48E767FA6D3AFF78E281325237BBCF"


def plugin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apt_source_keys", PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def key(validity: str, caps: str, fpr: str = FPR, sub: str = "") -> str:
    """Records as gpg 2.2 prints them for --show-keys (captured from real keys, fields kept)."""
    return (
        f"pub:{validity}:2048:1:78E281325237BBCF:1577836800:1609372800::-:::{caps}::::::23::0:\n"
        f"fpr:::::::::{fpr}:\n"
        f"uid:{validity}::::1577836800::29475EF37FF5B001217C08631748002E21B1EB85::Test Repo <t@x.invalid>::::::::::0:\n"
        + sub
    )


@pytest.mark.parametrize(
    ("colons", "usable"),
    [
        (key("-", "scSC"), True),  # extended: valid, can sign
        (key("e", "sc"), False),  # expired: no upper-case S (gpg's own output for an expired key)
        (key("r", "sc"), False),  # revoked
        (key("-", "scESC", sub="sub:e:4096:1:6ED91CA3AC1160CD:1506556800:1623801600:::::s::::::23:\n"), True),
        (key("-", "scE", sub="sub:e:4096:1:6ED91CA3AC1160CD:1506556800:1623801600:::::s::::::23:\n"), False),
        (key("-", "scSC", fpr="C95B321B61E88C1809C4F759DDCAE044F796ECB0"), False),  # not the pinned key
        ("", False),  # missing file: gpg printed nothing
        # The pinned key with another primary key in the same file: signed-by would trust both.
        (key("-", "scSC") + key("-", "scSC", fpr="C95B321B61E88C1809C4F759DDCAE044F796ECB0"), False),
        (key("-", "scSC", fpr="C95B321B61E88C1809C4F759DDCAE044F796ECB0") + key("-", "scSC"), False),
    ],
)
def test_a_key_in_place_is_kept_only_while_it_is_the_pinned_one_and_can_sign(colons: str, usable: bool) -> None:
    assert plugin().usable_key(colons, FPR) is usable
    assert plugin().FilterModule().filters()["apt_source_usable_key"](colons, FPR.lower()) is usable


def test_primary_keys_are_the_pub_records_fingerprints_not_the_subkeys() -> None:
    other = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
    sub = "sub:-:4096:1:6ED91CA3AC1160CD:1506556800::::::s::::::23:\nfpr:::::::::1111111111111111111111111111111111111111:\n"
    colons = key("-", "scSC", sub=sub) + key("-", "scSC", fpr=other.lower())
    assert plugin().FilterModule().filters()["apt_source_primary_keys"](colons) == [FPR, other]
    assert plugin().primary_keys("") == []
