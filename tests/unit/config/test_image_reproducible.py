"""A reproducible image: the Dockerfile's base pinned by digest, every dependency installed from
requirements.lock with hashes, the lock in step with pyproject.toml (each dependency pinned inside its
range, nothing pinned without a hash), and the wheel leaving out capi_gpu_sim, with the CLI still working
without it (the sim and dev commands drop out), and a checkout's CLI finding them from any directory."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import config_helpers as h
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from capi_gpu import cli

LOCK = h.REPO / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)")


def _lock() -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, hashes); continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())
    out: dict[str, tuple[Version, list[str]]] = {}
    for line in text.splitlines():
        m = PIN.match(line.strip())
        if m:
            name = canonicalize_name(re.sub(r"\[.*\]", "", m.group(1)))
            out[name] = (Version(m.group(2)), re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return out


def test_base_image_is_pinned_by_digest() -> None:
    froms = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", (h.REPO / "Dockerfile").read_text(), re.M)
    assert len(froms) == 1
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", froms[0]), froms[0]


def test_every_pin_in_the_lock_carries_hashes() -> None:
    lock = _lock()
    assert len(lock) > 20  # the whole closure, not only the direct dependencies
    assert all(hashes for _, hashes in lock.values()), [n for n, (_, hs) in lock.items() if not hs]


def test_the_lock_matches_pyproject() -> None:
    project = tomllib.loads((h.REPO / "pyproject.toml").read_text())["project"]
    lock = _lock()
    stale = []
    for raw in project["dependencies"]:
        req = Requirement(raw)
        pinned = lock.get(canonicalize_name(req.name))
        if pinned is None or not req.specifier.contains(pinned[0], prereleases=True):
            stale.append(f"{raw}: lock has {pinned[0] if pinned else 'nothing'}")
    assert not stale, f"requirements.lock is stale (run `make lock`): {stale}"


def test_the_image_installs_only_from_the_lock() -> None:
    text = re.sub(r"\\\n\s*", " ", (h.REPO / "Dockerfile").read_text())
    assert re.search(r"pip wheel [^\n]*--require-hashes [^\n]*-r requirements\.lock", text)
    assert re.search(r"pip install --no-index [^\n]*-r /wheels/requirements\.lock", text)
    assert re.search(r"pip install --no-index [^\n]*--no-deps capi-gpu", text)  # nothing resolved at install


def test_the_wheel_leaves_out_the_simulators(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(h.REPO / name, src / name)
    shutil.copytree(h.REPO / "capi_gpu", src / "capi_gpu", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=src,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("capi_gpu-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("capi_gpu_sim/")] == []
    assert "capi_gpu/kube.py" in names and "capi_gpu/cli/run.py" in names


def test_the_cli_works_without_the_simulators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "capi_gpu_sim", None)  # as installed from the wheel
    commands = set(cli.build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert {"run", "hosts", "crds"} <= commands
    assert not commands & cli.NEEDS_SIM


def test_a_checkout_s_capi_gpu_finds_the_simulators_from_anywhere(tmp_path: Path) -> None:
    """``make dev`` runs the console script, whose sys.path has the venv's bin, not the checkout: the CLI
    still offers ``sim`` and ``dev`` from the capi_gpu_sim beside the package."""
    probe = (
        "from capi_gpu import cli; print(' '.join(sorted(cli.build_parser()._subparsers._group_actions[0].choices)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin"},
    ).stdout.split()
    assert set(out) >= cli.NEEDS_SIM, out
