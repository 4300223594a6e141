"""apt_source_usable_key: whether ``gpg --with-colons --show-keys`` output carries the pinned key, able to sign.

Why a filter and not a regex in the task: the decision (keep the key file, or fetch it again) reads two fields
of one record, and a Python function can be tested on gpg's real output. gpg marks a primary key's record
(``pub``) with its validity (field 2: ``e`` expired, ``r`` revoked) and the capabilities of the whole key in
upper case (field 12): ``S`` only while some key of it that may sign is neither expired nor revoked. So a key
whose expiry passed, or whose signing subkeys all expired, has no ``S``: apt's gpgv would answer EXPKEYSIG or
KEYEXPIRED for the repository it signs.

A key file must hold the pinned key and nothing else: apt's signed-by trusts every key in the file, so one that
also carries another primary key (an attacker's, appended at the key URL) would let that key sign the repository.
``apt_source_primary_keys`` lists the fingerprints of the file's primary keys for the play's checks.
"""

from __future__ import annotations

import itertools
from typing import Any


def _primaries(colons: str) -> list[tuple[list[str], str]]:
    """Each ``pub`` record with its fingerprint (the ``fpr`` record right after it), upper case."""
    lines = [line.split(":") for line in (colons or "").splitlines()]
    return [
        (record, following[9].upper())
        for record, following in itertools.pairwise(lines)
        if record[0] == "pub" and following[0] == "fpr" and len(record) >= 12 and len(following) >= 10
    ]


def primary_keys(colons: str) -> list[str]:
    return [fpr for _, fpr in _primaries(colons)]


def usable_key(colons: str, fingerprint: str) -> bool:
    """The file holds exactly one primary key, the pinned one, and it can sign."""
    primaries = _primaries(colons)
    if len(primaries) != 1 or primaries[0][1] != fingerprint.upper():
        return False
    record = primaries[0][0]
    return record[1] not in ("e", "r") and "S" in record[11]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"apt_source_usable_key": usable_key, "apt_source_primary_keys": primary_keys}
