"""The sinks of the hostile-field property test: admission as the webhook decides it, then every builder a
value reaches on the way to a host or a playbook, each output checked by the rule that makes it data:

- the extra vars of site.yml and addons.yml, loaded by ansible-core's own loader exactly as ``-e @file``
  loads them: no string may be trusted as a template;
- installimage's config: every line one directive of the grammar, none added;
- the post-install script: outside the user's own ``postInstallScript`` (shell by design, run only on their
  server), no value appears in clear (it travels base64-encoded);
- the cloud-init meta-data: parses to exactly its three keys;
- SSH command lines: no value appears in one (files travel over SFTP; spec.image's URL too, read by the
  rescue script as one argv word).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hostile
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import is_trusted_as_template
from hostile import MARK, WWN_A, WWN_B
from pydantic import ValidationError

from capi_gpu.api import kinds
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.api.host import DiskInfo, HetznerGPUHost
from capi_gpu.api.specs import GPUSpec, InstallImageSpec, NodeImageSpec
from capi_gpu.controllers import cluster_addons
from capi_gpu.gpu import catalog, gpuplan
from capi_gpu.provisioning import (
    admission,
    ansible_data,
    chartref,
    installimage,
    node_image,
    playbook_vars,
    ssh,
    sshtransport,
)
from capi_gpu.runtime.settings import Settings

SITE, ADDONS, AUTOSETUP, POST, META, SSH = (
    "site.yml vars",
    "addons.yml vars",
    "installimage config",
    "post-install script",
    "cloud-init meta-data",
    "SSH command lines",
)
SINKS = (SITE, ADDONS, AUTOSETUP, POST, META, SSH)
CAT = catalog.builtin_catalog()
SETTINGS = Settings()
DISKS = [DiskInfo(name=n, wwn=w, size_bytes=2 << 40) for n, w in (("nvme0n1", WWN_A), ("nvme1n1", WWN_B))]
SERVER, HOSTNAME = 1234567, "gex131-a"
_AUTOSETUP_LINE = re.compile(
    r"^(DRIVE[0-9] /dev/disk/by-id/[A-Za-z0-9._-]+|SWRAID [01]|SWRAIDLEVEL (0|1|5|6|10)|BOOTLOADER grub"
    r"|HOSTNAME [a-z0-9.-]+|PART (/\S*|swap|lvm) (ext4|ext3|xfs|btrfs|swap|esp) (all|[0-9]+[MGT])|IMAGE \S+)$"
)


@dataclass
class Outcome:
    """What became of one object: refused (where and why), or the text each sink got."""

    refused: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    user_script: str = ""


def refusal(kind: kinds.Kind, body: dict[str, Any]) -> str | None:
    """The webhook's answer (the model, then ``admission.refusals``); None: admitted."""
    try:
        kind.model.model_validate({**body, "status": {}} if kind.status else body)
    except ValidationError as exc:
        return f"schema: {exc.errors(include_url=False)[0]['msg']}"
    found = admission.refusals(kind.kind, body, [], CAT, chartref.Policy(bundled=None))
    return f"webhook: {found[0]}" if found else None


def drive(kind: kinds.Kind, body: dict[str, Any]) -> Outcome:
    """Everything the operator would build from an admitted ``body``."""
    why = refusal(kind, body)
    if why is not None:
        return Outcome(refused=why)
    spec = body["spec"]["template"]["spec"] if kind.kind.endswith("Template") else body["spec"]
    try:
        if kind.kind.startswith("HetznerGPUCluster"):
            return _cluster(spec)
        if kind.kind.startswith("HetznerGPUMachine"):
            image = spec.get("image")
            return _node(spec.get("installImage"), spec.get("gpu"), spec.get("kubernetesVersion"), None, image)
        if kind.kind == "HetznerGPUHost":
            host = HetznerGPUHost.model_validate({**body, "status": {}})
            sb = host.spec.standby
            assert sb is not None
            return _node(sb.install_image.wire(), sb.gpu.wire(), sb.kubernetes_version, host)
    except (ValueError, gpuplan.PlanError, installimage.NoInstallDisk) as exc:  # a builder refused: no sink
        return Outcome(refused=f"builder: {type(exc).__name__}")
    return Outcome()  # remediation kinds: numbers and enums only


def _cluster(spec: dict[str, Any]) -> Outcome:
    hgc = HetznerGPUCluster.model_validate({"metadata": {"name": "c", "namespace": "a"}, "spec": spec})
    if chartref.refusal(hgc.spec.addons.dra_driver.chart_ref, SETTINGS.chart_policy) is not None:
        return Outcome(refused="controller: ChartRefNotAllowed")
    request = cluster_addons.request_for(SimpleNamespace(settings=SETTINGS), hgc)  # type: ignore[arg-type]
    extra = request.extra_vars() | {"addons_kubeconfig": "/run/kc", "helm_binary": "helm"}
    return Outcome(outputs={ADDONS: ansible_data.extravars_text(extra)})


def _node(image: Any, gpu: Any, version: str | None, host: HetznerGPUHost | None, baked: Any = None) -> Outcome:
    spec = InstallImageSpec.model_validate(image or {})
    g = GPUSpec.model_validate(gpu or {})
    plan = gpuplan.plan(g, gpuplan.DEFAULT_MODEL, CAT)
    variables = playbook_vars.node_vars(version or "v1.36.3", plan, g.driver_branch)
    hints = host.spec.root_device_hints if host is not None else None
    wwns = installimage.root_disks(DISKS, hints, spec)
    config = installimage.autosetup(spec, HOSTNAME, wwns, uefi=True)
    meta = installimage.meta_data("u-9", HOSTNAME, SERVER)
    script = installimage.post_install(
        HOSTNAME,
        "PRIVATE",
        "ssh-ed25519 AAAA",
        "ssh-ed25519 BBBB",
        f"{HOSTNAME}-1",
        None,
        extra=spec.post_install_script,
        server_number=SERVER,
    )
    shell = Recording()
    if baked is not None:  # spec.image: staged and its manifest read in rescue before installimage
        node = NodeImageSpec.model_validate(baked)
        dest = node_image.staged_path(node)
        shell.stage_image(node.url, dest)
        shell.image_manifest(dest)
    shell.start_installimage(config, script)
    shell.start_bootstrap("#cloud-config\n{}\n", meta)
    return Outcome(
        outputs={
            SITE: ansible_data.extravars_text(variables.extra_vars()),
            AUTOSETUP: config,
            POST: script,
            META: meta,
            SSH: "\n".join(shell.commands),
        },
        user_script=spec.post_install_script or "",
    )


class Recording(ssh.ParamikoShell):
    """The real shell's command building, with a session that records instead of connecting."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self._installimage = ssh.INSTALLIMAGE
        self._session = self  # type: ignore[assignment]
        self.endpoint = SimpleNamespace(host="192.0.2.1")

    def run(self, operation: str, command: str, timeout: float | None = None) -> sshtransport.Result:
        self.commands.append(command)
        return sshtransport.Result(0, b"0" * 64 + b"  staged\n" if operation == "stage_image" else b"", b"")

    def put(self, path: str, data: bytes, mode: int) -> None:
        self.commands.append(f"<sftp {path}>")


def problems(out: Outcome) -> list[str]:
    """Every way a sink output breaks its rule; empty when all are data."""
    found = []
    for sink, text in out.outputs.items():
        if sink in (SITE, ADDONS) and (trusted := _trusted_strings(text)):
            found.append(f"{sink}: trusted as templates: {trusted[:2]}")
        elif sink == AUTOSETUP and (bad := [ln for ln in text.splitlines() if not _AUTOSETUP_LINE.match(ln)]):
            found.append(f"{sink}: lines outside the grammar: {bad[:2]}")
        elif sink == POST and MARK in text.replace(out.user_script, ""):
            found.append(f"{sink}: a value in clear outside the user's own script")
        elif sink == META and yaml.safe_load(text) != {
            "instance-id": "u-9",
            "local-hostname": HOSTNAME,
            "server_number": SERVER,
        }:
            found.append(f"{sink}: keys or values changed")
        elif sink == SSH and MARK in text:
            found.append(f"{sink}: a value on a command line")
    return found


def reached(out: Outcome) -> set[str]:
    """The sinks whose output carries the payload (as data)."""
    return {
        s
        for s, text in out.outputs.items()
        if MARK in text or (s == POST and out.user_script and MARK in out.user_script)
    }


def _trusted_strings(text: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "extravars"
        path.write_text(text)
        data = DataLoader().load_from_file(str(path), trusted_as_template=True)  # as `-e @file` loads it
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str) and is_trusted_as_template(v):
            out.append(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(data)
    return out


# --- the sweep and its table --------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[3] / "docs" / "security-fields.md"


@dataclass
class Row:
    admitted: set[str] = field(default_factory=set)
    """Payload classes the schema and the webhook let through."""
    sinks: set[str] = field(default_factory=set)
    """Sinks an admitted payload reached (as data)."""
    feeds: set[str] = field(default_factory=set)
    """Sinks whose output changes with the field's value (another valid value than the sample's)."""
    problems: list[str] = field(default_factory=list)


# Valid alternatives where a generic change of the sample's value is never valid (closed vocabularies).
_KNOWN = {".preset": ["all-2g.48gb"], ".profiles{key}": ["2g.48gb"], ".size": ["2048M"]}


def variants(leaf: str, original: str) -> list[str]:
    """Other values that may be valid: the field's feeds are the sinks whose output they change."""
    out = [original + "x", "x" + original, original + "0"]
    if original[-1:].isdigit():
        out.append(original[:-1] + str((int(original[-1]) + 1) % 10))
    return out + next((v for k, v in _KNOWN.items() if leaf.endswith(k)), [])


def sweep(port: int) -> tuple[dict[tuple[str, str], Row], list[Outcome]]:
    """Every payload (alone, and before and after the sample's own value) into every string of every
    sample; returns the row of each (kind, field) and the admitted outcomes that reached addons.yml."""
    rows: dict[tuple[str, str], Row] = {}
    addons_runs: list[Outcome] = []
    for kind in kinds.KINDS:
        for leaf in hostile.spec_leaves(kind):
            row = rows.setdefault((kind.kind, leaf), Row())
            for sample in hostile.samples(kind.kind):
                base = drive(kind, sample)
                for slot in hostile.slots(sample, leaf):
                    original = str(slot.route[-1]) if slot.is_key else _at(sample, slot)
                    for other in variants(leaf, original):
                        out = drive(kind, hostile.put(sample, slot, other))
                        row.feeds |= {s for s, t in out.outputs.items() if t != base.outputs.get(s)}
                    for name, payload in hostile.payloads(port).items():
                        for value in {payload, original + payload, payload + original}:
                            out = drive(kind, hostile.put(sample, slot, value))
                            if out.refused is not None:
                                continue
                            row.admitted.add(name)
                            row.sinks |= reached(out)
                            row.problems += [f"{leaf} <- {name}: {p}" for p in problems(out)]
                            if ADDONS in reached(out):
                                addons_runs.append(out)
    return rows, addons_runs


def _at(doc: dict[str, Any], slot: hostile.Slot) -> str:
    node: Any = doc
    for step in slot.route:
        node = node[step]
    return str(node)


def table(rows: dict[tuple[str, str], Row]) -> str:
    """docs/security-fields.md: which payload classes each field admits, and which sinks they reach."""
    n_admit = sum(1 for r in rows.values() if r.admitted)
    feeds = {s: sum(1 for r in rows.values() if s in r.feeds | r.sinks) for s in SINKS}
    per_sink = {s: sum(1 for r in rows.values() if s in r.sinks) for s in SINKS}
    lines = [
        "# Fields against sinks",
        "",
        "Generated by `tests/unit/provisioning/test_hostile_fields.py` (rewrite it with",
        "`python tests/unit/provisioning/hostile_sinks.py`); the test fails when this file differs from",
        "the sweep. Every string of every spec kind (map keys and list items included) gets each payload",
        "class alone and around its valid value; *admitted* lists the classes the schema and the webhook let",
        "through. In a sink's column, **payload**: an admitted payload lands there (checked to be data, see",
        "[security.md](security.md)); **valid only**: the field feeds that sink (another valid value changes",
        "its output) but its pattern admits no payload; `-`: never there. A field whose every other value the",
        "builders refuse (the GPU model: layouts are per model) shows no feed. Pass: no sink output breaks",
        "its rule, no marker file, no connection.",
        "",
        f"- {len(rows)} string fields in {len({k for k, _ in rows})} kinds (the remediation's spec has none);"
        f" {n_admit} admit at least one payload class",
        *(f"- {s}: fed by {feeds[s]} fields, {per_sink[s]} of them admit a payload into it" for s in SINKS),
        "",
        "| kind | field | admitted payload classes | " + " | ".join(SINKS) + " |",
        "|---|---|---|" + "---|" * len(SINKS),
    ]
    for (kind, leaf), r in rows.items():
        admitted = ", ".join(sorted(r.admitted)) or "none"
        cells = ["payload" if s in r.sinks else "valid only" if s in r.feeds else "-" for s in SINKS]
        lines.append(f"| {kind} | `{leaf}` | {admitted} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    found, _ = sweep(40000)
    DOC.write_text(table(found))
