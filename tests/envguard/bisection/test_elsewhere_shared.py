"""Where bisect says a break lies when an edit sits in uv's cache: every trial uv builds from
that cache has it (GOOD's set too), so it is not "something no trial holds". Real snapshots
of two uv venvs hard-linked from a cache this test owns (``uv_hardlinks``); the miss, a
copied install."""

from __future__ import annotations

from pathlib import Path

from envguard.bisection.elsewhere import not_in_any_set, shared_by_every_trial
from envguard.model import Snapshot
from envguard.probe import collect
from envguard.probe.options import SnapshotOptions
from tests.wheelfactory import VenvFactory, build_wheel, fake_torch_files

LINEAR = "torch/nn/modules/linear.py"


def _edited_snapshot(venvs: VenvFactory, wheel_dir: Path) -> Snapshot:
    """The second venv's snapshot after a line was appended to the first venv's file (with
    copies, the first venv's own snapshot: the edit stays there)."""
    wheel = build_wheel(wheel_dir, "torch", "2.11.0",
                        {**fake_torch_files(version="2.11.0"), LINEAR: "class Linear:\n"})
    first, second = venvs.create("first"), venvs.create("second")
    venvs.uv_install(first, wheel)
    venvs.uv_install(second, wheel)
    edited = first.site_packages() / LINEAR
    with open(edited, "a") as fh:
        fh.write("Linear.debug = True\n")
    linked = edited.stat().st_nlink > 1
    return collect(SnapshotOptions(python=str((second if linked else first).python),
                                   git=False, use_project_config=False,
                                   remember_caches=False))


def test_an_edit_in_uvs_cache_is_in_every_trial(uv_hardlinks: Path, venvs: VenvFactory,
                                                wheel_dir: Path, clean_cwd: Path) -> None:
    bad = _edited_snapshot(venvs, wheel_dir)
    (hint,) = shared_by_every_trial(bad, clean_cwd, {})
    assert hint == (f"1 installed file(s) are edited in uv's cache too (torch: {LINEAR}, "
                    "hard-linked): every trial uv builds from that cache has the edit, GOOD's "
                    "set too; drop them from it (uv cache clean -- torch), then bisect again")
    assert not_in_any_set(bad, "bad.json") == ()


def test_a_copied_installs_edit_is_one_no_trial_holds(venvs: VenvFactory, wheel_dir: Path,
                                                      clean_cwd: Path) -> None:
    bad = _edited_snapshot(venvs, wheel_dir)
    assert shared_by_every_trial(bad, clean_cwd, {}) == ()
    (hint,) = not_in_any_set(bad, "bad.json")
    assert hint.endswith("a trial installs the same versions without the edit; reinstalling "
                         "torch undoes it")
