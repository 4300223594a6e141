"""The one way a value reaches Ansible: as data that is never rendered as a template.

Why: ansible-core 2.19 trusts extra vars as templates, and every lookup runs on the operator (even in a
play whose tasks run on a host over SSH). A spec string such as ``{{ lookup('pipe', '…') }}`` that lands
in an extra var would run as the operator, with its Robot credentials, SSH keys and kubeconfigs. So every
playbook run writes its extra vars here, and only here.

Why ``!unsafe`` on the whole document, not a JSON file the play reads with ``from_json``: it closes every
variable of every play and role at once, without a line changed in the playbooks, and it cannot be
forgotten by a new task. The tag is put on the root mapping only: ansible-core re-resolves a tagged
scalar's implicit type (``!unsafe '580'`` would load as the int 580), while the children of a tagged
collection keep their JSON types and inherit the taint (every string below it is untrusted, keys too).
The body is JSON, which is YAML flow, so no value can break out of its quoting (newlines, ``: ``, ``#``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

UNSAFE_TAG: Final = "!unsafe"
EXTRAVARS: Final = Path("env") / "extravars"
"""Where ansible-runner looks for extra vars in its private data dir (it passes ``-e @<path>``)."""


def extravars_text(values: Mapping[str, Any]) -> str:
    """The extra-vars file's text: ``values`` as JSON under one ``!unsafe`` tag.

    Refuses what JSON can't carry exactly (a set, bytes, NaN) instead of stringifying it on the way.
    """
    return f"{UNSAFE_TAG} {json.dumps(dict(values), indent=2, sort_keys=True, allow_nan=False)}\n"


def write_extravars(private_data_dir: Path, values: Mapping[str, Any]) -> Path:
    """Write ``values`` (0600) where ansible-runner reads extra vars; returns the path."""
    path = private_data_dir / EXTRAVARS
    path.parent.mkdir(mode=0o700, exist_ok=True)
    text = extravars_text(values)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path
