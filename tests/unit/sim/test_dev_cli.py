"""`capi-gpu dev up|down` papercuts (issue 28), without starting a world.

``dev down`` with nothing left (every list of the registry's leftovers empty) exits 0 and says nothing of
leftovers; with something left it exits non-zero and names it. The kubeconfig ``dev up`` hands the user has
its context's namespace set to the world's (``gpu``), so ``capi-gpu hosts list`` without ``-n`` finds the
world's hosts instead of answering "no hosts in default".
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu.cli import EXIT_OK, kubeargs
from capi_gpu_sim import devflow, pki, procs
from capi_gpu_sim.cli import dev
from capi_gpu_sim.hosts import registry
from capi_gpu_sim.world import World

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


def fake_start(world: World) -> World:
    """What of ``World.start`` the kubeconfig needs: the control plane's CA, port, token, admin kubeconfig."""
    world.cp.workdir.mkdir(parents=True, exist_ok=True)
    world.cp.ca = pki.CA(world.cp.workdir / "pki")
    world.cp.port, world.cp.token = 6443, "t0k3n"
    world.cp._write_kubeconfig()
    return world


def test_up_hands_the_user_a_kubeconfig_whose_context_namespace_is_the_worlds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(World, "start", fake_start)
    monkeypatch.setattr(World, "stop", lambda self: None)
    monkeypatch.setattr(signal, "signal", lambda *_a: None)

    def stop_here(*_a: Any, **_k: Any) -> None:
        raise TimeoutError("stop the test here")

    monkeypatch.setattr(devflow, "run", stop_here)
    state = tmp_path / "state"
    args = parse("up", "--state-dir", str(state), "--exit")
    args.func(args)

    out = capsys.readouterr().out
    printed = Path(out.split("kubeconfig: ", 1)[1].split()[0])
    config = yaml.safe_load(printed.read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    assert current["context"]["namespace"] == "gpu"
    assert printed.stat().st_mode & 0o077 == 0  # it carries the admin token
    # What `capi-gpu hosts list` without -n resolves with that kubeconfig:
    cli = argparse.Namespace(kubeconfig=str(printed), context=None, namespace=None, all_namespaces=False)
    assert kubeargs.namespace(cli) == "gpu"
    # The control plane's own admin kubeconfig (its components, tests, the workload Secret) is unchanged.
    admin = yaml.safe_load((state / "controlplane" / "admin.kubeconfig").read_text())
    assert "namespace" not in admin["contexts"][0]["context"]
