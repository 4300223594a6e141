"""The pod runner's container stand-in mounts volumes over the machine's paths in a mount namespace of its
own: an emptyDir on /tmp must not hide the image's files when they live under /tmp (CI clones the checkout
there; the manager's venv went missing and every replica crash-looped), and a volume under /tmp stays
visible too. Runs the real ``wrapped`` argv (unshare + mount) as the runner does."""

from __future__ import annotations

import subprocess
from pathlib import Path

from capi_gpu_sim.hosts import cgroups
from capi_gpu_sim.pods.container import Launch, wrapped


def test_an_emptydir_over_tmp_keeps_the_image_and_its_volumes_visible(tmp_path: Path) -> None:
    image = tmp_path / "checkout"  # under /tmp, as a CI clone is
    (image / "bin").mkdir(parents=True)
    (image / "bin" / "tool").write_text("from the image\n")
    run = Path("/run/capigpu-pods/test-mounts")
    empty, secret = run / "empty", run / "secret"
    for d in (empty, secret):
        d.mkdir(parents=True, exist_ok=True)
    (secret / "tls.crt").write_text("cert\n")
    launch = Launch(
        argv=["/bin/sh", "-c", f"cat {image}/bin/tool /tmp/certs/tls.crt && ls /tmp"],
        env={"PATH": "/usr/bin:/bin"},
        binds=[(empty, "/tmp"), (secret, "/tmp/certs")],
        cwd=Path("/"),
        log_path=tmp_path / "log",
        cgroup="f0-test-mounts",
        keep=[image],
        stage=run / "stage",
    )
    group = cgroups.ensure(launch.cgroup)
    try:
        done = subprocess.run(
            wrapped(launch),
            env={**launch.env, "CG": str(group)},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        cgroups.destroy(launch.cgroup)
        subprocess.run(["rm", "-rf", str(run)], check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["from the image", "cert"], done.stdout
    # The machine's /tmp is covered: only the volume under it and the way down to the kept image remain.
    top = image.relative_to("/tmp").parts[0]
    assert set(lines[2:]) == {"certs", top}, done.stdout
