"""`capi-gpu hosts` against the real kube-apiserver: register (defaults, labels, secrets, duplicate server
and name refused, bad input), list (table, JSON, -A, the context's namespace), maintenance on/off,
inspect (the reinspect annotation), retire (confirmation, --force), consumed hosts refused, a host
claimed between check and patch refused (resourceVersion guard), the exit codes 0/1/2/3, and watch
without a terminal (one line per change, Events, --cluster)."""

from __future__ import annotations

import datetime
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu import cli, domain
from capi_gpu.api import base
from capi_gpu.cli import hosts
from capi_gpu.kube import EVENTS, Kube, ours
from capi_gpu_sim.controlplane import ControlPlane, free_port

pytestmark = pytest.mark.integration

HOSTS = ours("hetznergpuhosts")


class Cli:
    """Runs ``capi-gpu hosts ...`` in-process against one namespace; returns (rc, stdout, stderr)."""

    def __init__(self, kubeconfig: Path, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.kubeconfig, self.namespace, self.capsys = kubeconfig, namespace, capsys

    def __call__(self, *argv: str, namespaced: bool = True) -> tuple[int, str, str]:
        scope = ["-n", self.namespace] if namespaced else []
        self.capsys.readouterr()
        rc = cli.main(["hosts", *argv, "--kubeconfig", str(self.kubeconfig), *scope])
        out, err = self.capsys.readouterr()
        return rc, out, err

    def json(self, *argv: str, namespaced: bool = True) -> Any:
        rc, out, err = self(*argv, "-o", "json", namespaced=namespaced)
        assert rc == 0, err
        return json.loads(out)


@pytest.fixture
def run(control_plane: ControlPlane, namespace: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(control_plane.kubeconfig, namespace, capsys)


@pytest.fixture(autouse=True)
def no_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # scripts: no one answers a prompt


def consume(kube: Kube, namespace: str, name: str) -> None:
    """What the machine controller does when it claims a host."""
    ref = base.ObjectReference(
        api_version=domain.API_VERSION, kind="HetznerGPUMachine", name="worker-0", namespace=namespace
    )
    kube.patch(HOSTS, name, {"spec": {"consumerRef": ref.wire()}}, namespace)


def test_register_then_list_as_table_and_json(run: Cli, kube: Kube, namespace: str) -> None:
    rc, out, err = run("register", "--server", "1001", "--name", "gex-a", "--label", "pool=gpu",
                       "--robot-secret", "robot-a", "--ssh-secret", "ssh-a")  # fmt: skip
    assert rc == 0, err
    assert "Secret" in err and "robot-a" in err and "ssh-a" in err  # warned: the Secrets do not exist yet
    assert out.split()[:12] == ["NAME", "SERVER", "STATE", "STEP", "GPU", "LAYOUT", "CONSUMER", "READY",
                                "ERROR", "FLAGS", "gex-a", "1001"]  # fmt: skip
    stored = kube.get(HOSTS, "gex-a", namespace)
    assert stored["metadata"]["labels"] == {"pool": "gpu"}
    assert stored["spec"]["serverNumber"] == 1001
    assert stored["spec"]["robot"] == {"credentialsSecret": "robot-a", "sshKeySecret": "ssh-a"}
    assert (stored["spec"]["maintenanceMode"], stored["spec"]["retired"]) == (False, False)

    created = run.json("register", "--server", "1002")
    assert (created["name"], created["server"], created["namespace"]) == ("host-1002", 1002, namespace)
    assert kube.get(HOSTS, "host-1002", namespace)["spec"]["robot"]["credentialsSecret"] == "robot-credentials"

    rc, out, _ = run("list")
    lines = out.splitlines()
    assert lines[0].split()[0] == "NAME" and "NAMESPACE" not in lines[0]
    assert [line.split()[:2] for line in lines[1:]] == [["gex-a", "1001"], ["host-1002", "1002"]]
    assert "<none>" in lines[1]  # no controller ran: no state yet

    rows = run.json("list")
    assert [r["name"] for r in rows] == ["gex-a", "host-1002"]
    assert set(rows[0]) == {"namespace", *hosts.COLUMNS}
    assert rows[0]["state"] is None and rows[0]["flags"] == []


def test_list_all_namespaces_and_the_contexts_namespace(
    run: Cli, control_plane: ControlPlane, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("register", "--server", "2001")[0] == 0
    rows = run.json("list", "-A", namespaced=False)
    assert {"namespace": namespace, "name": "host-2001"}.items() <= next(
        r for r in rows if r["namespace"] == namespace
    ).items()
    rc, out, _ = run("list", "-A", namespaced=False)
    assert rc == 0 and out.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]

    config = control_plane.kubeconfig_dict()
    config["contexts"][0]["context"]["namespace"] = namespace
    scoped = tmp_path / "scoped.kubeconfig"
    scoped.write_text(yaml.safe_dump(config))
    rows = Cli(scoped, namespace, capsys).json("list", namespaced=False)
    assert [r["name"] for r in rows] == ["host-2001"]


def test_duplicate_server_and_name_and_bad_input_are_refused(run: Cli, kube: Kube, namespace: str) -> None:
    assert run("register", "--server", "3001", "--name", "first")[0] == 0
    rc, _, err = run("register", "--server", "3001", "--name", "second")
    assert rc == 1 and "already registered" in err and "first" in err
    rc, _, err = run("register", "--server", "3002", "--name", "first")
    assert rc == 1 and "already exists" in err
    for argv in (["--server", "0"], ["--server", "3003", "--label", "novalue"],
                 ["--server", "3004", "--robot-secret", ""],
                 ["--server", "3005", "--label", "bad key!=x"]):  # fmt: skip
        rc, _, err = run("register", *argv)
        assert rc == 2, (argv, err)
    assert [h["metadata"]["name"] for h in kube.list(HOSTS, namespace)] == ["first"]


def test_maintenance_on_and_off(run: Cli, kube: Kube, namespace: str) -> None:
    run("register", "--server", "4001", "--name", "m")
    row = run.json("maintenance", "m", "--on")
    assert row["flags"] == ["maintenance"]
    assert kube.get(HOSTS, "m", namespace)["spec"]["maintenanceMode"] is True
    rc, _, err = run("maintenance", "m", "--on")
    assert rc == 0 and "already on" in err
    assert run.json("maintenance", "m", "--off")["flags"] == []
    assert kube.get(HOSTS, "m", namespace)["spec"]["maintenanceMode"] is False
    with pytest.raises(SystemExit) as usage:
        run("maintenance", "m")  # neither --on nor --off
    assert usage.value.code == 2
    assert run("maintenance", "nope", "--on")[0] == 1


def test_inspect_sets_the_reinspect_annotation(run: Cli, kube: Kube, namespace: str) -> None:
    run("register", "--server", "5001", "--name", "i")
    before = base.utcnow()
    row = run.json("inspect", "i")
    assert "reinspect" in row["flags"]
    value = kube.get(HOSTS, "i", namespace)["metadata"]["annotations"][domain.ANNOTATION_REINSPECT]
    assert value.endswith("Z")
    assert base.utcnow() >= datetime.datetime.fromisoformat(value.replace("Z", "+00:00")) >= before
    rc, _, err = run("inspect", "nope")
    assert rc == 1 and "not found" in err


def test_retire_needs_confirmation_and_sets_retired_and_maintenance(run: Cli, kube: Kube, namespace: str) -> None:
    run("register", "--server", "6001", "--name", "r")
    rc, _, err = run("retire", "r")  # no tty, no --yes
    assert rc == 2 and "--yes" in err
    assert kube.get(HOSTS, "r", namespace)["spec"]["retired"] is False
    row = run.json("retire", "r", "--yes")
    assert row["flags"] == ["maintenance", "retired"]
    spec = kube.get(HOSTS, "r", namespace)["spec"]
    assert (spec["retired"], spec["maintenanceMode"]) == (True, True)
    rc, _, err = run("retire", "r", "--yes")
    assert rc == 0 and "already retired" in err
    rc, _, err = run("maintenance", "r", "--off")
    assert rc == 0 and "retired" in err  # allowed, with a warning: it stays out of the pool


def test_consumed_host_is_refused_for_inspect_and_retire_without_force(run: Cli, kube: Kube, namespace: str) -> None:
    run("register", "--server", "7001", "--name", "busy")
    consume(kube, namespace, "busy")
    assert run.json("list")[0]["consumer"] == "worker-0"
    rc, _, err = run("inspect", "busy")
    assert rc == 1 and "HetznerGPUMachine" in err and "worker-0" in err
    rc, _, err = run("retire", "busy", "--yes")
    assert rc == 1 and "--force" in err
    stored = kube.get(HOSTS, "busy", namespace)
    assert domain.ANNOTATION_REINSPECT not in (stored["metadata"].get("annotations") or {})
    assert stored["spec"]["retired"] is False
    rc, _, err = run("retire", "busy", "--yes", "--force")
    assert rc == 0 and "remediated" in err
    assert kube.get(HOSTS, "busy", namespace)["spec"]["retired"] is True


def test_host_claimed_between_check_and_patch_is_refused(
    run: Cli, kube: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("register", "--server", "8001", "--name", "race")
    real_now = base.utcnow
    claimed: list[bool] = []

    def claim_then_now() -> datetime.datetime:
        if not claimed:  # the machine controller wins the race once, after our check
            consume(kube, namespace, "race")
            claimed.append(True)
        return real_now()

    monkeypatch.setattr(hosts.base, "utcnow", claim_then_now)
    rc, _, err = run("inspect", "race")
    assert claimed and rc == 1 and "in use" in err
    assert domain.ANNOTATION_REINSPECT not in (kube.get(HOSTS, "race", namespace)["metadata"].get("annotations") or {})


def test_unreachable_apiserver_is_exit_3_and_a_missing_kubeconfig_exit_2(
    control_plane: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = control_plane.kubeconfig_dict()
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"  # nothing listens
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    rc, _, err = Cli(dead, "default", capsys)("list")
    assert rc == 3 and "apiserver" in err
    rc, _, err = Cli(tmp_path / "missing", "default", capsys)("list")
    assert rc == 2 and "kubeconfig" in err


def test_watch_without_a_terminal_prints_one_line_per_change(run: Cli, kube: Kube, namespace: str) -> None:
    """Issue 21: the live view's plain mode against a real apiserver: several looks, one line per host change."""
    assert run("register", "--server", "1301", "--name", "gex-w")[0] == 0
    started = (base.utcnow() - datetime.timedelta(seconds=90)).isoformat().replace("+00:00", "Z")
    status = {"state": "Provisioning", "step": "Install", "stepStartedAt": started}
    kube.patch(HOSTS, "gex-w", {"status": status}, namespace, sub="status")
    kube.create(
        EVENTS,
        {
            "metadata": {"name": "gex-w.install", "namespace": namespace},
            "involvedObject": {"kind": "HetznerGPUHost", "name": "gex-w", "namespace": namespace},
            "reason": "InstallStarted",
            "message": "installimage running",
            "type": "Normal",
            "lastTimestamp": started,
        },
        namespace,
    )
    rc, out, err = run("watch", "--interval", "0.5", "--timeout", "2")
    assert rc == 0, err
    host_lines = [line for line in out.splitlines() if "gex-w" in line and "event" not in line]
    assert len(host_lines) == 1 and "Provisioning" in host_lines[0] and "Install" in host_lines[0], out
    assert "3/8" in host_lines[0] and "\x1b[" not in out
    assert out.count("InstallStarted: installimage running") == 1
    rc, out, err = run("watch", "--cluster", "no-such-cluster", "--interval", "0.5", "--timeout", "0.5")
    assert rc == 0 and "gex-w" not in out, out  # no Machine of that cluster consumes it
    assert run("watch", "--interval", "0")[0] == 2
