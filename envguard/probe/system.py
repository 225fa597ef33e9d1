"""OS, CPU, memory, GPUs and the CUDA driver; ``nvcc`` and CUDA_HOME when present.

GPU facts come from ``nvidia-smi`` (a missing tool records ``gpu_probe='absent'``; one
that fails, hangs or prints nothing this module can read, ``'error'`` and an entry in
``errors``), the CUDA driver API version from ``libcuda`` through ctypes (no context is
created).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping

from envguard.model import Gpu, ProbeIssue, System
from envguard.probe.commands import CommandResult, run

NVIDIA_SMI_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,driver_version,compute_cap",
    "--format=csv,noheader,nounits",
)
NVIDIA_SMI_QUERY_OLD = (
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
)
"""For drivers older than 510, which reject the ``compute_cap`` field."""
_NVCC_RE = re.compile(r"release (\S+?),\s*(V\S+)")


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("model name", "Hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform  # elsewhere than Linux only: it costs 2-3 ms to import

    return platform.processor() or None


def cpu_and_memory() -> tuple[int | None, int | None]:
    """Physical cores and total memory: from /proc and sysconf on Linux, else psutil.

    psutil costs about 40 ms to import, a sixth of a whole snapshot, so it is only
    the fallback where the standard library cannot answer.
    """
    cores: set[tuple[str, str]] = set()
    physical_id = "0"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("physical id"):
                    physical_id = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    cores.add((physical_id, line.split(":", 1)[1].strip()))
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if cores and memory > 0:
            return len(cores), memory
    except (OSError, ValueError, AttributeError):
        pass
    try:
        import psutil

        return psutil.cpu_count(logical=False), int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - psutil can fail in odd containers
        return None, None


def cuda_driver_version() -> str | None:
    """``cuDriverGetVersion`` from libcuda, e.g. ``13.0``; None without a driver."""
    import ctypes  # only on GPU machines: 3 ms of import saved elsewhere

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    value = ctypes.c_int(0)
    try:
        if lib.cuDriverGetVersion(ctypes.byref(value)) != 0:
            return None
    except AttributeError:
        return None
    return f"{value.value // 1000}.{(value.value % 1000) // 10}"


NO_DEVICES = "No devices were found"
"""What nvidia-smi prints on a host with a driver and no GPU."""


def parse_nvidia_smi(stdout: str) -> tuple[list[Gpu], str | None]:
    gpus: list[Gpu] = []
    driver = None
    for line in stdout.strip().splitlines():
        row = _gpu_row(line)
        if row is not None:
            gpus.append(row[0])
            driver = driver or row[1]
    return gpus, driver


def unreadable_lines(stdout: str) -> list[str]:
    """The lines of nvidia-smi's answer that are neither a GPU row nor 'No devices were
    found' (an error message, or output of something else called nvidia-smi)."""
    return [ln.strip() for ln in stdout.splitlines()
            if ln.strip() and ln.strip() != NO_DEVICES and _gpu_row(ln) is None]


def readable(stdout: str) -> bool:
    """Whether the answer says which GPUs there are: at least one GPU row, or only
    'No devices were found'. Empty output says nothing."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    return bool(parse_nvidia_smi(stdout)[0]) or (bool(lines) and set(lines) == {NO_DEVICES})


_CAPABILITY = re.compile(r"^\d{1,2}\.\d$")
"""A compute capability (``8.0``, ``12.0``), never a driver version (``470.82.01``, ``537.58``)."""


def _gpu_row(line: str) -> tuple[Gpu, str | None] | None:
    """``index, name, memory.total, driver_version[, compute_cap]``: the query with
    ``compute_cap``, or the one without it that drivers before 510 answer (its answer is
    replayed from the memo under either query, so the row says which it is). A name may
    hold commas."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 4 or not parts[0].isdigit():
        return None
    cap: str | None = None
    if len(parts) >= 5 and (_CAPABILITY.match(parts[-1]) or _not_available(parts[-1])) \
            and (parts[-3].isdigit() or _not_available(parts[-3])):
        name, (mem, drv, cap) = ", ".join(parts[1:-3]), parts[-3:]
    else:
        name, (mem, drv) = ", ".join(parts[1:-2]), parts[-2:]
    if not name or not (mem.isdigit() or _not_available(mem)):
        return None
    gpu = Gpu(index=int(parts[0]), name=name, memory_mib=int(mem) if mem.isdigit() else None,
              compute_capability=None if cap is None or _not_available(cap) else cap)
    return gpu, None if _not_available(drv) else drv


def _not_available(value: str) -> bool:
    return value in ("", "[N/A]", "N/A", "[Not Supported]")


def nvcc_command(env: Mapping[str, str]) -> list[str] | None:
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return [found, "--version"]
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        return [os.path.join(home, "bin", "nvcc"), "--version"]
    return None


def query_gpus(env: Mapping[str, str], timeout: float) -> CommandResult:
    """``nvidia-smi`` GPU query, retried without ``compute_cap`` for old drivers."""
    result = run(NVIDIA_SMI_QUERY, timeout=timeout, env=env)
    if not result.ok and "compute_cap" in (result.stdout + result.stderr):
        return run(NVIDIA_SMI_QUERY_OLD, timeout=timeout, env=env)
    return result


def collect(
    env: Mapping[str, str],
    glibc: str | None,
    smi: CommandResult | None,
    nvcc: CommandResult | None,
    issues: list[ProbeIssue],
    cuda_driver: str | None = None,
) -> System:
    system_name, node, release, _, machine = _uname()
    gpus: list[Gpu] = []
    driver = None
    if smi is None or (not smi.ok and smi.returncode is None and "not found" in (smi.error or "")):
        gpu_probe = "absent"
    elif smi.ok and readable(smi.stdout):
        gpus, driver = parse_nvidia_smi(smi.stdout)
        gpu_probe = "ok"
        issues.extend(ProbeIssue(section="system", message=f"nvidia-smi: {line[:300]}")
                      for line in unreadable_lines(smi.stdout)[:3])  # a GPU it cannot reach
    elif smi.ok:
        gpu_probe = "error"
        lines = unreadable_lines(smi.stdout)
        issues.append(ProbeIssue(section="system", message=(
            f"nvidia-smi printed no GPU list envguard can read: {lines[0][:300]}" if lines
            else "nvidia-smi printed nothing")))
    else:
        gpu_probe = "error"
        issues.append(ProbeIssue(section="system", message=smi.error or "nvidia-smi failed"))
    nvcc_version = None
    if nvcc is not None:
        if nvcc.ok and (match := _NVCC_RE.search(nvcc.stdout)):
            nvcc_version = f"{match.group(1)} ({match.group(2)})"
        elif not nvcc.ok:
            issues.append(ProbeIssue(section="system", message=nvcc.error or "nvcc failed"))
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if not cuda_home and os.path.isdir("/usr/local/cuda"):
        cuda_home = os.path.realpath("/usr/local/cuda")
    physical, memory = cpu_and_memory()
    return System(
        os=os_name(system_name),
        kernel=release,
        machine=machine,
        hostname=node,
        glibc=glibc,
        cpu_model=cpu_model(),
        cpu_logical=os.cpu_count(),
        cpu_physical=physical,
        memory_bytes=memory,
        gpu_probe=gpu_probe,
        gpus=gpus,
        driver_version=driver,
        cuda_driver_version=cuda_driver if gpu_probe == "ok" else None,
        nvcc=nvcc_version,
        cuda_home=cuda_home,
    )


def _uname() -> tuple[str, str, str, str, str]:
    """(system, node, release, version, machine): ``os.uname()`` where it exists, which
    is what :func:`platform.uname` returns there, without importing :mod:`platform`."""
    if hasattr(os, "uname"):
        u = os.uname()
        return (u.sysname, u.nodename, u.release, u.version, u.machine)
    import platform

    p = platform.uname()
    return (p.system, p.node, p.release, p.version, p.machine)


_OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")
_OS_RELEASE_LINE = re.compile(r"PRETTY_NAME=([\"']?)(.*)\1")


def os_name(system: str, files: tuple[str, ...] = _OS_RELEASE) -> str:
    """``Linux Debian GNU/Linux 12 (bookworm)``; the bare system name elsewhere.

    ``PRETTY_NAME`` of os-release(5), read as :func:`platform.freedesktop_os_release`
    reads it (the first file that exists; quotes removed, backslash escapes undone)."""
    if system != "Linux":
        return system
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read(65536)
        except OSError:
            continue
        pretty = ""
        for line in text.splitlines():
            if match := _OS_RELEASE_LINE.fullmatch(line.strip()):
                pretty = re.sub(r"\\([\\$\"'`])", r"\1", match.group(2))
        return f"{system} {pretty}".strip()
    return system
