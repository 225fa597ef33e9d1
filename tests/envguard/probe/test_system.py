"""OS, CPU, memory, GPUs and CUDA tools.

This machine has no GPU and no CUDA toolkit, so the GPU tests put fake ``nvidia-smi``
and ``nvcc`` shell scripts first on PATH: they mock hardware and tools that cannot
exist here, printing what the real tools print. Everything else runs for real.
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from pathlib import Path

import pytest

from envguard.changes import diff
from envguard.explain import explain
from envguard.model import ProbeIssue, Snapshot, System
from envguard.probe import SnapshotOptions, collect, commands, system

SMI_OUTPUT = "0, NVIDIA H200, 143771, 580.159.04, 9.0\n1, NVIDIA H200, 143771, 580.159.04, 9.0\n"
NVCC_OUTPUT = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
"""


def _tool(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    _tool(tmp_path / "bin", "nvidia-smi", body)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


def _smi(timeout: float = 20) -> commands.CommandResult:
    return commands.run(system.NVIDIA_SMI_QUERY, timeout=timeout)


def _system(smi: commands.CommandResult | None, nvcc: commands.CommandResult | None = None,
            env: dict[str, str] | None = None) -> tuple[System, list[ProbeIssue]]:
    issues: list[ProbeIssue] = []
    return system.collect(env or {}, "glibc 2.36", smi, nvcc, issues), issues


# The fake checks that it was asked the query envguard depends on, like the real tool would.
_CHECK_ARGS = ('[ "$1" = "--query-gpu=index,name,memory.total,driver_version,compute_cap" ] '
               '&& [ "$2" = "--format=csv,noheader,nounits" ] || '
               '{ echo "bad arguments: $*" >&2; exit 2; }\n')


def test_two_fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi(tmp_path, monkeypatch, _CHECK_ARGS + f"printf '{SMI_OUTPUT}'\n")
    sysinfo, issues = _system(_smi())
    assert issues == []
    assert sysinfo.gpu_probe == "ok"
    assert sysinfo.driver_version == "580.159.04"
    assert [(g.index, g.name, g.memory_mib, g.compute_capability) for g in sysinfo.gpus] == [
        (0, "NVIDIA H200", 143771, "9.0"), (1, "NVIDIA H200", 143771, "9.0")]
    assert sysinfo.cuda_driver_version is None  # no libcuda.so.1 on this machine
    # The whole snapshot runs the same query through PATH.
    snapshot = collect(SnapshotOptions(cwd=tmp_path, verify="none"))
    assert snapshot.system.gpu_probe == "ok"
    assert [g.name for g in snapshot.system.gpus] == ["NVIDIA H200", "NVIDIA H200"]


def test_failing_fake_smi_is_an_error_and_an_issue(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi(tmp_path, monkeypatch, "echo \"NVIDIA-SMI has failed because it couldn't "
              "communicate with the NVIDIA driver.\" >&2\nexit 9\n")
    sysinfo, issues = _system(_smi())
    assert sysinfo.gpu_probe == "error"
    assert sysinfo.gpus == [] and sysinfo.driver_version is None
    assert len(issues) == 1 and issues[0].section == "system"
    assert "exit status 9" in issues[0].message
    assert "couldn't communicate with the NVIDIA driver" in issues[0].message


def test_hanging_fake_smi_times_out_quickly(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi(tmp_path, monkeypatch, "exec sleep 60\n")
    started = time.monotonic()
    smi = _smi(timeout=1)
    assert time.monotonic() - started < 10
    assert smi.returncode is None
    sysinfo, issues = _system(smi)
    assert sysinfo.gpu_probe == "error"
    assert [i.section for i in issues] == ["system"]
    assert "timed out after 1 s" in issues[0].message


def test_missing_smi_is_absent_not_an_error(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    smi = _smi()
    assert not smi.ok
    for result in (smi, None):
        sysinfo, issues = _system(result)
        assert (sysinfo.gpu_probe, sysinfo.gpus, issues) == ("absent", [], [])


@pytest.mark.parametrize(("stdout", "expected", "driver"), [
    (SMI_OUTPUT, [(0, "NVIDIA H200", 143771, "9.0"), (1, "NVIDIA H200", 143771, "9.0")],
     "580.159.04"),
    ("0, Tesla K80, 11441, 470.82.01, [N/A]\r\n", [(0, "Tesla K80", 11441, None)], "470.82.01"),
    ("0, NVIDIA A100-SXM4-80GB, [N/A], 535.104.05, 8.0\n",
     [(0, "NVIDIA A100-SXM4-80GB", None, "8.0")], "535.104.05"),
    ("0, NVIDIA GH200 480GB, Grace Hopper, 97871, 570.1, 9.0\n",
     [(0, "NVIDIA GH200 480GB, Grace Hopper", 97871, "9.0")], "570.1"),
    ("No devices were found\n\n", [], None),
    ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n"
     "1, NVIDIA L4, 23034, 550.54.15, 8.9\n", [(1, "NVIDIA L4", 23034, "8.9")], "550.54.15"),
    ("0, short, line\n", [], None),
    ("", [], None),
])
def test_parse_nvidia_smi(stdout: str, expected: list[tuple[int, str, int | None, str | None]],
                          driver: str | None) -> None:
    gpus, found_driver = system.parse_nvidia_smi(stdout)
    assert [(g.index, g.name, g.memory_mib, g.compute_capability) for g in gpus] == expected
    assert found_driver == driver


def test_fake_nvcc_on_path(tmp_path: Path) -> None:
    _tool(tmp_path / "bin", "nvcc", f"cat <<'EOF'\n{NVCC_OUTPUT}EOF\n")
    env = {"PATH": str(tmp_path / "bin")}
    command = system.nvcc_command(env)
    assert command == [str(tmp_path / "bin" / "nvcc"), "--version"]
    sysinfo, issues = _system(None, commands.run(command, timeout=20), env)
    assert issues == []
    assert sysinfo.nvcc == "12.8 (V12.8.93)"


def test_nvcc_found_through_cuda_home_and_failures_recorded(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    cuda = tmp_path / "cuda-12.8"
    _tool(cuda / "bin", "nvcc", "echo 'nvcc fatal : Unknown option' >&2\nexit 1\n")
    assert system.nvcc_command({"PATH": str(tmp_path / "empty")}) is None
    env = {"PATH": str(tmp_path / "empty"), "CUDA_HOME": str(cuda)}
    command = system.nvcc_command(env)
    assert command == [str(cuda / "bin" / "nvcc"), "--version"]
    sysinfo, issues = _system(None, commands.run(command, timeout=20), env)
    assert sysinfo.nvcc is None
    assert sysinfo.cuda_home == str(cuda)
    assert [i.section for i in issues] == ["system"]
    assert "exit status 1" in issues[0].message and "Unknown option" in issues[0].message


def test_host_facts_are_real() -> None:
    physical, memory = system.cpu_and_memory()
    assert physical is not None and physical > 0
    assert memory is not None and memory > 64 << 20
    sysinfo, _ = _system(None)
    assert sysinfo.cpu_logical == os.cpu_count()
    assert sysinfo.cpu_physical == physical <= (os.cpu_count() or physical)
    assert sysinfo.memory_bytes == memory
    assert sysinfo.kernel == platform.release()
    assert sysinfo.machine == platform.machine()
    assert sysinfo.glibc == "glibc 2.36"
    if platform.system() == "Linux":
        assert sysinfo.os.startswith("Linux")
        assert sysinfo.cpu_model


def test_gpu_facts_are_cached_by_driver_state(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi (faked: no GPU here) runs once per driver/GPU state, not per snapshot.

    The /proc/driver/nvidia tree is faked too, in a temp folder with the real layout.
    """
    from envguard.probe.fastpath import gpu as gpu_memo

    proc = tmp_path / "proc"
    (proc / "gpus" / "0000:18:00.0").mkdir(parents=True)
    (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    info = proc / "gpus" / "0000:18:00.0" / "information"
    info.write_text("Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nGPU UUID: \t GPU-1234\n")
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho x >> {calls}\n"
                   "echo '0, NVIDIA H200, 143771, 580.159.04, 9.0'\n")
    smi.chmod(0o755)
    env = {"PATH": str(bin_dir)}
    cache = tmp_path / "cache"

    def ask() -> str:
        result, _cuda = gpu_memo.query(env, 10.0, cache, proc_root=str(proc))
        assert result.ok
        return result.stdout.strip()

    assert ask() == "0, NVIDIA H200, 143771, 580.159.04, 9.0"
    assert ask() == "0, NVIDIA H200, 143771, 580.159.04, 9.0"
    assert calls.read_text().count("x") == 1
    info.write_text(info.read_text().replace("IRQ:   \t\t 42", "IRQ:   \t\t 43"))
    ask()
    assert calls.read_text().count("x") == 1  # an IRQ number is not a new GPU
    (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.1\n")
    ask()
    assert calls.read_text().count("x") == 2  # a driver upgrade asks again
    assert gpu_memo.driver_state(str(tmp_path / "no-driver")) is None


# --- nvidia-smi answers envguard cannot read (fake nvidia-smi scripts on PATH: no GPU here)

GARBAGE = "Welcome to the cluster! Type 'module avail' for software.\n"


def _snapshot_with_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                       body: str | None) -> Snapshot:
    """A whole snapshot with ``body`` as the fake nvidia-smi (None: no nvidia-smi at all)."""
    folder = tmp_path / name
    folder.mkdir()
    if body is not None:
        _tool(folder, "nvidia-smi", body)
    rest = [d for d in os.environ["PATH"].split(os.pathsep) if not d.startswith(str(tmp_path))]
    monkeypatch.setenv("PATH", os.pathsep.join([str(folder), *rest]))
    if body is None:
        assert shutil.which("nvidia-smi") is None
    return collect(SnapshotOptions(cwd=tmp_path, verify="none",
                                   memo_root=tmp_path / f"memo-{name}"))


@pytest.mark.parametrize(("body", "message"), [
    (f"printf \"{GARBAGE}\"\n", "nvidia-smi printed no GPU list envguard can read: Welcome to"),
    ("exit 0\n", "nvidia-smi printed nothing"),
    ("echo 'usage: nvidia-smi [OPTION]'\n", "can read: usage: nvidia-smi [OPTION]"),
])
def test_an_unreadable_answer_is_an_error_not_zero_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, message: str) -> None:
    """The old code called any exit-0 answer gpu_probe 'ok' with no GPUs and no error."""
    snapshot = _snapshot_with_smi(tmp_path, monkeypatch, "garbage", body)
    assert snapshot.system.gpu_probe == "error"
    assert snapshot.system.gpus == [] and snapshot.system.driver_version is None
    found = [e.message for e in snapshot.errors if e.section == "system"]
    assert len(found) == 1 and message in found[0], found


def test_no_devices_is_zero_gpus_and_a_broken_gpu_line_is_recorded(tmp_path: Path) -> None:
    sysinfo, issues = _system(commands.CommandResult((), 0, "No devices were found\n", "", None))
    assert (sysinfo.gpu_probe, sysinfo.gpus, issues) == ("ok", [], [])
    text = ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n"
            "1, NVIDIA L4, 23034, 550.54.15, 8.9\n")
    sysinfo, issues = _system(commands.CommandResult((), 0, text, "", None))
    assert sysinfo.gpu_probe == "ok" and [g.name for g in sysinfo.gpus] == ["NVIDIA L4"]
    assert [i.message for i in issues] == [
        "nvidia-smi: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"]


def _gpu_findings(old: Snapshot, new: Snapshot) -> list[tuple[str, str]]:
    return [(f.severity.value, f.title) for f in explain(old, new)
            if f.rule == "gpu-driver-changed"]


def test_absent_unreadable_and_no_devices_are_not_a_change_of_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the old code a host whose nvidia-smi printed garbage, diffed against a host without
    one, was a CRITICAL 'the GPUs changed'."""
    garbage = _snapshot_with_smi(tmp_path, monkeypatch, "garbage", f"printf \"{GARBAGE}\"\n")
    absent = _snapshot_with_smi(tmp_path, monkeypatch, "absent", None)
    none = _snapshot_with_smi(tmp_path, monkeypatch, "none", "echo 'No devices were found'\n")
    assert (garbage.system.gpu_probe, absent.system.gpu_probe, none.system.gpu_probe) == (
        "error", "absent", "ok")
    for old, new in ((garbage, absent), (absent, garbage), (none, absent), (garbage, none)):
        changes = diff(old, new).find("system")
        assert [c.key for c in changes if c.material and c.key in ("gpus", "gpu_probe")] == []
        assert _gpu_findings(old, new) == []


def test_gpus_against_absent_or_unreadable(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    two = _snapshot_with_smi(tmp_path, monkeypatch, "two", f"printf '{SMI_OUTPUT}'\n")
    absent = _snapshot_with_smi(tmp_path, monkeypatch, "absent", None)
    garbage = _snapshot_with_smi(tmp_path, monkeypatch, "garbage", f"printf \"{GARBAGE}\"\n")
    # Two H200s, then a host without nvidia-smi: the GPUs did change.
    assert _gpu_findings(two, absent) == [("critical", "the GPUs changed")]
    # Two H200s, then an answer that cannot be read: unknown, a warning naming the error.
    (finding,) = [f for f in explain(two, garbage) if f.rule == "gpu-driver-changed"]
    assert finding.severity.value == "warning"
    assert finding.title == "nvidia-smi failed in one snapshot: its GPUs are unknown"
    assert any("Welcome to the cluster" in e for e in finding.evidence), finding.evidence


def test_os_name_reads_os_release_as_platform_does(tmp_path: Path) -> None:
    """``os_name`` reads PRETTY_NAME without importing :mod:`platform`; on this machine it
    says what ``platform.freedesktop_os_release`` says."""
    from envguard.probe.system import os_name

    release = tmp_path / "os-release"
    release.write_text('NAME=x\nPRETTY_NAME="Acme \\"Linux\\" 9 \\$HOME"\nID=acme\n',
                       encoding="utf-8")
    assert os_name("Linux", (str(tmp_path / "missing"), str(release))) == \
        'Linux Acme "Linux" 9 $HOME'
    release.write_text("PRETTY_NAME='Quoted One'\n", encoding="utf-8")
    assert os_name("Linux", (str(release),)) == "Linux Quoted One"
    assert os_name("Linux", (str(tmp_path / "missing"),)) == "Linux"
    assert os_name("Darwin", (str(release),)) == "Darwin"
    try:
        expected = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except (OSError, AttributeError):
        return
    assert os_name("Linux") == f"Linux {expected}".strip()
