"""The playbooks agree with the Python side: every role default is documented, the reboot-needed
stats keys are the ones capi_gpu.provisioning reads, names come from capi_gpu.domain (gate driver, startup
taint), the DRA chart values keep static MIG, and the MIG config is written verbatim, never templated."""

from __future__ import annotations

import re

import yaml

from capi_gpu import domain
from capi_gpu.provisioning import ansible, ansible_events

PLAYBOOKS = ansible.default_playbook_dir()
ROLES = PLAYBOOKS / "roles"
VALUES = PLAYBOOKS.parent / "config" / "dra-driver" / "values.yaml"
SITE_ROLES = ["private_network", "nvidia_driver", "container_toolkit", "mig_layout", "dra_node", "kubelet"]


def test_site_runs_the_roles_in_order() -> None:
    (play,) = yaml.safe_load((PLAYBOOKS / "site.yml").read_text())
    assert [r["role"] for r in play["roles"]] == SITE_ROLES


def test_every_role_default_is_documented_by_a_comment() -> None:
    undocumented = []
    for path in sorted(ROLES.glob("*/defaults/main.yml")):
        for paragraph in path.read_text().split("\n\n"):
            lines = [line for line in paragraph.splitlines() if line.strip() and line != "---"]
            keys = [line.split(":")[0] for line in lines if re.match(r"^[a-z_]+:", line)]
            if keys and not lines[0].startswith("#"):
                undocumented += [f"{path.parent.parent.name}: {k}" for k in keys]
    assert not undocumented


def test_role_variables_carry_their_role_prefix() -> None:
    for path in ROLES.glob("*/defaults/main.yml"):
        role = path.parent.parent.name
        assert all(key.startswith(role + "_") for key in yaml.safe_load(path.read_text())), role


def test_the_reboot_request_role_sets_the_keys_the_runner_reads() -> None:
    (_, record, end) = yaml.safe_load((ROLES / "reboot_request" / "tasks" / "main.yml").read_text())
    stats = record["ansible.builtin.set_stats"]
    assert set(stats["data"]) == {ansible_events.REBOOT_STATS_KEY, ansible_events.REBOOT_REASON_KEY}
    assert stats["data"][ansible_events.REBOOT_STATS_KEY] is True
    assert stats["per_host"] is False, "run-wide stats are what reach artifact_data"
    assert end["ansible.builtin.meta"] == "end_host"


def test_the_gate_plugin_dir_default_is_the_domain_gate_driver() -> None:
    defaults = yaml.safe_load((ROLES / "dra_node" / "defaults" / "main.yml").read_text())
    assert defaults["dra_node_gate_driver"] == domain.GATE_DRIVER
    assert defaults["dra_node_nvidia_driver"] == domain.NVIDIA_DRIVER


def test_the_dra_chart_values_keep_static_mig_and_tolerate_the_startup_taint() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert values["nvidiaDriverRoot"] == "/"
    assert values["gpuResourcesEnabledOverride"] is True
    assert values["featureGates"]["DynamicMIG"] is False
    tolerated = {t["key"]: t for t in values["kubeletPlugin"]["tolerations"]}
    assert tolerated[domain.NODE_STARTUP_TAINT]["operator"] == "Exists"
    assert "effect" not in tolerated[domain.NODE_STARTUP_TAINT], "tolerate the taint whatever its effect"


def test_the_mig_config_is_copied_verbatim() -> None:
    tasks = yaml.safe_load((ROLES / "mig_layout" / "tasks" / "main.yml").read_text())
    (write,) = [t for t in tasks if "ansible.builtin.copy" in t]
    assert write["ansible.builtin.copy"]["content"] == "{{ mig_layout_config_yaml }}"
    assert not list((ROLES / "mig_layout" / "templates").glob("*mig-parted*"))


def test_the_boot_unit_runs_before_kubelet_after_persistenced_and_fails_closed() -> None:
    unit = (ROLES / "mig_layout" / "templates" / "capi-gpu-mig-layout.service.j2").read_text()
    assert "Before=kubelet.service" in unit
    assert "After=nvidia-persistenced.service" in unit
    assert "Type=oneshot" in unit
    assert re.search(r"^ExecStartPost=/usr/bin/nvidia-ctk cdi generate --output=", unit, re.M)
    assert re.search(r"^WantedBy=multi-user.target$", unit, re.M)
    assert re.search(r"^RequiredBy=kubelet.service$", unit, re.M), "kubelet must not start without the layout"


def test_every_network_source_pins_its_key_and_a_downloaded_deb_its_checksum() -> None:
    repos = []
    for path in ROLES.glob("*/defaults/main.yml"):
        for key, value in (yaml.safe_load(path.read_text()) or {}).items():
            if key.endswith("_repo") and isinstance(value, dict) and value:
                repos.append((key, value))
    assert len(repos) == 4
    for key, repo in repos:
        assert re.fullmatch(r"[0-9A-F]{40}", repo.get("key_fingerprint", "")), key
    tasks = (ROLES / "mig_layout" / "tasks" / "downloads.yml").read_text()
    assert 'checksum: "sha256:{{ mig_layout_manager_deb_sha256 }}"' in tasks
    fetches = [t for t in yaml.safe_load(tasks) if "ansible.builtin.get_url" in t]
    assert fetches and all("checksum" in t["ansible.builtin.get_url"] for t in fetches)


def test_every_fetch_by_url_runs_before_the_first_role_installs_anything() -> None:
    play = yaml.safe_load((ROLES.parent / "site.yml").read_text())[0]
    first = [
        (t["ansible.builtin.include_role"]["name"], t["ansible.builtin.include_role"]["tasks_from"])
        for t in play["pre_tasks"]
    ]
    fetching = {
        p.parent.parent.name
        for p in ROLES.glob("*/tasks/*.yml")
        if "get_url" in p.read_text() or "tasks_from: key.yml" in p.read_text()
    }
    fetching -= {"apt_source"}  # the helper: its key.yml is what the others' downloads.yml run
    assert sorted(first) == sorted((role, "downloads.yml") for role in fetching)


def test_the_shipped_mig_parted_is_checked_on_the_host_before_it_runs() -> None:
    tasks = yaml.safe_load((ROLES / "mig_layout" / "tasks" / "install.yml").read_text())
    names = [t["name"] for t in tasks]
    copy = next(t for t in tasks if "ansible.builtin.copy" in t and "src" in t["ansible.builtin.copy"])
    assert copy["ansible.builtin.copy"]["src"] == "{{ mig_layout_parted_src }}"
    check = names.index("Check the copy on the host is the binary the operator ships")
    assert names.index(copy["name"]) < check < names.index("Run the shipped nvidia-mig-parted on this host")
    main = [t["name"] for t in yaml.safe_load((ROLES / "mig_layout" / "tasks" / "main.yml").read_text())]
    assert main.index("Install nvidia-mig-parted and check it") < main.index("Apply the layout")
    # At every boot too, before the apply: a binary replaced since the install keeps kubelet from starting.
    unit = (ROLES / "mig_layout" / "templates" / "capi-gpu-mig-layout.service.j2").read_text()
    pre = re.search(r"^ExecStartPre=/usr/bin/sha256sum --check --strict --quiet (.+)$", unit, re.M)
    assert pre and pre.group(1) == "{{ mig_layout_parted_sha256_file }}"
    assert unit.index("ExecStartPre=") < unit.index("ExecStart={{ mig_layout_parted_exec }} apply")


def test_no_default_downloads_mig_parted_from_a_release_page() -> None:
    defaults = (ROLES / "mig_layout" / "defaults" / "main.yml").read_text()
    assert "releases/download" not in defaults
    assert not [p for p in PLAYBOOKS.rglob("*.yml") if "VERIFY" in p.read_text()]
