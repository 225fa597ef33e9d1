"""Edited files shared by hard link: two real uv venvs linked from one uv cache (a cache
this test owns, ``uv_hardlinks``), an edit in one; and the miss, a copied install."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envguard.model import IntegrityIssue, Snapshot
from envguard.probe import collect, hardlinks
from envguard.probe.options import SnapshotOptions
from envguard.probe.recordcheck import Checked, decode, encode
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

LINEAR = "torch/nn/modules/linear.py"


def _torch_wheel(wheel_dir: Path) -> Path:
    return build_wheel(wheel_dir, "torch", "2.11.0",
                       {**fake_torch_files(version="2.11.0"), LINEAR: "class Linear:\n    pass\n"})


def _two_venvs(venvs: VenvFactory, wheel_dir: Path) -> tuple[Venv, Venv]:
    wheel = _torch_wheel(wheel_dir)
    first, second = venvs.create("first"), venvs.create("second")
    venvs.uv_install(first, wheel)
    venvs.uv_install(second, wheel)
    return first, second


def _snapshot(env: Venv, verify: str = "size") -> Snapshot:
    return collect(SnapshotOptions(python=str(env.python), verify=verify, git=False,
                                   use_project_config=False, remember_caches=False))


def _issue(snap: Snapshot, path: str = LINEAR) -> IntegrityIssue:
    (found,) = [i for i in snap.integrity.issues if i.path == path]
    return found


def _archive(cache: Path) -> Path:
    (folder,) = (cache / "archive-v0").iterdir()
    return folder


def test_an_edit_in_one_venv_is_reported_as_shared_with_uvs_cache_in_both(
        uv_hardlinks: Path, venvs: VenvFactory, wheel_dir: Path) -> None:
    first, second = _two_venvs(venvs, wheel_dir)
    edited = first.site_packages() / LINEAR
    assert os.stat(edited).st_nlink == 3  # the scene is real: first, second and the cache
    with open(edited, "a") as fh:  # written in place, as `>>` or an editor saving in place
        fh.write("Linear.debug = True\n")
    archive = _archive(uv_hardlinks)
    assert "debug" in (archive / LINEAR).read_text()  # the cache's copy has the edit
    for env in (first, second):
        issue = _issue(_snapshot(env))
        assert (issue.problem, issue.links) == ("size", 3)
        assert issue.shared_with == str(archive)


def test_a_same_size_edit_is_shared_in_hash_mode(uv_hardlinks: Path, venvs: VenvFactory,
                                                 wheel_dir: Path) -> None:
    first, second = _two_venvs(venvs, wheel_dir)
    edited = first.site_packages() / LINEAR
    with open(edited, "r+") as fh:
        fh.write("class Lineaz")
    for _ in range(2):  # hashed, then the digest from the hash memo
        issue = _issue(_snapshot(second, verify="hash"))
        assert (issue.problem, issue.links, issue.shared_with) == ("hash", 3,
                                                                   str(_archive(uv_hardlinks)))


def test_a_copied_install_with_an_edit_is_not_called_shared(
        venvs: VenvFactory, wheel_dir: Path) -> None:
    """The session's uv copies (UV_LINK_MODE=copy): one link, nothing shared."""
    first, second = _two_venvs(venvs, wheel_dir)
    edited = first.site_packages() / LINEAR
    assert os.stat(edited).st_nlink == 1
    with open(edited, "a") as fh:
        fh.write("Linear.debug = True\n")
    issue = _issue(_snapshot(first))
    assert (issue.problem, issue.links, issue.shared_with) == ("size", None, None)
    assert _snapshot(second).integrity.issues == []


def test_an_edit_that_replaced_the_file_is_this_venvs_alone(
        uv_hardlinks: Path, venvs: VenvFactory, wheel_dir: Path) -> None:
    """An editor that writes a new file and renames it over the old one breaks the link."""
    first, second = _two_venvs(venvs, wheel_dir)
    edited = first.site_packages() / LINEAR
    text = edited.read_text()
    edited.unlink()
    edited.write_text(text + "Linear.debug = True\n")
    issue = _issue(_snapshot(first))
    assert (issue.links, issue.shared_with) == (None, None)
    assert _snapshot(second).integrity.issues == []


def test_other_links_outside_uvs_cache_are_counted_not_placed(
        uv_hardlinks: Path, venvs: VenvFactory, wheel_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Links, but not in the cache envguard looks in (another UV_CACHE_DIR): counted only."""
    first, _ = _two_venvs(venvs, wheel_dir)
    with open(first.site_packages() / LINEAR, "a") as fh:
        fh.write("Linear.debug = True\n")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "another-cache"))
    issue = _issue(_snapshot(first))
    assert (issue.links, issue.shared_with) == (3, None)


def test_the_cache_search_is_bounded(uv_hardlinks: Path, venvs: VenvFactory,
                                     wheel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Archives looked into first (sorted names) use up the stats: the copy is not found,
    and no more stats are made than the bound allows."""
    first, _ = _two_venvs(venvs, wheel_dir)
    with open(first.site_packages() / LINEAR, "a") as fh:
        fh.write("Linear.debug = True\n")
    for n in range(30):
        (uv_hardlinks / "archive-v0" / f"!{n:02d}").mkdir()
    made: list[int] = []
    real = hardlinks._CacheSearch.find

    def counting(self: hardlinks._CacheSearch, *args: object) -> str | None:
        found = real(self, *args)  # type: ignore[arg-type]
        made.append(self.stats)
        return found

    monkeypatch.setattr(hardlinks._CacheSearch, "find", counting)
    assert _issue(_snapshot(first)).shared_with == str(_archive_of(uv_hardlinks))
    assert made == [31]
    made.clear()
    monkeypatch.setattr(hardlinks, "MAX_STATS", 10)
    issue = _issue(_snapshot(first))
    assert (issue.links, issue.shared_with, made) == (3, None, [10])


def _archive_of(cache: Path) -> Path:
    (folder,) = [p for p in (cache / "archive-v0").iterdir() if not p.name.startswith("!")]
    return folder


@pytest.mark.parametrize(("env", "expected"), [
    ({"UV_CACHE_DIR": "/c/uv", "XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/c/uv"),
    ({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/uv"),
    ({"XDG_CACHE_HOME": "relative", "HOME": "/h"}, "/h/.cache/uv"),
    ({"UV_CACHE_DIR": "", "HOME": "/h"}, "/h/.cache/uv"),
])
def test_uvs_cache_is_found_as_uv_finds_it(env: dict[str, str], expected: str) -> None:
    assert hardlinks.uv_cache_dir(env) == Path(expected)


@pytest.mark.usefixtures("fork_always")
def test_the_link_count_crosses_the_forked_stat_workers(
        uv_hardlinks: Path, venvs: VenvFactory, wheel_dir: Path) -> None:
    """Snapshots with stat-ahead's forked workers (the second one on the records memo's rows,
    claimed before the collector is imported) say what the plain check says."""
    first, _ = _two_venvs(venvs, wheel_dir)
    with open(first.site_packages() / LINEAR, "a") as fh:
        fh.write("Linear.debug = True\n")
    answers = {_issue(_snapshot(first)) for _ in range(2)}
    assert answers == {_issue(collect(SnapshotOptions(
        python=str(first.python), git=False, use_project_config=False, remember_caches=False,
        use_memo=False)))}
    assert next(iter(answers)).links == 3


def test_a_workers_answer_keeps_the_link_counts() -> None:
    checked = Checked(issues=[("a.py", "size", "1", "2")], jobs=[], files=1, size=2,
                      links={"a.py": 3})
    assert decode(encode(checked)) == checked
    with pytest.raises(ValueError, match="not a RECORD check result"):
        decode(([], 1, 2, 0, 0, {"a.py": "3"}))
    with pytest.raises(ValueError, match="not a RECORD check result"):
        decode(([], 1, 2, 0, 0, ["a.py"]))
