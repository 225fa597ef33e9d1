"""The scratch copy's interpreter facts (envguard.probe.fastpath.facts.moved): taken from the
venv's own when the copy holds the same ``pyvenv.cfg`` and ``.pth`` files, probed for real
when the installer wrote a ``.pth`` file. Real venvs and uv, real probes; a spy counts the
interpreters started (nothing is mocked)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from envguard.install.scratch import scratch_copy
from envguard.probe import interpreter
from envguard.probe.fastpath import facts
from tests.envguard.install.test_install import envguard
from tests.envguard.install.test_transplant import _plan, base, wheels
from tests.wheelfactory import VenvFactory, build_wheel, run_checked


@pytest.fixture(autouse=True)
def no_state_leak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVGUARD_CACHE_DIR", str(tmp_path / "state"))


def _with_pth_hack(venvs: VenvFactory, *, inner_path: bool = False) -> Path:
    """``base``'s venv with a ``.pth`` that imports a module, as setuptools' does (and with
    ``inner_path`` one that puts a folder of site-packages on ``sys.path``)."""
    wheels(venvs.wheels)
    files = {"hack_mod.py": "HACKED = True\n", "hack-precedence.pth": "import hack_mod\n"}
    if inner_path:
        files |= {"hack-path.pth": "hack_extra\n", "hack_extra/mod.py": ""}
    build_wheel(venvs.wheels, "hack", "1.0", files)
    env = base(venvs)
    run_checked([venvs.uv, "pip", "install", "--quiet", "--python", str(env / "bin" / "python"),
                 "--no-index", "--find-links", str(venvs.wheels), "hack"], env=venvs._env())
    return env


def test_a_folder_the_copy_lacks_is_probed_for_real(venvs: VenvFactory) -> None:
    """A ``.pth`` line naming a folder of site-packages: the metadata copy lacks that
    folder, so ``site`` adds it in the venv only, and the copy is probed."""
    env = _with_pth_hack(venvs, inner_path=True)
    ours = interpreter.probe_python(str(env / "bin" / "python")).facts
    assert any(p.endswith("hack_extra") for p in ours["sys_path"])
    with scratch_copy(env, site_packages=ours["site_packages"]) as (folder, _, _):
        probed = interpreter.probe_python(str(folder / "bin" / "python")).facts
        assert not any(p.endswith("hack_extra") for p in probed["sys_path"])
        assert facts.moved(ours, str(folder)) is None


def test_the_moved_facts_are_what_a_probe_of_the_copy_prints(venvs: VenvFactory) -> None:
    env = _with_pth_hack(venvs)
    ours = interpreter.probe_python(str(env / "bin" / "python")).facts
    with scratch_copy(env, site_packages=ours["site_packages"]) as (folder, _, _):
        copy_python = str(folder / "bin" / "python")
        probed = interpreter.probe_python(copy_python).facts
        assert probed["prefix"] == str(folder)
        assert facts.moved(ours, str(folder)) == probed
        # a .pth file the installer adds (or one it rewrites) is probed for real
        site = Path(probed["site_packages"][0])
        (site / "new.pth").write_text("/nowhere\n")
        assert facts.moved(ours, str(folder)) is None
        (site / "new.pth").unlink()
        os.unlink(site / "hack-precedence.pth")
        (site / "hack-precedence.pth").write_text("import hack_mod  # edited\n")
        assert facts.moved(ours, str(folder)) is None
        (site / "hack-precedence.pth").write_text("import hack_mod\n")  # same bytes: moved
        assert facts.moved(ours, str(folder)) == probed


def _count_probes(monkeypatch: pytest.MonkeyPatch, under: Path) -> list[str]:
    started: list[str] = []
    real = interpreter.start

    def spy(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        if str(argv[0]).startswith(str(under)):
            started.append(str(argv[0]))
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(interpreter, "start", spy)
    return started


def test_a_prediction_without_a_new_pth_starts_no_interpreter_in_the_copy(
        venvs: VenvFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _with_pth_hack(venvs)
    copies = _count_probes(monkeypatch, env.parent / f".{env.name}.envguard-scratch")
    plan, _ = _plan(env, "install", "tool==2.0", wheels_at=venvs.wheels, cwd=tmp_path)
    assert copies == []
    assert plan.predicted.package("tool").version == "2.0"  # type: ignore[union-attr]
    # the copy's paths were moved back to the venv's, as from a probe
    assert plan.predicted.package("helper").location.startswith(  # type: ignore[union-attr]
        str(env))


def test_a_pth_the_install_adds_is_followed_by_a_real_probe(
        venvs: VenvFactory, tmp_path: Path) -> None:
    """A wheel whose ``.pth`` puts a folder outside the venv on ``sys.path``, where another
    distribution lives: only a probe of the copy sees that folder, so only then is the
    distribution in the prediction (and in the venv afterwards)."""
    outside = tmp_path / "outside"
    meta = outside / "other-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: other\nVersion: 1.0\n")
    (meta / "RECORD").write_text("other-1.0.dist-info/METADATA,,\n")
    wheels(venvs.wheels)
    build_wheel(venvs.wheels, "pather", "1.0", {"pather.pth": f"{outside}\n",
                                                "pather_mod.py": ""})
    env = base(venvs)
    cwd = tmp_path / "work"
    cwd.mkdir()
    proc = envguard("install", "--yes", "--format", "json", "--python", str(env), "--", "uv",
                    "pip", "install", "--no-index", "--find-links", str(venvs.wheels), "pather",
                    cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    added = {p["name"] for p in report["packages"]}
    assert {"pather", "other"} <= added, report["packages"]
    assert report["applied"]["as_predicted"] is True


def test_fifos_and_links_make_the_facts_uncertain_without_blocking(tmp_path: Path) -> None:
    """A FIFO where a ``.pth`` file or ``pyvenv.cfg`` belongs (in the venv, or planted in
    the copy), or a link in the copy where a copied file belongs: the copy is probed
    instead, and nothing waits on the FIFO (an alarm fails the test if it did)."""
    import signal

    def venv(root: Path) -> Path:
        site = root / "lib" / "python3.11" / "site-packages"
        site.mkdir(parents=True)
        (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (site / "a.pth").write_text("/opt/x\n")
        return site

    ours, theirs = venv(tmp_path / "env"), venv(tmp_path / "copy")
    found = {"prefix": str(tmp_path / "env"), "is_venv": True, "sys_path": [str(ours)],
             "site_packages": [str(ours)], "executable": str(tmp_path / "env/bin/python")}
    moved = facts.moved(found, str(tmp_path / "copy"))
    assert moved is not None and moved["site_packages"] == [str(theirs)]
    assert moved["executable"] == str(tmp_path / "copy/bin/python")
    signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.alarm(10)
    try:
        for fifo in (ours / "a.pth", theirs / "a.pth", tmp_path / "env" / "pyvenv.cfg"):
            saved = fifo.read_bytes()
            fifo.unlink()
            os.mkfifo(fifo)
            assert facts.moved(found, str(tmp_path / "copy")) is None, fifo
            fifo.unlink()
            fifo.write_bytes(saved)
    finally:
        signal.alarm(0)
    cfg = tmp_path / "copy" / "pyvenv.cfg"
    cfg.unlink()
    cfg.symlink_to(tmp_path / "env" / "pyvenv.cfg")  # planted: not followed
    assert facts.moved(found, str(tmp_path / "copy")) is None


def test_the_packages_alone_are_the_snapshot_s_own(torch_and_tiny: Any, tmp_path: Path) -> None:
    """collect_packages gives what collect records of the interpreter, the packages and the
    torch build (its compatibility key made for the same GPUs), redacted alike."""
    import dataclasses

    from envguard.install.predict import snapshot_options
    from envguard.probe.collector import collect, collect_packages

    options = dataclasses.replace(snapshot_options(str(torch_and_tiny.python), memo=False),
                                  memo_root=tmp_path / "memo")
    whole = collect(options)
    alone = collect_packages(options, [g.name for g in whole.system.gpus])
    assert whole.torch.version == "2.11.0+cu128" and whole.torch.compat_key
    assert (alone.interpreter, alone.packages, alone.torch) == (
        whole.interpreter, whole.packages, whole.torch)
    other = collect_packages(options, ["NVIDIA H100 80GB HBM3"])  # another GPU: another key
    assert other.torch.compat_key != whole.torch.compat_key
