"""What a simulated GEX131 reports about its CPU and memory: /proc/meminfo (the kernel's layout, MemTotal of
256 GB installed, the figure ParamikoShell.cpu_memory parses), /proc/cpuinfo (one Xeon Gold 5412U socket,
24 cores, 48 threads), and the nproc shim (the hardware's threads, --all, --ignore, OMP_NUM_THREADS)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from capi_gpu_sim import host_shims
from capi_gpu_sim.hosts import hardware, procfs

HWINFO = Path(host_shims.__file__).with_name("hwinfo.py")
GEX131 = hardware.gex131(2_000_001)


def test_meminfo_has_the_kernel_layout_and_the_gex131_total() -> None:
    text = procfs.meminfo(GEX131)
    rows = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(\S+):\s+(\d+)( kB)?", line)
        assert m is not None, line
        rows[m.group(1)] = m.group(2)
    assert text.startswith("MemTotal:       263856952 kB\n")
    total = int(rows["MemTotal"])
    assert total // 1024 // 1024 == 251, "256 GB installed shows as 251 GiB, as on a real server"
    assert 0 < int(rows["MemFree"]) < int(rows["MemAvailable"]) < total
    assert int(rows["DirectMap4k"]) + int(rows["DirectMap2M"]) + int(rows["DirectMap1G"]) <= GEX131.memory_bytes // 1024
    assert "HugePages_Total:       0\n" in text
    # What ParamikoShell.cpu_memory does with `grep MemTotal /proc/meminfo`:
    line = next(raw for raw in text.splitlines() if raw.startswith("MemTotal"))
    assert int(line.split()[1]) // 1024 == 257_672


def test_cpuinfo_is_one_socket_of_24_cores_with_two_threads_each() -> None:
    blocks = [b for b in procfs.cpuinfo(GEX131).split("\n\n") if b.strip()]
    assert len(blocks) == 48
    fields = [
        dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in b.splitlines())) for b in blocks
    ]
    assert {f["model name"] for f in fields} == {"Intel(R) Xeon(R) Gold 5412U"}
    assert {(f["siblings"], f["cpu cores"], f["physical id"]) for f in fields} == {("48", "24", "0")}
    assert sorted(int(f["core id"]) for f in fields) == sorted(list(range(24)) * 2)
    assert len({f["apicid"] for f in fields}) == 48
    assert blocks[0].splitlines()[3] == "model\t\t: 143"


def test_proc_files_follow_the_hardware_description(tmp_path: Path) -> None:
    small = dataclasses.replace(GEX131, cpu_cores=4, cpu_threads=8, mem_total_kib=16_000_000, memory_bytes=16 << 30)
    binds = procfs.write(tmp_path, small)
    assert [guest for _, guest in binds] == ["/proc/meminfo", "/proc/cpuinfo"]
    assert binds[0][0].read_text().startswith("MemTotal:       16000000 kB\n")
    assert binds[1][0].read_text().count("processor\t: ") == 8


def _nproc(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    link = tmp_path / "nproc"
    if not link.exists():
        link.symlink_to(HWINFO)
    hardware.write(tmp_path / "hw", GEX131)
    environ = {"PATH": os.environ["PATH"], "SIM_HW_PATH": str(tmp_path / "hw" / hardware.HW_FILE), **env}
    return subprocess.run(
        [sys.executable, str(link), *args], capture_output=True, text=True, env=environ, timeout=30, check=False
    )


@pytest.mark.parametrize(
    ("args", "env", "out"),
    [
        ((), {}, "48"),
        (("--all",), {}, "48"),
        (("--ignore=2",), {}, "46"),
        (("--ignore", "100"), {}, "1"),
        ((), {"OMP_NUM_THREADS": "6,2"}, "6"),
        ((), {"OMP_NUM_THREADS": "64", "OMP_THREAD_LIMIT": "12"}, "12"),
        (("--all",), {"OMP_NUM_THREADS": "6"}, "48"),
    ],
)
def test_nproc_counts_the_hardware_threads(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], out: str
) -> None:
    res = _nproc(tmp_path, *args, **env)
    assert (res.returncode, res.stdout.strip()) == (0, out), res.stderr


def test_nproc_refuses_bad_arguments_like_coreutils(tmp_path: Path) -> None:
    bad = _nproc(tmp_path, "--ignore=x")
    assert (bad.returncode, bad.stderr.strip()) == (1, "nproc: invalid number: 'x'")
    assert _nproc(tmp_path, "-z").returncode == 1
    assert _nproc(tmp_path, "4").stderr.strip() == "nproc: extra operand '4'"
