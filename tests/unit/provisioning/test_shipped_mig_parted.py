"""The nvidia-mig-parted the operator ships: found by flag, environment or the image's path; its checksum is the
file's own and must match what its build recorded beside it; a missing binary leaves the operator running but
the run variables without it; a .deb route in --playbook-vars needs its checksum and ships no binary; the role's
default checksum is the reference build's (hack/versions.env)."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from capi_gpu.cli import run as run_cli
from capi_gpu.provisioning import ansible, shipped_mig_parted
from capi_gpu.provisioning import playbook_vars as pv
from tests.unit.provisioning.test_playbook_vars import sample_layout  # the one valid layout the unit tests share

REPO = Path(__file__).resolve().parents[3]
ROLE_DEFAULTS = ansible.default_playbook_dir() / "roles" / "mig_layout" / "defaults" / "main.yml"


def versions_env() -> dict[str, str]:
    lines = (REPO / "hack" / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "nvidia-mig-parted"
    path.write_bytes(b"\x7fELF pretend")
    return path


def test_the_path_comes_from_the_environment_else_the_image() -> None:
    assert shipped_mig_parted.default_path({}) == Path("/opt/capi-gpu/libexec/nvidia-mig-parted")
    assert shipped_mig_parted.default_path({"CAPI_GPU_MIG_PARTED": "/x/y"}) == Path("/x/y")
    assert shipped_mig_parted.default_path({"CAPI_GPU_MIG_PARTED": ""}) == shipped_mig_parted.DEFAULT_PATH


def test_the_checksum_sent_is_the_files_own(binary: Path) -> None:
    sent = shipped_mig_parted.overrides(binary)
    assert sent == {"mig_parted": str(binary), "mig_parted_sha256": hashlib.sha256(binary.read_bytes()).hexdigest()}
    # What reaches the role, through the one model that spells its variable names.
    extra = pv.PlaybookVars(kubernetes_version="v1.36.3", mig=sample_layout(), **sent).extra_vars()
    assert extra["mig_layout_parted_src"] == str(binary)
    assert extra["mig_layout_parted_sha256"] == sent["mig_parted_sha256"]


@pytest.mark.parametrize("recorded", ["0" * 64, ""])
def test_a_binary_that_is_not_what_its_build_recorded_is_refused(binary: Path, recorded: str) -> None:
    binary.with_name("nvidia-mig-parted.sha256").write_text(recorded + "\n")
    with pytest.raises(shipped_mig_parted.ShippedBinaryError, match="build recorded"):
        shipped_mig_parted.overrides(binary)


def test_a_binary_with_its_recorded_checksum_is_shipped(binary: Path) -> None:
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    binary.with_name("nvidia-mig-parted.sha256").write_text(digest + "\n")
    assert shipped_mig_parted.overrides(binary)["mig_parted_sha256"] == digest


def test_a_deb_route_ships_no_binary_and_what_the_operator_says_wins(tmp_path: Path, binary: Path) -> None:
    deb = {"mig_manager_deb": "https://example.invalid/m.deb", "mig_manager_deb_sha256": "2" * 64}
    assert shipped_mig_parted.with_shipped_binary(deb, tmp_path / "missing") == deb
    mirror = {"nvidia_repo": {"uri": "file:/srv/x"}}
    merged = shipped_mig_parted.with_shipped_binary(mirror, binary)
    assert merged["mig_parted"] == str(binary) and merged["nvidia_repo"] == mirror["nvidia_repo"]


def test_the_operator_starts_without_the_binary_but_sends_none(tmp_path: Path) -> None:
    vars_file = tmp_path / "pv.yaml"
    vars_file.write_text(yaml.safe_dump({"driver_route": "auto"}))
    args = argparse.Namespace(mig_parted=tmp_path / "missing", playbook_vars=vars_file)
    assert run_cli.operator_playbook_overrides(args) == {"driver_route": "auto"}
    with pytest.raises(shipped_mig_parted.ShippedBinaryMissing, match="--mig-parted"):
        run_cli.playbook_overrides(args)  # what `nodes relayout`, about to run the playbook, refuses with


def test_a_deb_without_its_checksum_is_refused_before_any_host() -> None:
    with pytest.raises(ValidationError, match="mig_manager_deb_sha256"):
        pv.PlaybookVars(kubernetes_version="v1.36.3", mig=sample_layout(), mig_manager_deb="https://x.invalid/m.deb")
    with pytest.raises(ValidationError, match="go together"):
        pv.PlaybookVars(kubernetes_version="v1.36.3", mig=sample_layout(), mig_parted="/opt/nvidia-mig-parted")


def test_the_roles_default_checksum_is_the_reference_builds() -> None:
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    pinned = versions_env()
    assert defaults["mig_layout_parted_sha256"] == pinned["MIG_PARTED_SHA256"]
    assert defaults["mig_layout_parted_version"] == pinned["MIG_PARTED_VERSION"]
    # The default route downloads nothing; the .deb route is opt-in.
    assert defaults["mig_layout_manager_deb"] == "" and defaults["mig_layout_manager_deb_sha256"] == ""


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"kubernetes_version": "v1.30.0"}, "sets kubernetes_version: each node takes these"),
        ({"driver_branch": "570", "mig": {}}, "sets driver_branch, mig: each node takes these"),
        ({"private_network": None}, "sets private_network"),
        ({"driver_route": "rpm"}, "refused: driver_route: Input should be"),
        ({"nvidia_repo": {"url": "file:/srv/x"}}, "refused: nvidia_repo.uri: Field required"),
        ({"no_such_var": 1}, "refused: no_such_var: Extra inputs are not permitted"),
    ],
)
def test_playbook_vars_a_node_run_would_not_take_stop_the_operator_at_start(
    tmp_path: Path, doc: dict[str, object], says: str
) -> None:
    # Before: a per-node key was a TypeError inside every host's Configure, a bad value a permanent failure there.
    vars_file = tmp_path / "pv.yaml"
    vars_file.write_text(yaml.safe_dump(doc))
    args = argparse.Namespace(mig_parted=tmp_path / "missing", playbook_vars=vars_file)
    with pytest.raises(ValueError, match=f"^--playbook-vars {says}"):
        run_cli.operator_playbook_overrides(args)
    with pytest.raises(ValueError, match=f"^--playbook-vars {says}"):
        pv.check_overrides(doc)


def test_the_run_command_exits_with_usage_for_bad_playbook_vars(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    vars_file = tmp_path / "pv.yaml"
    vars_file.write_text(yaml.safe_dump({"kubernetes_version": "v1.30.0"}))
    from capi_gpu import logs
    from capi_gpu.cli import main

    # `run` configures the process's logging (root handlers on this test's captured stderr, httpx quieted):
    # left in place, later tests on this worker log into a closed stream and miss httpx's records.
    monkeypatch.setattr(logs, "configure", lambda *args, **kwargs: None)

    assert main(["run", "--playbook-vars", str(vars_file), "--mig-parted", str(tmp_path / "missing")]) == 2
    assert "--playbook-vars sets kubernetes_version" in capsys.readouterr().err
