"""The Dockerfile, read structurally (no docker engine here, and no hadolint): builder, helm and runtime stages
on the pinned Python, a mig-parted stage that builds the pinned commit as hack/build-upstream.sh does and checks
the recorded sha256, its binary where ``capi-gpu run --mig-parted`` looks, wheels built then installed, openssh-client in the runtime, helm at the version
hack/versions.env pins and checked against a written-down sha256 per architecture before it is unpacked, on
the runtime's PATH, playbooks/ copied to where ``default_playbook_dir()`` resolves for the installed package,
a non-root USER, `capi-gpu run` as the entrypoint, and COPY sources that exist and that .dockerignore lets
through."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import config_helpers as h
import pytest

from capi_gpu.provisioning import ansible, shipped_mig_parted

DOCKERFILE = h.REPO / "Dockerfile"
PYTHON_IMAGE = "python:3.11-slim-bookworm"  # the tag; the digest is test_image_reproducible's


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, op: str) -> list[str]:
        return [a for o, a in self.instructions if o == op]


def parse() -> tuple[dict[str, str], list[Stage]]:
    """ARGs before the first FROM, and the stages; continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "ARG" and not stages:
            key, _, value = rest.partition("=")
            global_args[key] = value
        elif op == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], parts[0])
            stages.append(Stage(base, parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None))
        else:
            stages[-1].instructions.append((op, rest))
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse()[1]


def stage(stages: list[Stage], name: str) -> Stage:
    return next(s for s in stages if s.name == name)


def test_four_stages_on_the_pinned_python_and_go(stages: list[Stage]) -> None:
    assert [s.name for s in stages] == ["builder", "helm", "mig-parted", "runtime"]
    assert {s.base.partition("@")[0] for s in stages if s.name != "mig-parted"} == {PYTHON_IMAGE}
    # The Go release the tests' nvidia-mig-parted was built with (hack/versions.env records that build's sha256).
    assert stage(stages, "mig-parted").base == "golang:1.26.8-bookworm"


def test_builder_makes_wheels_and_runtime_installs_only_those(stages: list[Stage]) -> None:
    builder, runtime = stage(stages, "builder"), stage(stages, "runtime")
    assert any("pip wheel" in r and "/wheels" in r for r in builder.args("RUN"))
    install = [r for r in runtime.args("RUN") if "pip install" in r]
    assert len(install) == 1
    assert "--no-index" in install[0]
    assert "from=builder" in install[0]
    assert "/wheels" in install[0]
    assert not any("pip install" in r for r in builder.args("RUN")), "no stray installs in the builder"


def test_runtime_has_ssh_and_ssh_agent(stages: list[Stage]) -> None:
    runtime = stage(stages, "runtime")
    apt = " ".join(r for r in runtime.args("RUN") if "apt-get" in r)
    assert "openssh-client" in apt  # ssh for every task, ssh-agent/ssh-add for ansible-runner's key
    assert "--no-install-recommends" in apt
    assert "rm -rf /var/lib/apt/lists" in apt


def _venv(runtime: Stage) -> PurePosixPath:
    env = " ".join(runtime.args("ENV"))
    m = re.search(r"VIRTUAL_ENV=(\S+)", env)
    assert m, "runtime sets VIRTUAL_ENV"
    assert any(f"-m venv {m.group(1)}" in r for r in runtime.args("RUN"))
    assert f"PATH={m.group(1)}/bin:" in env
    return PurePosixPath(m.group(1))


def test_playbooks_land_where_the_installed_package_looks(stages: list[Stage], monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = stage(stages, "runtime")
    python = re.match(r"python:(\d+\.\d+)", runtime.base)
    assert python
    installed = _venv(runtime) / "lib" / f"python{python.group(1)}" / "site-packages"
    monkeypatch.setattr(ansible, "__file__", str(installed / "capi_gpu" / "provisioning" / "ansible.py"))
    expected = ansible.default_playbook_dir()
    copies = [c.split() for c in runtime.args("COPY") if not c.startswith("--from")]
    assert ["playbooks/", f"{expected}/"] in copies


def test_runs_as_a_named_non_root_user(stages: list[Stage]) -> None:
    runtime = stage(stages, "runtime")
    (user,) = runtime.args("USER")
    uid = user.split(":")[0]
    assert uid not in ("0", "root")
    assert uid == "65532"
    assert any("useradd" in r and "--uid 65532" in r for r in runtime.args("RUN")), "ssh needs a passwd entry"
    # USER comes after every RUN: nothing is installed as the runtime user, nothing runs as root after it.
    ops = [o for o, _ in runtime.instructions]
    assert max(i for i, o in enumerate(ops) if o == "RUN") < ops.index("USER")


def test_entrypoint_is_capi_gpu_run(stages: list[Stage]) -> None:
    runtime = stage(stages, "runtime")
    assert [json.loads(e) for e in runtime.args("ENTRYPOINT")] == [["capi-gpu"]]
    assert [json.loads(c) for c in runtime.args("CMD")] == [["run"]]


def _versions_env() -> dict[str, str]:
    lines = (h.REPO / "hack" / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_helm_is_the_pinned_release_checked_against_its_sha256(stages: list[Stage]) -> None:
    helm = stage(stages, "helm")
    args = dict(a.split("=", 1) for a in helm.args("ARG") if "=" in a)
    assert args["HELM_VERSION"] == _versions_env()["HELM_VERSION"], "the image's helm is the version the tests run"
    for arch in ("AMD64", "ARM64"):
        assert re.fullmatch(r"[0-9a-f]{64}", args[f"HELM_SHA256_{arch}"]), f"no sha256 written down for {arch}"
    (run,) = helm.args("RUN")
    assert "https://get.helm.sh/helm-${HELM_VERSION}-linux-${TARGETARCH}.tar.gz" in run
    # Checked before it is unpacked, and an architecture without a written checksum fails the build.
    assert run.index("sha256sum -c") < run.index("tar -x")
    assert re.search(r"\*\)[^)]*exit 1 ;;", run)
    assert "helm version" in run and "${HELM_VERSION}" in run.split("helm version", 1)[1]


def test_runtime_has_helm_on_its_path(stages: list[Stage]) -> None:
    runtime = stage(stages, "runtime")
    copies = [c.split() for c in runtime.args("COPY") if c.startswith("--from=helm")]
    assert copies == [["--from=helm", "/usr/local/bin/helm", "/usr/local/bin/helm"]]
    env = " ".join(runtime.args("ENV"))
    path = re.search(r"PATH=(\S+)", env)
    assert path and "/usr/local/bin" in path.group(1).split(":")  # `capi-gpu run --helm` defaults to "helm"


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        p = pattern.lstrip("!").rstrip("/")
        if (
            fnmatch.fnmatch(path, p)
            or fnmatch.fnmatch(path.split("/", maxsplit=1)[0], p)
            or (p.startswith("**/") and fnmatch.fnmatch(Path(path).name, p[3:]))
        ):
            ignored = not negate
    return ignored


def test_copy_sources_exist_and_pass_dockerignore(stages: list[Stage]) -> None:
    patterns = [
        line.strip()
        for line in (h.REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [s for st in stages for c in st.args("COPY") if not c.startswith("--from") for s in c.split()[:-1]]
    assert sources
    for src in sources:
        path = h.REPO / src
        assert path.exists(), f"COPY {src}: not in the repository"
        assert not _ignored(src.rstrip("/"), patterns), f"COPY {src}: excluded by .dockerignore"
    assert _ignored("tests/unit/x.py", patterns)
    assert _ignored("capi_gpu/__pycache__/kube.cpython-311.pyc", patterns)
    assert not _ignored("capi_gpu/kube.py", patterns)


def test_mig_parted_is_built_from_the_pinned_commit_and_checked_against_the_recorded_sha256(
    stages: list[Stage],
) -> None:
    build = stage(stages, "mig-parted")
    args = dict(a.split("=", 1) for a in build.args("ARG") if "=" in a)
    pinned = _versions_env()
    assert args["MIG_PARTED_VERSION"] == pinned["MIG_PARTED_VERSION"]
    assert args["MIG_PARTED_COMMIT"] == pinned["MIG_PARTED_COMMIT"]
    assert args["MIG_PARTED_SHA256"] == pinned["MIG_PARTED_SHA256"], "the image ships the bytes the tests ran"
    (run,) = build.args("RUN")
    assert 'test "$(git rev-parse HEAD)" = "${MIG_PARTED_COMMIT}"' in run
    # The same flags as hack/build-upstream.sh mp, so the same bytes; checked before the runtime copies it.
    script = (h.REPO / "hack" / "build-upstream.sh").read_text()
    for flag in ("CGO_ENABLED=1", "GOFLAGS=-mod=vendor", "-trimpath", '-ldflags "-s -w -X', "./cmd/nvidia-mig-parted"):
        assert flag in run and flag in script, flag
    assert run.index("go build") < run.index("sha256sum -c") < run.index("--version")


def test_the_runtime_carries_mig_parted_where_the_operator_looks(stages: list[Stage]) -> None:
    runtime = stage(stages, "runtime")
    (copy,) = [c.split() for c in runtime.args("COPY") if c.startswith("--from=mig-parted")]
    assert copy == ["--from=mig-parted", "/out/", str(shipped_mig_parted.DEFAULT_PATH.parent) + "/"]
    assert shipped_mig_parted.DEFAULT_PATH.name == "nvidia-mig-parted"
