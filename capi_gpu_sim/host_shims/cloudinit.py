"""A cloud-init stand-in for the simulated installed OS: NoCloud seed, `write_files`, `runcmd`, status.

Why: CAPI bootstrap data is cloud-config, and the provider delivers it as CAPH does, through a NoCloud
seed written by the post-install script (``/var/lib/cloud/seed/nocloud-net/{meta-data,user-data}``),
then polls ``cloud-init status``. Real cloud-init is heavy and probes the machine; this runs the part
CAPI relies on (as CAPD's provisioner does): ``write_files`` with ``b64``/``gzip`` encodings,
``permissions``, ``owner``, ``append``, ``defer``; ``runcmd`` written as one ``/bin/sh`` script and run in the
final stage (so, as in cloud-init, a failing middle command doesn't stop the rest and the script's exit
status is its last command's); ``#!`` user-data run as a script; ``meta-data`` ``local-hostname``.

Per-instance semantics as in cloud-init: once an instance id has finished, later boots don't re-run it;
``cloud-init clean`` forgets it. ``/etc/cloud/cloud-init.disabled`` disables it. Status (``not started``,
``running``, ``done``, ``error``, ``disabled``) lives in ``/run/cloud-init/status.json`` for the current boot
and ``/var/lib/cloud/data/result.json`` across boots. A systemd unit runs ``cloud-init boot`` at start-up.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

SEED = Path("/var/lib/cloud/seed/nocloud-net")
SEED_ALT = Path("/var/lib/cloud/seed/nocloud")
LIB = Path("/var/lib/cloud")
RUN = Path("/run/cloud-init")
DISABLED = Path("/etc/cloud/cloud-init.disabled")
OUTPUT_LOG = Path("/var/log/cloud-init-output.log")
LOG = Path("/var/log/cloud-init.log")
VERSION = "22.4.2"
WAIT_LIMIT_S = 900.0


def log(msg: str) -> None:
    with LOG.open("a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} - cloud-init[{os.getpid()}]: {msg}\n")


def _seed() -> Path | None:
    for path in (SEED, SEED_ALT):
        if (path / "user-data").exists() or (path / "meta-data").exists():
            return path
    return None


def _meta(seed: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load((seed / "meta-data").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _instance_id(meta: dict[str, Any]) -> str:
    return str(meta.get("instance-id") or meta.get("instance_id") or "nocloud")


def _write_status(state: str, errors: list[str], stage: str | None = None) -> None:
    RUN.mkdir(parents=True, exist_ok=True)
    body = {
        "v1": {
            "datasource": "DataSourceNoCloud [seed=/var/lib/cloud/seed/nocloud-net]",
            "stage": stage,
            "errors": errors,
            "status": state,
            "last_update": time.strftime("%a, %d %b %Y %H:%M:%S +0000"),
        }
    }
    (RUN / "status.json").write_text(json.dumps(body))
    if state in ("done", "error"):
        (LIB / "data").mkdir(parents=True, exist_ok=True)
        (LIB / "data" / "result.json").write_text(json.dumps({"v1": {"errors": errors, "status": state}}))


def _decode(content: Any, encoding: str) -> bytes:
    enc = (encoding or "text/plain").lower()
    raw = content if isinstance(content, bytes) else str(content or "").encode()
    if enc in ("b64", "base64"):
        return base64.b64decode(raw)
    if enc in ("gz", "gzip"):
        return gzip.decompress(raw)
    if enc in ("gz+b64", "gz+base64", "gzip+b64", "gzip+base64"):
        return gzip.decompress(base64.b64decode(raw))
    if enc in ("text/plain", "text_plain", "plain"):
        return raw
    raise ValueError(f"Unknown encoding type {encoding}")


def write_files(entries: list[dict[str, Any]], deferred: bool) -> None:
    for entry in entries:
        if bool(entry.get("defer", False)) != deferred:
            continue
        path = Path(str(entry["path"]))
        data = _decode(entry.get("content", ""), str(entry.get("encoding", "")))
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab" if entry.get("append") else "wb") as fh:
            fh.write(data)
        perms = entry.get("permissions", "0644")
        os.chmod(path, int(str(perms), 8) if not isinstance(perms, int) else perms)
        owner = str(entry.get("owner", "root:root"))
        user, _, group = owner.partition(":")
        shutil.chown(path, user or "root", group or user or "root")
        log(f"write_files: wrote {path}")


def _runcmd_script(cmds: list[Any]) -> str:
    lines = ["#!/bin/sh"]
    for cmd in cmds:
        lines.append(shlex.join(str(c) for c in cmd) if isinstance(cmd, list) else str(cmd))
    return "\n".join(lines) + "\n"


def _run_script(path: Path) -> int:
    os.chmod(path, 0o700)
    with OUTPUT_LOG.open("ab") as out:
        proc = subprocess.run([str(path)], stdout=out, stderr=subprocess.STDOUT, timeout=3600, check=False)
    return proc.returncode


JINJA_HEADER = "## template: jinja"
_JINJA_VAR = re.compile(
    r"\{\{\s*(ds\.meta_data|v1)\.([A-Za-z0-9_]+)\s*\}\}|\{\{\s*ds\.meta_data\[['\"]([^'\"]+)['\"]\]\s*\}\}"
)


def _render_jinja(text: str, meta: dict[str, Any]) -> str:
    """The part of cloud-init's jinja support CAPI templates use: ``{{ ds.meta_data.key }}`` and
    ``{{ v1.local_hostname }}``/``{{ v1.instance_id }}``. An unknown variable fails like cloud-init's
    strict rendering would, instead of silently joining with an empty provider ID."""
    v1 = {"local_hostname": meta.get("local-hostname", ""), "instance_id": meta.get("instance-id", "")}

    def sub(m: re.Match[str]) -> str:
        scope, key, bracket = m.group(1), m.group(2), m.group(3)
        if bracket is not None:
            value = meta.get(bracket)
        else:
            value = v1.get(key) if scope == "v1" else meta.get(key, meta.get(key.replace("_", "-")))
        if value in (None, ""):
            raise ValueError(f"jinja: undefined variable in user-data: {m.group(0)}")
        return str(value)

    return _JINJA_VAR.sub(sub, text.split("\n", 1)[1] if "\n" in text else "")


def _user_data(seed: Path) -> tuple[str, Any]:
    path = seed / "user-data"
    text = path.read_text() if path.exists() else ""
    if text.startswith(JINJA_HEADER):
        text = _render_jinja(text, _meta(seed))
    if text.startswith("#!"):
        return "script", text
    if not text.strip():
        return "none", None
    if not text.lstrip().startswith("#cloud-config"):
        raise ValueError("Unhandled non-multipart (text/x-not-multipart) userdata")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError("cloud-config is not a mapping")
    return "cloud-config", data


def stage_init(seed: Path, inst: Path) -> None:
    meta = _meta(seed)
    host = meta.get("local-hostname") or meta.get("hostname")
    if host:
        Path("/etc/hostname").write_text(f"{host}\n")
        subprocess.run(["hostname", str(host)], check=False, timeout=10)
    kind, data = _user_data(seed)
    raw = seed / "user-data"
    (inst / "user-data.txt").write_text(raw.read_text() if raw.exists() else "")
    if kind == "cloud-config":
        write_files(list(data.get("write_files") or []), deferred=False)
        cmds = data.get("runcmd")
        if cmds:
            (inst / "scripts").mkdir(exist_ok=True)
            (inst / "scripts" / "runcmd").write_text(_runcmd_script(list(cmds)))
    elif kind == "script":
        (inst / "scripts").mkdir(exist_ok=True)
        (inst / "scripts" / "part-001").write_text(data)


def stage_final(seed: Path, inst: Path) -> list[str]:
    errors: list[str] = []
    kind, data = _user_data(seed)
    if kind == "cloud-config":
        write_files(list(data.get("write_files") or []), deferred=True)
    scripts = sorted((inst / "scripts").glob("*")) if (inst / "scripts").exists() else []
    failed = [s.name for s in scripts if _run_script(s) != 0]
    if failed:
        errors.append(
            f"('scripts_user', RuntimeError('Runparts: {len(failed)} failures ({','.join(failed)}) "
            f"in {len(scripts)} attempted commands'))"
        )
    (inst / "boot-finished").write_text(f"{time.time()} - v. {VERSION}\n")
    return errors


def boot() -> int:
    if DISABLED.exists():
        _write_status("disabled", [])
        return 0
    seed = _seed()
    if seed is None:
        _write_status("done", [], None)
        log("no NoCloud seed: nothing to do")
        return 0
    iid = _instance_id(_meta(seed))
    inst = LIB / "instances" / iid
    if (inst / "boot-finished").exists():
        result = LIB / "data" / "result.json"
        prior: dict[str, Any] = json.loads(result.read_text())["v1"] if result.exists() else {}
        _write_status(str(prior.get("status", "done")), list(prior.get("errors", [])))
        return 0
    inst.mkdir(parents=True, exist_ok=True)
    link = LIB / "instance"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(inst)
    errors: list[str] = []
    try:
        _write_status("running", [], "init")
        stage_init(seed, inst)
        _write_status("running", [], "modules-final")
        errors = stage_final(seed, inst)
    except (OSError, ValueError, yaml.YAMLError, subprocess.SubprocessError, KeyError) as exc:
        errors = [f"{type(exc).__name__}: {exc}"]
    _write_status("error" if errors else "done", errors)
    log(f"boot finished: {'error' if errors else 'done'} {errors}")
    return 1 if errors else 0


def _current() -> dict[str, Any]:
    if DISABLED.exists():
        return {"status": "disabled", "errors": []}
    try:
        v1: dict[str, Any] = json.loads((RUN / "status.json").read_text())["v1"]
        return v1
    except (OSError, ValueError, KeyError):
        return {"status": "not started", "errors": []}


def status(argv: list[str]) -> int:
    deadline = time.monotonic() + WAIT_LIMIT_S
    cur = _current()
    while "--wait" in argv and cur["status"] in ("running", "not started") and time.monotonic() < deadline:
        time.sleep(0.25)
        cur = _current()
    if "--format" in argv and "json" in argv:
        print(json.dumps({"status": cur["status"], "errors": cur.get("errors", []), "extended_status": cur["status"]}))
    else:
        print(f"status: {cur['status']}")
        if "--long" in argv:
            print(
                f"extended_status: {cur['status']}\nlast_update: {cur.get('last_update', '')}\n"
                f"detail:\n{cur.get('datasource', '')}\nerrors: {cur.get('errors', [])}"
            )
    return 1 if cur["status"] == "error" else 0


def clean(argv: list[str]) -> int:
    shutil.rmtree(LIB / "instances", ignore_errors=True)
    for p in (LIB / "instance", LIB / "data" / "result.json", RUN / "status.json"):
        if p.is_symlink() or p.exists():
            p.unlink()
    if "--seed" in argv:
        shutil.rmtree(SEED, ignore_errors=True)
    if "--logs" in argv or "-l" in argv:
        for p in (LOG, OUTPUT_LOG):
            p.unlink(missing_ok=True)
    return 0


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ""
    if cmd in ("--version", "-v"):
        print(f"/usr/bin/cloud-init {VERSION}")
        return 0
    if cmd == "status":
        return status(argv[1:])
    if cmd == "clean":
        return clean(argv[1:])
    if cmd in ("boot", "init") or (cmd == "modules" and "final" in argv):
        return boot()
    if cmd == "modules":
        return 0
    print(f"usage: cloud-init [--version] {{init,modules,status,clean}} (simulated); got {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
