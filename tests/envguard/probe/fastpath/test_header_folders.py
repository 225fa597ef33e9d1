"""Size mode vouches for C/C++ headers by their folder (envguard.probe.recordcheck): what it
still finds, what it leaves to --verify hash, and the files it never vouches for. Real
venvs installed by uv, real stat calls; the install is aged by a minute with os.utime so
that a change made now is clearly later than the install."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from envguard.model import Snapshot
from envguard.probe import (
    SnapshotOptions,
    collect,
    distributions,
    integrity,
    recordcheck,
)
from envguard.probe.fastpath import rows as memo_rows
from envguard.probe.fastpath import statahead
from envguard.probe.fastpath.records import RecordMemo
from envguard.probe.recordcheck import Checked, check_rows, decode, encode, header_folder
from tests.wheelfactory import Venv, VenvFactory, build_wheel

HEADERS = {
    "kern/include/kern/tensor.h": "#pragma once\nstruct Tensor {};\n",
    "kern/include/kern/ops/add.h": "#pragma once\nvoid add();\n",
    "kern/include/kern/ops/mul.h": "#pragma once\nvoid mul();\n",
    "kern/include/kern/ops/helper.py": "HELPER = 1\n",  # loaded by Python: stat'ed always
}


@pytest.fixture
def env(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    made = venvs.create()
    files: dict[str, str | bytes] = {"kern/__init__.py": "x = 1\n", **HEADERS}
    venvs.uv_install(made, build_wheel(wheel_dir, "kern", "1.0", files))
    _age(made.site_packages(), 60)
    return made


def _age(site: Path, seconds: int) -> None:
    """Every file and folder of the install, RECORD last, ``seconds`` in the past."""
    then = time.time() - seconds
    for top in (site / "kern", site / "kern-1.0.dist-info"):
        for folder, _, names in os.walk(top):
            for name in names:
                os.utime(Path(folder) / name, (then, then))
            os.utime(folder, (then, then))
    os.utime(site / "kern-1.0.dist-info" / "RECORD", (then + 1, then + 1))


def _verify(env: Venv, mode: str) -> integrity.Integrity:
    found, _ = distributions.scan([str(env.site_packages())])
    return integrity.verify(found, mode)


def _problems(result: integrity.Integrity) -> set[tuple[str, str]]:
    return {(i.path, i.problem) for i in result.issues}


def test_unchanged_header_folders_vouch_for_their_headers_in_size_mode_only(env: Venv) -> None:
    size = _verify(env, "size")
    assert size.issues == []
    assert size.checked_by_folder == 3  # the three .h files; helper.py is stat'ed
    full = _verify(env, "hash")
    assert full.issues == [] and full.checked_by_folder == 0
    assert full.checked_files == size.checked_files + 3


def test_an_edit_written_into_a_header_is_left_to_hash_mode(env: Venv) -> None:
    """The documented limit: the folder's time does not change."""
    header = env.site_packages() / "kern/include/kern/ops/add.h"
    with open(header, "a") as fh:
        fh.write("void add2();\n")
    assert _problems(_verify(env, "size")) == set()
    assert ("kern/include/kern/ops/add.h", "size") in _problems(_verify(env, "hash"))


def _remove(header: Path) -> None:
    header.unlink()


def _replace(header: Path) -> None:
    """What sed -i, patch and installers do: write a new file, rename it over the old."""
    temp = header.with_name(".add.h.new")
    temp.write_text("#pragma once\nvoid add(int);\n")
    os.replace(temp, header)


def _fifo(header: Path) -> None:
    header.unlink()
    os.mkfifo(header)


@pytest.mark.parametrize(("change", "problem"), [(_remove, "missing"), (_replace, "size"),
                                                 (_fifo, "not-a-regular-file")])
def test_a_header_removed_or_replaced_changes_its_folder_and_is_found(env: Venv, change: object,
                                                                      problem: str) -> None:
    header = env.site_packages() / "kern/include/kern/ops/add.h"
    change(header)  # type: ignore[operator]
    result = _verify(env, "size")
    assert ("kern/include/kern/ops/add.h", problem) in _problems(result)
    assert result.checked_by_folder == 1  # ops/ is stat'ed file by file; tensor.h is not


def test_a_folder_changed_since_the_install_is_stat_ed_file_by_file(env: Venv) -> None:
    """A file added beside the headers (another package, an editor's swap file) makes the
    folder newer: then even an edit written in place is found by its time."""
    ops = env.site_packages() / "kern/include/kern/ops"
    (ops / "unrelated.txt").write_text("x\n")
    header = ops / "mul.h"
    text = header.read_text()
    header.write_text(text.replace("mul", "MUL"))  # same size, written in place
    result = _verify(env, "size")
    assert ("kern/include/kern/ops/mul.h", "modified-after-install") in _problems(result)


def test_a_python_file_under_include_is_always_stat_ed(env: Venv) -> None:
    helper = env.site_packages() / "kern/include/kern/ops/helper.py"
    helper.write_text("HELPER = 2\n")  # same size, written in place: the folder is unchanged
    assert ("kern/include/kern/ops/helper.py", "modified-after-install") in _problems(
        _verify(env, "size"))


@pytest.mark.parametrize(("folder", "expected"), [
    ("torch/include/ATen/ops", True), ("include", True), ("nvidia/cu13/include", True),
    ("pkg/includes", False), ("pkg/my_include/x", False), ("../../../include/site", False),
    ("torch/_inductor", False),
])
def test_header_folder(folder: str, expected: bool) -> None:
    assert header_folder(folder) is expected


def test_the_worker_answer_carries_the_folder_count() -> None:
    checked = Checked(issues=[("a.h", "missing", None, None)], jobs=[], files=2, size=10,
                      tolerated=1, by_folder=7)
    assert decode(encode(checked)) == checked
    with pytest.raises(ValueError, match="not a RECORD check result"):
        decode(([], 2, 10, 1, "7"))
    with pytest.raises(ValueError, match="not a RECORD check result"):
        decode(([], 2, 10, 1))  # an answer in the old four-field shape


def test_no_folder_vouches_without_the_install_time(tmp_path: Path) -> None:
    """Without RECORD's time (hash mode, or a RECORD that could not be stat'ed) every
    header is stat'ed."""
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "a.h").write_text("x")
    rows = [("include/a.h", "", "1")]
    assert check_rows(str(tmp_path), rows, None).by_folder == 0
    assert check_rows(str(tmp_path), rows, time.time_ns() + 10**10).by_folder == 1
    assert check_rows(str(tmp_path), rows, time.time_ns() - 10**11).by_folder == 0
    assert recordcheck.MTIME_SLACK_NS > 0


# -- the records memo's layout: chunks of header rows checked by their folders alone ---------

def _snap(env: Venv, memo_root: Path, **changes: Any) -> Snapshot:
    return collect(SnapshotOptions(python=str(env.python), memo_root=memo_root, git=False,
                                   use_project_config=False, remember_caches=False, **changes))


def _edit_in_place(header: Path) -> None:
    with open(header, "a") as fh:
        fh.write("void add2();\n")


@pytest.mark.usefixtures("fork_always")
@pytest.mark.parametrize("change", [None, _remove, _replace, _fifo, _edit_in_place])
def test_the_memo_s_header_chunks_agree_with_a_fresh_check(env: Venv, tmp_path: Path,
                                                           change: Any) -> None:
    memo = tmp_path / "memo"
    _snap(env, memo)  # writes the records memo, header rows laid out by folder
    if change is not None:
        change(env.site_packages() / "kern/include/kern/ops/add.h")
    statahead.start(str(env.path), memo)  # as the CLI does: workers on the memo's chunks
    via_memo = _snap(env, memo)
    fresh = _snap(env, tmp_path / "no-memo", use_memo=False)
    assert via_memo.integrity == fresh.integrity
    assert via_memo.integrity.checked_by_folder == (1 if change not in (None, _edit_in_place)
                                                    else 3)


def test_a_chunk_of_unchanged_header_folders_is_not_unpacked(
        env: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo_rows, "CHUNK_ROWS", 1)
    memo = tmp_path / "memo"
    _snap(env, memo)
    unpacked: list[bytes] = []
    real = memo_rows.unpack_chunk

    def spy(chunk: bytes) -> list[Any]:
        unpacked.append(chunk)
        return real(chunk)

    monkeypatch.setattr(memo_rows, "unpack_chunk", spy)

    def check() -> tuple[int, int, int]:
        unpacked.clear()
        loaded = RecordMemo.for_prefix(str(env.path), memo)
        ((meta_dir, rows, installed_ns),) = [f for f in loaded.folder_records()
                                             if "kern-1.0" in f[0]]
        units = statahead.units_of(os.path.dirname(meta_dir), rows, installed_ns)
        assert sum(rows.chunk_summary(n) is not None for n in range(len(units))) == 3
        return (sum(statahead.check_unit(u).by_folder for u in units), len(unpacked),
                len(units) - 3)

    by_folder, reads, to_stat = check()
    assert by_folder == 3 and reads == to_stat >= 2  # no header chunk was unpacked
    _replace(env.site_packages() / "kern/include/kern/ops/add.h")
    by_folder, reads, to_stat = check()
    assert by_folder == 1 and reads == to_stat + 2  # ops/ changed: its two chunks are read
