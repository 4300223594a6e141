"""Volume contents on the host, written as the kubelet's AtomicWriter does, so a refresh is one rename.

A volume directory holds ``..<stamp>/`` with the files, ``..data`` -> ``..<stamp>``, and one symlink per
file (``tls.crt`` -> ``..data/tls.crt``). A refresh writes a new stamp directory and renames a fresh
``..data`` over the old one: a reader never sees half of one version and half of the other, and a
program watching a file's identity (inode, mtime) through the symlink sees it change.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path


def write_atomic(directory: Path, files: Mapping[str, str | bytes], mode: int = 0o644) -> bool:
    """Make ``directory`` hold exactly ``files``; False (and nothing written) when it already does."""
    directory.mkdir(parents=True, exist_ok=True)
    if current(directory) == {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}:
        return False
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir()
    for name, content in files.items():
        path = stamp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        path.chmod(mode)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    tmp = directory / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(stamp.name)
    tmp.rename(directory / "..data")
    for name in files:
        top = name.split("/", 1)[0]
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for entry in directory.iterdir():  # keys that left the Secret
        if entry.is_symlink() and entry.name not in {n.split("/", 1)[0] for n in files} and entry.name != "..data":
            entry.unlink()
    if old is not None:
        shutil.rmtree(directory / old, ignore_errors=True)
    return True


def current(directory: Path) -> dict[str, bytes] | None:
    data = directory / "..data"
    if not data.is_symlink():
        return None
    out: dict[str, bytes] = {}
    for path in data.resolve().rglob("*"):
        if path.is_file():
            out[str(path.relative_to(data.resolve()))] = path.read_bytes()
    return out
