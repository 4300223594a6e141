"""Keys stay valid: roles/apt_source's key.yml, run for real by ansible-playbook on this machine (its keyring and
scratch directories pointed into a temp dir), against a stand-in publisher that signs a repository with real
gpg (capi_gpu_sim.aptsign) and real apt (sandboxed) reading it. A node's copy of a key that has since expired
makes apt report EXPKEYSIG; once the publisher extends the expiry by re-signing its key, the next run fetches
the key again, checks the pinned fingerprint and replaces the file, and apt reads the repository; a further run
changes nothing. A key in place that is not the pinned one is replaced by the pinned one. An attacker's key at
the URL fails the play, closed: the file in place is left as it was. A publisher whose key at the URL is
still expired fails the play with that reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from capi_gpu.provisioning import ansible
from capi_gpu_sim import apt_standins, aptrepo, aptsign, host_shims

pytestmark = pytest.mark.integration

ROLES = ansible.default_playbook_dir() / "roles"
LONG_AGO, SIGNED_THEN = "20200101T000000", "20200601T000000"  # a key made in 2020 that expired in 2021
NAME = "kubernetes"


def _repo(path: Path, key_url: str, fingerprint: str) -> dict[str, object]:
    return {
        "uri": f"file:{path}",
        "suite": "./",
        "components": [],
        "key_url": key_url,
        "key_fingerprint": fingerprint,
        "trusted": False,
    }


def run_play(
    root: Path, tasks: list[dict[str, object]], extra: dict[str, object], environment: dict[str, str] | None = None
) -> tuple[int, dict[str, int], str]:
    """One play of ``tasks`` on localhost, for real: (rc, localhost's stats, output)."""
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "environment": environment or {},
            "tasks": tasks,
        }
    ]
    (root / "play.yml").write_text(json.dumps(play))
    extra = {**extra, "ansible_python_interpreter": sys.executable}  # the modules run here, with the test's Python
    (root / "vars.json").write_text(json.dumps(extra))
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROLES),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
    }
    playbook = Path(sys.executable).parent / "ansible-playbook"
    argv = [str(playbook), "-i", "localhost,", "-e", f"@{root / 'vars.json'}", str(root / "play.yml")]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    stats = json.loads(done.stdout)["stats"]["localhost"] if done.stdout.startswith("{") else {}
    return done.returncode, stats, done.stdout + done.stderr


@dataclass
class Node:
    """The role's view (keyring, scratch gnupg home) and apt's (a sandbox reading the signed repository)."""

    root: Path
    repo: Path
    key_url: str
    fingerprint: str

    @property
    def key_file(self) -> Path:
        return self.root / "keyrings" / f"{NAME}.asc"

    def run_role(self) -> tuple[int, dict[str, int], str]:
        """key.yml once: (rc, localhost's stats, output)."""
        task = {
            "name": "The key of one source",
            "ansible.builtin.include_role": {"name": "apt_source", "tasks_from": "key.yml"},
        }
        extra = {
            "apt_source_name": NAME,
            "apt_source_repo": _repo(self.repo, self.key_url, self.fingerprint),
            "apt_source_keyring_dir": str(self.root / "keyrings"),
            "apt_source_gnupg_home": str(self.root / "scratch"),
        }
        return run_play(self.root, [task], extra)

    def apt_update(self) -> str:
        t = self.root / "apt"
        for d in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "etc/apt/apt.conf.d"):
            (t / d).mkdir(parents=True, exist_ok=True)
        (t / "status").touch()
        (t / "sources.list").write_text(f"deb [signed-by={self.key_file}] file:{self.repo} ./\n")
        opts = [
            *("-o", f"Dir={t}", "-o", f"Dir::State::status={t}/status", "-o", "APT::Sandbox::User=root"),
            *("-o", f"Dir::Etc::sourcelist={t}/sources.list", "-o", f"Dir::Etc::sourceparts={t}/etc/apt"),
            *("-o", f"Dir::Etc::parts={t}/etc/apt/apt.conf.d", "-o", "Debug::NoLocking=1"),
        ]
        done = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True, timeout=120, check=False)
        return done.stdout + done.stderr


@pytest.fixture
def world(tmp_path: Path) -> tuple[aptsign.Publisher, Node]:
    publisher = aptsign.Publisher.create(tmp_path / "publisher", "pkgs-k8s", created=LONG_AGO, expires="1y")
    pkg = apt_standins.Package("kubectl", "1.36.3-1.1", NAME, "k", {"/usr/bin/kubectl": host_shims.GuestFile(b"")})
    aptrepo.build(tmp_path / "repo", [pkg])
    publisher.sign(tmp_path / "repo" / NAME, at=SIGNED_THEN)
    key = publisher.export(tmp_path / "www" / "Release.key")
    node = Node(tmp_path / "node", tmp_path / "repo" / NAME, f"file://{key}", publisher.fingerprint)
    node.key_file.parent.mkdir(parents=True)
    shutil.copy(key, node.key_file)  # what the node fetched back then, while the key was valid
    return publisher, node


def test_an_expired_key_is_fetched_again_once_the_publisher_extends_it(world: tuple[aptsign.Publisher, Node]) -> None:
    publisher, node = world
    assert "EXPKEYSIG" in node.apt_update(), "apt refuses the repository signed by the expired key"

    # The publisher has not extended the key yet: fetched again, still expired, the play says so.
    rc, _, out = node.run_role()
    assert rc != 0 and "has expired or cannot sign" in out

    publisher.extend("2y")
    publisher.sign(node.repo)  # and re-signs the repository, as it does
    publisher.export(Path(node.key_url.removeprefix("file://")))
    before = node.key_file.read_bytes()
    rc, stats, out = node.run_role()
    assert rc == 0, out
    assert stats["changed"] >= 1 and node.key_file.read_bytes() != before, "the file was replaced"
    assert "EXPKEYSIG" not in (update := node.apt_update()) and "Err:" not in update, update

    rc, stats, out = node.run_role()
    assert rc == 0 and stats["changed"] == 0, out  # a valid key in place is kept, nothing fetched


def test_a_key_in_place_that_is_not_the_pinned_one_is_replaced(
    world: tuple[aptsign.Publisher, Node], tmp_path: Path
) -> None:
    publisher, node = world
    publisher.extend("2y")
    publisher.export(Path(node.key_url.removeprefix("file://")))
    other = aptsign.Publisher.create(tmp_path / "other", "other")
    other.export(node.key_file)  # a valid key, but not the pinned one
    rc, stats, out = node.run_role()
    assert rc == 0 and stats["changed"] >= 1, out
    assert node.key_file.read_text() == Path(node.key_url.removeprefix("file://")).read_text()


def test_an_attackers_key_at_the_url_fails_closed(world: tuple[aptsign.Publisher, Node], tmp_path: Path) -> None:
    _, node = world
    attacker = aptsign.Publisher.create(tmp_path / "attacker", "attacker")
    attacker.export(Path(node.key_url.removeprefix("file://")))  # the URL now serves a valid key, not the pin
    before = node.key_file.read_bytes()
    rc, _, out = node.run_role()
    assert rc != 0 and f"is not {node.fingerprint}" in out
    assert node.key_file.read_bytes() == before, "the attacker's key never reaches apt's keyring"


def test_each_source_is_signed_by_its_own_key(tmp_path: Path) -> None:
    """The whole role twice in one play, as site.yml adds its sources one after another: each list's signed-by is
    its own key file (a registered variable named like the role's default key path once handed the second
    source the first one's stat result), and apt, sandboxed, reads both repositories with them. A second run
    changes nothing."""
    node = tmp_path / "node"
    apt = node / "apt"
    for d in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "etc/apt/apt.conf.d", "sources"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "status").touch()
    # APT_CONFIG is read before anything else: apt's state and configuration, all in the sandbox.
    (apt / "apt.conf").write_text(
        f'Dir "{apt}/";\nDir::State::status "{apt}/status";\nAPT::Sandbox::User "root";\nDebug::NoLocking "1";\n'
    )
    tasks: list[dict[str, object]] = []
    keys: dict[str, str] = {}
    for name in ("cuda", "kubernetes"):
        publisher = aptsign.Publisher.create(tmp_path / f"publisher-{name}", name)
        pkg = apt_standins.Package(f"{name}-tool", "1.0-1", name, "t", {f"/usr/bin/{name}": host_shims.GuestFile(b"")})
        aptrepo.build(tmp_path / "repo", [pkg])
        publisher.sign(tmp_path / "repo" / name)
        key = publisher.export(tmp_path / "www" / f"{name}.key")
        keys[name] = key.read_text()
        tasks.append(
            {
                "name": f"The {name} source",
                "ansible.builtin.include_role": {"name": "apt_source"},
                "vars": {
                    "apt_source_name": name,
                    "apt_source_repo": _repo(tmp_path / "repo" / name, f"file://{key}", publisher.fingerprint),
                },
            }
        )
    extra = {
        "apt_source_keyring_dir": str(node / "keyrings"),
        "apt_source_gnupg_home": str(node / "scratch"),
        "apt_source_list_dir": str(apt / "sources"),
        "apt_source_stamp_dir": str(node / "stamps"),
    }
    environment = {"APT_CONFIG": str(apt / "apt.conf")}

    rc, _, out = run_play(node, tasks, extra, environment)
    assert rc == 0, out
    for name, key_text in keys.items():
        key_file = node / "keyrings" / f"{name}.asc"
        assert f"[signed-by={key_file}]" in (apt / "sources" / f"{name}.list").read_text()
        assert key_file.read_text() == key_text
    lists = [p.name for p in (apt / "var/lib/apt/lists").iterdir()]
    assert all(any(n.endswith(f"_{name}_._InRelease") for n in lists) for name in keys), lists

    rc, stats, out = run_play(node, tasks, extra, environment)
    assert rc == 0 and stats["changed"] == 0, out


def test_a_key_with_another_key_appended_fails_closed(world: tuple[aptsign.Publisher, Node], tmp_path: Path) -> None:
    """signed-by trusts every key in the file: the pinned key with an attacker's appended at the URL fails the play,
    and a key file in place that carries an extra key is fetched again (and here refused again)."""
    publisher, node = world
    publisher.extend("2y")
    url = Path(node.key_url.removeprefix("file://"))
    attacker = aptsign.Publisher.create(tmp_path / "attacker", "attacker")
    pinned = publisher.export(url).read_text()
    url.write_text(pinned + attacker.export(tmp_path / "attacker.asc").read_text())
    node.key_file.write_text(url.read_text())  # in place too: it carries the pin, and can sign
    before = node.key_file.read_bytes()
    rc, _, out = node.run_role()
    assert rc != 0 and f"carries other keys besides {node.fingerprint}: " in out, out
    assert attacker.fingerprint in out
    assert node.key_file.read_bytes() == before, "the file in place is left as it was"

    url.write_text(pinned)  # the publisher's URL serves the pinned key alone again
    rc, stats, out = node.run_role()
    assert rc == 0 and stats["changed"] >= 1, out
    assert node.key_file.read_text() == pinned
