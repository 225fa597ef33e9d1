"""Corpus cases about the environment around the packages: two copies of torch, edited
site-packages files, compile caches where they vanish, a launch variable
(docs/CASES.md, cases 18-24)."""

from __future__ import annotations

import getpass
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from envguard.probe.caches import filesystem_of, read_mounts
from tests.cases.conftest import World

DUPLICATE = "duplicate-distribution"
MODIFIED = "installed-files-modified"


def test_case_18_conda_and_pip_torch_in_one_site_packages(world: World) -> None:
    """huggingface/transformers#29022: torch 2.1.0 (conda) and 2.2.0 (pip) both installed;
    transformers asked the metadata for torch's version and got the other one than `import
    torch`. pip could not remove conda's record, so two torch records share site-packages
    (the case writes conda's metadata by hand: conda cannot run here)."""
    env = world.venv(world.shop.torch("2.2.0", "12.1"))
    record = env.site_packages() / "torch-2.1.0.dist-info"
    record.mkdir()
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.1.0\n\n")
    (record / "INSTALLER").write_text("conda\n")
    doctor = world.doctor(env)
    assert doctor.rules == [DUPLICATE]
    assert doctor.document["findings"][0]["severity"] == "critical"  # torch itself
    # Both records sit in one folder. The evidence calls the alphabetically first record
    # (conda's 2.1.0) the one "used", while the files on disk are pip's 2.2.0, which is what
    # `import torch` gets (reported: within one folder no record is "used" over the other).
    assert "torch-2." in doctor.evidence(DUPLICATE)


def test_case_19_pythonpath_shares_a_torch_venv(world: World) -> None:
    """astral-sh/uv#15162: PYTHONPATH pointed every project at one venv's site-packages to
    share its torch 2.8.0; `uv pip install torch` does not look at PYTHONPATH and installed a
    second copy into the project's venv."""
    shared = world.venv(world.shop.torch("2.8.0", "12.8"), name="pytorch")
    project = world.venv(world.shop.torch("2.8.0", "12.8"), name="project")
    doctor = world.doctor(project, variables={"PYTHONPATH": str(shared.site_packages())})
    # the shared torch on PYTHONPATH is imported instead of the project's own copy
    assert doctor.rules == ["module-shadowed", DUPLICATE]
    assert str(project.site_packages()) in doctor.evidence(DUPLICATE)
    assert "'torch' hides torch's torch" in doctor.evidence("module-shadowed")


def _patch(path: Path) -> None:
    """Edit an installed file as an editor does when the file is not hard-linked: a new file."""
    text = path.read_text()
    path.unlink()
    path.write_text(text.replace("return", "if any('::' in arg for arg in args):\n    return", 1))


def test_case_20_patched_pytest_in_the_venv(world: World) -> None:
    """astral-sh/uv#10579: a line added to _pytest/config/__init__.py inside .venv while
    debugging stayed there across uninstall and reinstall."""
    pytest_wheel = world.shop.wheel("pytest", "8.3.4", files={
        "_pytest/__init__.py": "",
        "_pytest/config/__init__.py": "def main(args):\n    return 0\n"})
    env = world.venv(pytest_wheel)
    _patch(env.site_packages() / "_pytest" / "config" / "__init__.py")
    doctor = world.doctor(env)
    assert doctor.rules == [MODIFIED]
    assert "_pytest/config/__init__.py" in doctor.evidence(MODIFIED)


def test_case_21_edit_in_one_venv_reaches_another_through_hardlinks(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """astral-sh/uv#10896: uv hard-links installed files to its cache, so an accidental edit
    in project_a's .venv showed up in project_b. The case uses its own uv cache (and only
    here the hardlink mode), so the edit reaches no other test."""
    monkeypatch.setenv("UV_CACHE_DIR", str(world.tmp / "uv-cache"))
    monkeypatch.setenv("UV_LINK_MODE", "hardlink")
    dep = world.shop.wheel("venv-issue-dep", "0.1.0", files={
        "venv_issue_dep/__init__.py": "def hello() -> str:\n    return 'Hello'\n"})
    project_a = world.venv(dep, name="project_a")
    project_b = world.venv(dep, name="project_b")
    edited = project_a.site_packages() / "venv_issue_dep" / "__init__.py"
    other = project_b.site_packages() / "venv_issue_dep" / "__init__.py"
    if edited.stat().st_ino != other.stat().st_ino:
        pytest.skip("uv could not hard-link here (cache and venvs on different filesystems)")
    with edited.open("a") as fh:  # in place, as the report's editor did
        fh.write("# accidental edit in project_a\n")
    doctor = world.doctor(project_b)
    assert doctor.rules == [MODIFIED]  # project_b was never touched
    # ... and the doctor says why: the file is shared, the cache holds the edit (issue 34)
    assert "3 hard links: uv's cache (" in doctor.evidence(MODIFIED)
    assert doctor.document["findings"][0]["remedy"][0].startswith(
        "uv cache clean -- venv-issue-dep && ")


@pytest.fixture
def fresh_tmp(world: World) -> Path:
    path = world.tmp / "container-tmp"
    path.mkdir()
    return path


def test_case_22_inductor_cache_in_a_fresh_containers_tmp(world: World, fresh_tmp: Path) -> None:
    """sgl-project/sglang#28205: with no cache folder configured, inductor used its default
    under $TMPDIR, which every fresh container or pod starts without: each cold start
    compiled the model again."""
    env = world.venv(world.shop.torch("2.9.1", "12.8"))
    doctor = world.doctor(env, variables={"TORCHINDUCTOR_CACHE_DIR": None,
                                          "TMPDIR": str(fresh_tmp)})
    # Alone, a fresh container looks like a machine that never compiled: the doctor says
    # nothing about a cache nothing shows in use (issue 33). The gate's lock, whose cache
    # policy asks for a warm cache, is what speaks for this deployment.
    assert doctor.rules == []


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    """A folder on tmpfs, as /tmp is on Fedora: /dev/shm where it is tmpfs."""
    path = Path("/dev/shm") / f"envguard-case-{uuid.uuid4().hex[:8]}"
    if not Path("/dev/shm").is_dir() or filesystem_of("/dev/shm", read_mounts()) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_case_23_inductor_cache_on_a_tmpfs_tmp(world: World, tmpfs_dir: Path) -> None:
    """pytorch/pytorch#121122: inductor's default cache is under tempfile.gettempdir(); where
    /tmp is tmpfs (Fedora's default) it lives in RAM and is gone after a reboot."""
    env = world.venv(world.shop.torch("2.2.1", "12.1"))
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    cache = tmpfs_dir / f"torchinductor_{user}" / "fxgraph"
    cache.mkdir(parents=True)
    (cache / "entry").write_text("compiled\n")
    doctor = world.doctor(env, variables={"TORCHINDUCTOR_CACHE_DIR": None,
                                          "TMPDIR": str(tmpfs_dir)})
    assert doctor.rules == ["compile-cache-volatile"]
    assert doctor.returncode == 0  # a note, not a failure


def test_case_24_cuda_visible_devices_narrowed_under_torchrun(world: World) -> None:
    """wenwenyu/PICK-pytorch#14: the README's launch with CUDA_VISIBLE_DEVICES=1,2 and
    --nproc_per_node=4 failed with "invalid device ordinal": ranks 2 and 3 had no GPU. The
    snapshots are of the README's environment without and with the variable (torch's version
    is not in the report)."""
    env = world.venv(world.shop.torch("1.6.0", "10.2"))
    good = world.snapshot(env, "good")
    bad = world.snapshot(env, "bad", variables={"CUDA_VISIBLE_DEVICES": "1,2"})
    assert world.doctor(env, variables={"CUDA_VISIBLE_DEVICES": "1,2"}).rules == []
    diff = world.diff(good, bad, "RuntimeError: cuda runtime error (101) : invalid device "
                                 "ordinal at /pytorch/torch/csrc/cuda/Module.cpp:59")
    assert diff.rules == ["env-var-changed"]
    assert "CUDA_VISIBLE_DEVICES set to 1,2" in diff.evidence("env-var-changed")
