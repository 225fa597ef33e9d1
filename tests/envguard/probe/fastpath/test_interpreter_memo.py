"""The interpreter probe's answer kept in the memo (envguard.probe.fastpath.facts): used while
nothing it depends on changes, probed afresh as soon as something does. Real venvs, real
probes; a spy counts the interpreters started (nothing is mocked)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from envguard.probe import interpreter
from envguard.probe.fastpath import facts
from tests.wheelfactory import Venv, VenvFactory


class _Probes:
    """Counts the probes started (the real ``start`` still runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = interpreter.start

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(interpreter, "start", spy)


def _age(paths: list[Path], seconds: int = 60) -> None:
    """Folders and files as if written a minute ago (a probe does not keep an answer about
    folders touched just before it started)."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


@pytest.fixture
def env(venvs: VenvFactory) -> Venv:
    made = venvs.create()
    _age([made.site_packages(), made.path / "pyvenv.cfg"])
    return made


def _probe(env: Venv, memo: Path) -> dict[str, Any]:
    return interpreter.probe_python(str(env.python), memo).facts


def test_an_unchanged_interpreter_is_probed_once(env: Venv, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    probes = _Probes(monkeypatch)
    first = _probe(env, tmp_path)
    again = _probe(env, tmp_path)
    assert probes.count == 1 and again == first
    # The command's early start reads the memo too, and starts no interpreter.
    interpreter.prefetch(str(env.python), tmp_path)
    assert interpreter.probe_python(str(env.python)).facts == first and probes.count == 1
    assert interpreter.probe_python(str(env.python), None).facts == first  # no memo: probed
    assert probes.count == 2


def _add_pth(env: Venv, extra: Path) -> None:
    (env.site_packages() / "extra.pth").write_text(f"{extra}\n")


def _edit_pth(env: Venv, extra: Path) -> None:
    pth = env.site_packages() / "keep.pth"
    with open(pth, "a") as fh:  # written in place: the folder keeps its time
        fh.write(f"{extra}\n")


def _pythonpath(env: Venv, extra: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(extra))


def _system_site(env: Venv, extra: Path) -> None:
    cfg = env.path / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("include-system-site-packages = false",
                                           "include-system-site-packages = true"))


@pytest.mark.parametrize("change", ["add_pth", "edit_pth", "pythonpath", "system_site"])
def test_a_change_to_what_sys_path_depends_on_is_probed_afresh(
        env: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (env.site_packages() / "keep.pth").write_text("")
    _age([env.site_packages(), env.site_packages() / "keep.pth"])
    memo = tmp_path / "memo"
    before = _probe(env, memo)
    assert facts.lookup(interpreter.resolve_python(str(env.python)), os.environ, memo)
    if change == "add_pth":
        _add_pth(env, extra)
    elif change == "edit_pth":
        _edit_pth(env, extra)
    elif change == "pythonpath":
        _pythonpath(env, extra, monkeypatch)
    else:
        _system_site(env, extra)
    after = _probe(env, memo)
    assert after["sys_path"] != before["sys_path"]
    if change != "system_site":
        assert str(extra) in after["sys_path"]


def test_no_answer_is_kept_about_folders_touched_as_the_probe_started(
        venvs: VenvFactory, tmp_path: Path) -> None:
    fresh = venvs.create()  # its site-packages was written a moment ago
    exe = interpreter.resolve_python(str(fresh.python))
    interpreter.probe_python(str(fresh.python), tmp_path)
    assert facts.lookup(exe, os.environ, tmp_path) is None
    _age([fresh.site_packages(), fresh.path / "pyvenv.cfg"])
    interpreter.probe_python(str(fresh.python), tmp_path)
    assert facts.lookup(exe, os.environ, tmp_path) is not None


def test_facts_handed_on_serve_the_next_probe_of_a_just_changed_environment(
        venvs: VenvFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """envguard install needs the facts before its snapshot, of an environment an install
    changed a moment ago (the memo keeps no answer then): handed on, they serve the
    snapshot's probe, once; the probe after that starts an interpreter again."""
    fresh = venvs.create()
    probes = _Probes(monkeypatch)
    first = interpreter.probe_python(str(fresh.python), tmp_path)
    interpreter.hand_on(str(fresh.python), first)
    assert interpreter.probe_python(str(fresh.python), tmp_path).facts == first.facts
    assert probes.count == 1
    interpreter.probe_python(str(fresh.python), tmp_path)
    assert probes.count == 2


def test_a_corrupt_or_foreign_memo_is_a_miss(env: Venv, tmp_path: Path) -> None:
    exe = interpreter.resolve_python(str(env.python))
    _probe(env, tmp_path)
    (memo_file,) = tmp_path.glob("interpreter-*.marshal")
    memo_file.write_bytes(b"\xffgarbage")
    assert facts.lookup(exe, os.environ, tmp_path) is None
    assert _probe(env, tmp_path)["prefix"] == str(env.path)  # probed again, and kept
    assert facts.lookup(exe, os.environ, tmp_path) is not None


def test_the_memo_holds_no_variable_value_and_no_credential(
        env: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
    monkeypatch.setenv("PYTHONSECRETTHING", secret)  # in the key, as a digest only
    exe = interpreter.resolve_python(str(env.python))
    _probe(env, tmp_path)
    (memo_file,) = tmp_path.glob("interpreter-*.marshal")
    assert secret.encode() not in memo_file.read_bytes()
    assert facts.lookup(exe, os.environ, tmp_path) is not None
    monkeypatch.setenv("PYTHONSECRETTHING", secret + "x")  # a changed value still misses
    assert facts.lookup(exe, os.environ, tmp_path) is None
    # An answer with a credential in it (here: a sys.path entry) is not kept at all.
    memo_file.unlink()
    monkeypatch.setenv("PYTHONPATH", f"/opt/{secret}/lib")
    assert secret in str(_probe(env, tmp_path)["sys_path"])
    assert not list(tmp_path.glob("interpreter-*.marshal"))


def test_an_install_that_adds_no_pth_file_keeps_the_answer(
        env: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package installed (site-packages changed a moment ago) leaves sys.path as it was:
    the answer kept before serves the next probe, as envguard install's probe of an
    environment its last install just changed; a .pth file installed with it does not."""
    probes = _Probes(monkeypatch)
    first = _probe(env, tmp_path)
    dist = env.site_packages() / "pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    (env.site_packages() / "pkg").mkdir()
    assert _probe(env, tmp_path) == first and probes.count == 1
    extra = tmp_path / "extra"
    extra.mkdir()
    (env.site_packages() / "pkg.pth").write_text(f"{extra}\n")
    assert str(extra) in _probe(env, tmp_path)["sys_path"] and probes.count == 2
