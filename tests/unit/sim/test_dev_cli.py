"""`capi-gpu dev up|down` papercuts (issue 28), without starting a world.

``dev down`` with nothing left (every list of the registry's leftovers empty) exits 0 and says nothing of
leftovers; with something left it exits non-zero and names it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from capi_gpu.cli import EXIT_OK
from capi_gpu_sim import procs
from capi_gpu_sim.cli import dev
from capi_gpu_sim.hosts import registry

NOTHING_LEFT: dict[str, list[str]] = {"netns": [], "links": [], "cgroups": [], "processes": [], "mounts": []}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="capi-gpu")
    dev.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["dev", *argv])


def down(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, left: dict[str, list[str]]) -> int:
    monkeypatch.setattr(procs, "reap_strays", lambda *_a, **_k: None)
    monkeypatch.setattr(registry, "cleanup_stale", registry.CleanupReport)
    monkeypatch.setattr(registry, "leftovers", lambda *_a, **_k: left)
    args = parse("down", "--state-dir", str(tmp_path))
    rc: int = args.func(args)
    return rc


def test_down_with_nothing_left_exits_0_without_naming_leftovers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert down(monkeypatch, tmp_path, NOTHING_LEFT) == EXIT_OK
    out = capsys.readouterr().out
    assert "dev environment stopped" in out
    assert "leftovers" not in out


def test_down_with_something_left_fails_and_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    left = {**NOTHING_LEFT, "netns": ["capi-gpu-sim-f1-h0"]}
    assert down(monkeypatch, tmp_path, left) != EXIT_OK
    out = capsys.readouterr().out
    assert "leftovers" in out and "capi-gpu-sim-f1-h0" in out
    assert "links" not in out  # only what is truly left is named
