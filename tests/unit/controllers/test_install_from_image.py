"""The Install step with spec.image: the archive is staged and its sha256 checked in rescue before anything
is written; a wrong checksum, or a manifest that does not fit with fallback Fail, is a permanent failure
naming every reason and installimage never starts; a fit gives installimage ``IMAGE <staged path>``;
fallback FullInstall gives it the plain image. The rescue scripts themselves run here under bash against a
temp dir: a path source is linked, a restage happens only for another source, a swapped file is caught by
the checksum, and the manifest is found with or without ``./`` in the member name, gzip and zstd alike; an
https source is downloaded once from a loopback server (its own CA), and a redirect, a 404 and plain http
all fail, whatever a .curlrc says."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import shutil
import ssl
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from capi_gpu.api.host import DiskInfo, ErrorType, HardwareDetails, HetznerGPUHost, HetznerGPUHostSpec
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.controllers import host_actions
from capi_gpu.controllers.host_context import Consumer, HostEnv
from capi_gpu.provisioning import image_manifest, node_image
from capi_gpu.provisioning.hostkeys import HostKeyPair
from capi_gpu.provisioning.model import Outcome
from capi_gpu_sim.hosts import hardware

SHA = "ab" * 32
URL = "https://images.example.com/gpu/rtx-pro-6000-580.tar.zst"
MANIFEST = {
    "formatVersion": 1,
    "gpuModel": "rtx-pro-6000",
    "driverVersion": "580.95.05",
    "kernelRelease": "6.8.0-87-generic",
    "driverKernel": "6.8.0-87-generic",
    "kubernetesVersion": "v1.36.3",
    "source": {"serverNumber": 7, "name": "gex131-7"},
    "createdAt": "2026-12-07T12:00:00Z",
}


class Shell:
    """What rescue answers: the staged file's sha256 and the archive's manifest member."""

    def __init__(self, sha: str, manifest: str | None) -> None:
        self.sha, self.manifest = sha, manifest
        self.calls: list[str] = []
        self.autosetup: str | None = None

    def stage_image(self, source: str, dest: str) -> str:
        self.calls.append(f"stage {source} -> {dest}")
        return self.sha

    def image_manifest(self, dest: str) -> str | None:
        self.calls.append(f"manifest {dest}")
        return self.manifest

    def uefi(self) -> bool:
        return False

    def start_installimage(self, autosetup: str, post_install: str | None = None) -> None:
        self.calls.append("installimage")
        self.autosetup = autosetup


def _env(image: dict[str, Any] | None, gpu_model: str = "rtx-pro-6000") -> HostEnv:
    spec: dict[str, Any] = {"gpu": {"model": gpu_model}} | ({"image": image} if image else {})
    machine = HetznerGPUMachine.model_validate({"metadata": {"name": "m"}, "spec": spec})
    consumer = Consumer(machine, "m", machine.spec.install_image, machine.spec.gpu, "v1.36.3", None, None)
    return HostEnv(None, "", "ssh-ed25519 AAAA x", HostKeyPair("priv", "ssh-ed25519 AAAA host"), consumer)  # type: ignore[arg-type]


def _host() -> HetznerGPUHost:
    hw = hardware.gex131(7)
    host = HetznerGPUHost(metadata={"name": "bm-gpu-7"}, spec=HetznerGPUHostSpec(server_number=7))
    host.status.hardware = HardwareDetails(disks=[DiskInfo(wwn=d.wwn, size_bytes=d.size) for d in hw.disks])
    return host


def _image_line(autosetup: str | None) -> str:
    assert autosetup is not None
    return next(line for line in autosetup.splitlines() if line.startswith("IMAGE "))


PLAIN = "IMAGE /root/.oldroot/nfs/images/Ubuntu-2404-noble-amd64-base.tar.zst"
STAGED = f"IMAGE {node_image.STAGE_DIR}/capi-gpu-node-amd64-image.tar.zst"


@pytest.mark.parametrize(
    ("sha", "manifest", "fallback", "gpu", "error", "names", "image_line"),
    [
        (SHA, json.dumps(MANIFEST), "Fail", "rtx-pro-6000", None, "installing from the node image", STAGED),
        ("cd" * 32, json.dumps(MANIFEST), "Fail", "rtx-pro-6000", ErrorType.IMAGE_CHECKSUM_MISMATCH, "cd" * 32, None),
        # a wrong checksum fails closed whatever the fallback: the archive is not the one the spec names
        ("cd" * 32, json.dumps(MANIFEST), "FullInstall", "rtx-pro-6000", ErrorType.IMAGE_CHECKSUM_MISMATCH, SHA, None),
        (SHA, json.dumps(MANIFEST), "Fail", "h100-80gb", ErrorType.IMAGE_MISMATCH, "ImageGPUModelMismatch", None),
        (SHA, json.dumps(MANIFEST), "FullInstall", "h100-80gb", None, "ImageGPUModelMismatch", PLAIN),
        (SHA, None, "Fail", "rtx-pro-6000", ErrorType.IMAGE_MISMATCH, "ImageManifestUnsupported", None),
        (SHA, None, "FullInstall", "rtx-pro-6000", None, "not a capi-gpu node image", PLAIN),
        (
            SHA,
            json.dumps(MANIFEST | {"formatVersion": 2}),
            "Fail",
            "rtx-pro-6000",
            ErrorType.IMAGE_MISMATCH,
            "format 2",
            None,
        ),
    ],
)
def test_the_install_step_decides_from_what_rescue_found(
    sha: str,
    manifest: str | None,
    fallback: str,
    gpu: str,
    error: ErrorType | None,
    names: str,
    image_line: str | None,
) -> None:
    shell = Shell(sha, manifest)
    env = _env({"url": URL, "sha256": SHA, "fallback": fallback}, gpu)
    result = host_actions._install(_host(), env, shell)  # type: ignore[arg-type]
    assert shell.calls[0] == f"stage {URL} -> {node_image.STAGE_DIR}/capi-gpu-node-amd64-image.tar.zst"
    assert names in result.message
    if error is not None:
        assert (result.outcome, result.error_type, result.permanent) == (Outcome.FAILED, error, True)
        assert "installimage" not in shell.calls and "nothing was written" in result.message
        if error is ErrorType.IMAGE_CHECKSUM_MISMATCH:
            assert shell.calls == [shell.calls[0]], "the manifest of a wrong archive is not even read"
    else:
        assert result.outcome is Outcome.OK and shell.calls[-1] == "installimage"
        assert _image_line(shell.autosetup) == image_line


def test_without_spec_image_nothing_is_staged() -> None:
    shell = Shell(SHA, None)
    result = host_actions._install(_host(), _env(None), shell)  # type: ignore[arg-type]
    assert result.outcome is Outcome.OK and shell.calls == ["installimage"]
    assert _image_line(shell.autosetup) == PLAIN


# --- the rescue scripts, under bash ---------------------------------------------------------------------


def _archive(path: Path, members: dict[str, bytes], compress: str) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    if compress == "gz":
        import gzip

        raw = gzip.compress(raw)
    elif compress == "zst":
        raw = subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True, check=True).stdout
    path.write_bytes(raw)
    return path


def _bash(script: str, stage: Path) -> subprocess.CompletedProcess[str]:
    local = script.replace(node_image.STAGE_DIR, str(stage))
    return subprocess.run(["bash", "-c", local], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("compress", "prefix"), [("gz", ""), ("gz", "./"), ("zst", "./")])
def test_the_rescue_scripts_stage_a_path_and_read_its_manifest(tmp_path: Path, compress: str, prefix: str) -> None:
    if compress == "zst" and shutil.which("zstd") is None:
        pytest.fail("zstd is part of the test tools (the rescue system has it for .tar.zst images)")
    stage = tmp_path / "stage"
    stage.mkdir()
    text = json.dumps(MANIFEST).encode()
    suffix = ".tar.gz" if compress == "gz" else ".tar.zst"
    members = {f"{prefix}etc/hostname": b"x\n", f"{prefix}{image_manifest.MANIFEST_PATH}": text}
    src = _archive(tmp_path / f"node{suffix}", members, compress)
    dest = str(stage / f"capi-gpu-node-amd64-image{suffix}")
    (stage / "source.want").write_text(str(src))
    staged = _bash(node_image.stage_script(dest), stage)
    assert staged.returncode == 0, staged.stderr
    assert staged.stdout.split()[0] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert Path(dest).is_symlink() and (stage / "source").read_text() == str(src)
    read = _bash(node_image.member_script(dest), stage)
    assert (read.returncode, read.stdout) == (0, text.decode())
    # The same source again: not restaged; a swapped file under it: the checksum says so.
    src.write_bytes(b"swapped")
    again = _bash(node_image.stage_script(dest), stage)
    assert again.stdout.split()[0] == hashlib.sha256(b"swapped").hexdigest()
    # A plain archive without the member: exit 4.
    _archive(src, {"etc/hostname": b"x\n"}, compress)
    assert _bash(node_image.member_script(dest), stage).returncode == 4


def test_another_source_is_restaged_and_a_missing_one_fails(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    a = _archive(tmp_path / "a.tar", {"a": b"a"}, "")
    b = _archive(tmp_path / "b.tar", {"b": b"b"}, "")
    dest = str(stage / "capi-gpu-node-amd64-image.tar")
    for src in (a, b):
        (stage / "source.want").write_text(str(src))
        out = _bash(node_image.stage_script(dest), stage)
        assert out.stdout.split()[0] == hashlib.sha256(src.read_bytes()).hexdigest()
        assert Path(dest).resolve() == src
    (stage / "source.want").write_text(str(tmp_path / "gone.tar"))
    assert _bash(node_image.stage_script(dest), stage).returncode != 0


# --- the https branch, against a loopback server with its own CA ---------------------------------------


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class _Files(http.server.BaseHTTPRequestHandler):
    files: ClassVar[dict[str, bytes]] = {}
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        if self.path == "/moved.tar":
            self.send_response(302)
            self.send_header("Location", "/node.tar")
            self.end_headers()
            return
        data = self.files.get(self.path)
        self.send_response(200 if data is not None else 404)
        self.end_headers()
        self.wfile.write(data or b"")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def https(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    cert, key = _self_signed(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Files.hits.clear()
    yield server.server_address[1], cert
    server.shutdown()
    server.server_close()


def test_an_https_source_is_downloaded_once_and_nothing_but_https_is_fetched(
    tmp_path: Path, https: tuple[int, Path]
) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is part of the test tools (the rescue system has it)")
    port, ca = https
    archive = b"node image bytes"
    _Files.files = {"/node.tar": archive}
    stage = tmp_path / "stage"
    stage.mkdir()
    dest = str(stage / "capi-gpu-node-amd64-image.tar")

    def run(url: str) -> subprocess.CompletedProcess[str]:
        (stage / "source.want").write_text(url)
        local = node_image.stage_script(dest).replace(node_image.STAGE_DIR, str(stage))
        env = {"PATH": "/usr/bin:/bin", "CURL_CA_BUNDLE": str(ca), "HOME": str(tmp_path)}
        return subprocess.run(["bash", "-c", local], capture_output=True, text=True, timeout=60, env=env, check=False)

    url = f"https://localhost:{port}/node.tar"
    for _ in range(2):  # the second time the staged file is the recorded source's: no download
        out = run(url)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[0] == hashlib.sha256(archive).hexdigest()
    assert _Files.hits == ["/node.tar"]
    (tmp_path / ".curlrc").write_text("insecure\nlocation\n")  # -q: a .curlrc adds nothing
    assert run(f"https://localhost:{port}/moved.tar").returncode != 0, "a redirect is not followed"
    assert run(f"https://localhost:{port}/gone.tar").returncode != 0, "a 404 is a failure, not an empty image"
    assert not Path(dest).exists() and not (stage / "source").exists()
    assert run(f"http://localhost:{port}/node.tar").returncode != 0, "plain http is refused by curl itself"
    assert _Files.hits == ["/node.tar", "/moved.tar", "/gone.tar"]
