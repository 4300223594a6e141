"""``/proc/meminfo`` and ``/proc/cpuinfo`` as a GEX131 would show them, bound over the guest's own.

Why: a simulated host runs on the test machine's kernel, so its procfs describes the test machine (a
few cores, a few GB). The controller inspects a server with ``nproc`` and ``grep MemTotal /proc/meminfo``
(``ParamikoShell.cpu_memory``) and records what it finds; Ansible's facts read the same files. So every
boot (rescue and installed OS) gets these two files, generated from the host's hardware description,
bound read-only over the real ones (``BootPlan.ro_binds``); ``nproc`` is a shim reading the same
description (``host_shims.hwinfo``). They are written per boot: the memory a machine has changes only
across a power cycle. The values besides the sizes are those of an idle, freshly booted server: plausible,
static, and not to be used for anything but display.
"""

from __future__ import annotations

from pathlib import Path

from capi_gpu_sim.hosts import hardware

MEMINFO, CPUINFO = "/proc/meminfo", "/proc/cpuinfo"
KIB_PER_GIB = 1024 * 1024
# Sapphire Rapids (family 6 model 143), as a Xeon Gold 5412U reports itself under a 6.1 kernel.
CPU_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse sse2 "
    "ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl xtopology "
    "nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg "
    "fma cx16 xtpr pdcm pcid dca sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand "
    "lahf_lm abm 3dnowprefetch cpuid_fault epb cat_l3 cat_l2 cdp_l3 invpcid_single intel_ppin cdp_l2 ssbd mba "
    "ibrs ibpb stibp ibrs_enhanced tpr_shadow flexpriority ept vpid ept_ad fsgsbase tsc_adjust bmi1 avx2 smep "
    "bmi2 erms invpcid cqm rdt_a avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb intel_pt avx512cd "
    "sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local "
    "split_lock_detect avx_vnni avx512_bf16 wbnoinvd dtherm ida arat pln pts hfi vnmi avx512vbmi umip pku ospke "
    "waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg tme avx512_vpopcntdq la57 rdpid "
    "bus_lock_detect cldemote movdiri movdir64b enqcmd fsrm md_clear serialize tsxldtrk pconfig arch_lbr ibt "
    "amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities"
)
CPU_BUGS = "spectre_v1 spectre_v2 spec_store_bypass swapgs eibrs_pbrsb bhi"


def _line(key: str, value: int, unit: bool = True) -> str:
    """The kernel's ``%-16s%8lu kB`` layout (``show_val_kb``); huge-page counts have no unit."""
    return f"{key + ':':<16}{value:>8}{' kB' if unit else ''}\n"


def meminfo(hw: hardware.Hardware) -> str:
    total = hw.mem_total_kib
    buffers, cached, shmem, anon = 48_212, 1_310_448, 10_852, 402_116
    s_reclaimable, s_unreclaim, kernel_stack, page_tables, percpu = 288_300, 324_180, 23_456, 9_812, 74_496
    used = buffers + cached + anon + s_reclaimable + s_unreclaim + kernel_stack + page_tables + percpu
    free = total - used
    active_file = buffers + cached * 2 // 5
    installed_kib = hw.memory_bytes // 1024
    direct_4k, direct_2m = 741_236, 18_968_576
    direct_1g = (installed_kib - direct_4k - direct_2m) // KIB_PER_GIB * KIB_PER_GIB
    rows: list[tuple[str, int, bool]] = [
        ("MemTotal", total, True),
        ("MemFree", free, True),
        ("MemAvailable", free + buffers + cached - shmem + s_reclaimable // 2, True),
        ("Buffers", buffers, True),
        ("Cached", cached, True),
        ("SwapCached", 0, True),
        ("Active", active_file + 31_204, True),
        ("Inactive", buffers + cached - shmem - active_file + anon + shmem - 31_204, True),
        ("Active(anon)", 31_204, True),
        ("Inactive(anon)", anon + shmem - 31_204, True),
        ("Active(file)", active_file, True),
        ("Inactive(file)", buffers + cached - shmem - active_file, True),
        ("Unevictable", 0, True),
        ("Mlocked", 0, True),
        ("SwapTotal", 0, True),
        ("SwapFree", 0, True),
        ("Zswap", 0, True),
        ("Zswapped", 0, True),
        ("Dirty", 36, True),
        ("Writeback", 0, True),
        ("AnonPages", anon, True),
        ("Mapped", 198_644, True),
        ("Shmem", shmem, True),
        ("KReclaimable", s_reclaimable, True),
        ("Slab", s_reclaimable + s_unreclaim, True),
        ("SReclaimable", s_reclaimable, True),
        ("SUnreclaim", s_unreclaim, True),
        ("KernelStack", kernel_stack, True),
        ("PageTables", page_tables, True),
        ("SecPageTables", 0, True),
        ("NFS_Unstable", 0, True),
        ("Bounce", 0, True),
        ("WritebackTmp", 0, True),
        ("CommitLimit", total // 2, True),
        ("Committed_AS", 1_912_604, True),
        ("VmallocTotal", 34_359_738_367, True),
        ("VmallocUsed", 214_392, True),
        ("VmallocChunk", 0, True),
        ("Percpu", percpu, True),
        ("HardwareCorrupted", 0, True),
        ("AnonHugePages", 0, True),
        ("ShmemHugePages", 0, True),
        ("ShmemPmdMapped", 0, True),
        ("FileHugePages", 0, True),
        ("FilePmdMapped", 0, True),
        ("HugePages_Total", 0, False),
        ("HugePages_Free", 0, False),
        ("HugePages_Rsvd", 0, False),
        ("HugePages_Surp", 0, False),
        ("Hugepagesize", 2048, True),
        ("Hugetlb", 0, True),
        ("DirectMap4k", direct_4k, True),
        ("DirectMap2M", direct_2m, True),
        ("DirectMap1G", direct_1g, True),
    ]
    return "".join(_line(key, value, unit) for key, value, unit in rows)


def cpuinfo(hw: hardware.Hardware) -> str:
    """One socket; processors 0..cores-1 are the cores' first threads, the rest their siblings (as Linux
    enumerates a hyper-threaded Xeon)."""
    blocks = []
    for cpu in range(hw.cpu_threads):
        core = cpu % hw.cpu_cores
        apic = 2 * core + cpu // hw.cpu_cores
        fields = [
            ("processor", str(cpu)),
            ("vendor_id", "GenuineIntel"),
            ("cpu family", "6"),
            ("model", "143"),
            ("model name", hw.cpu_model),
            ("stepping", "8"),
            ("microcode", "0x2b000603"),
            ("cpu MHz", f"{hw.cpu_mhz:.3f}"),
            ("cache size", "46080 KB"),
            ("physical id", "0"),
            ("siblings", str(hw.cpu_threads)),
            ("core id", str(core)),
            ("cpu cores", str(hw.cpu_cores)),
            ("apicid", str(apic)),
            ("initial apicid", str(apic)),
            ("fpu", "yes"),
            ("fpu_exception", "yes"),
            ("cpuid level", "32"),
            ("wp", "yes"),
            ("flags", CPU_FLAGS),
            ("bugs", CPU_BUGS),
            ("bogomips", f"{hw.cpu_mhz * 2:.2f}"),
            ("clflush size", "64"),
            ("cache_alignment", "64"),
            ("address sizes", "46 bits physical, 57 bits virtual"),
            ("power management", ""),
        ]
        blocks.append("".join(_cpu_line(k, v) for k, v in fields))
    return "\n".join(blocks) + "\n"


def _cpu_line(key: str, value: str) -> str:
    """``show_cpuinfo``'s layout: keys tab-padded to the second tab stop, an empty value without a space."""
    if not value:
        return f"{key}:\n"
    tabs = "\t\t" if len(key) < 8 else "\t"
    return f"{key}{tabs}: {value}\n"


def write(boot_dir: Path, hw: hardware.Hardware) -> tuple[tuple[Path, str], ...]:
    """Write this boot's files; returns the (file, guest path) binds for the boot plan."""
    mem, cpu = boot_dir / "meminfo", boot_dir / "cpuinfo"
    mem.write_text(meminfo(hw))
    cpu.write_text(cpuinfo(hw))
    for path in (mem, cpu):
        path.chmod(0o444)
    return ((mem, MEMINFO), (cpu, CPUINFO))
