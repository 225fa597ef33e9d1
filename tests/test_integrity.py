"""Installed files against RECORD: edits, missing files, quirks, and the hash cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envguard.probe import distributions, integrity
from envguard.probe.memo.hashes import HashMemo
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files


@pytest.fixture
def torch_env(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    env = venvs.create()
    wheel = build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files(),
                        scripts={"torchrun": "torch:main"})
    venvs.uv_install(env, wheel)
    return env


def _verify(env: Venv, mode: str, cache: HashMemo | None = None) -> integrity.Integrity:
    found, _ = distributions.scan([str(env.site_packages())])
    return integrity.verify(found, mode, memo=cache)


def _problems(result: integrity.Integrity) -> set[tuple[str, str, str]]:
    return {(i.package, i.path, i.problem) for i in result.issues}


def test_clean_install_matches_and_tolerates_rewritten_scripts(torch_env: Venv) -> None:
    for mode in ("size", "hash"):
        result = _verify(torch_env, mode)
        assert result.issues == [], result.issues
        assert result.checked_files >= 3
        # The console script's shebang was rewritten by the installer: tolerated, not tampering.
        assert result.tolerated >= 1


def test_patched_file_of_a_different_size_is_reported_by_size_check(torch_env: Venv) -> None:
    target = torch_env.site_packages() / "torch" / "fx" / "_symbolic_trace.py"
    target.write_text(target.read_text() + "_is_fx_tracing_flag = False  # hot patch\n")
    result = _verify(torch_env, "size")
    assert ("torch", "torch/fx/_symbolic_trace.py", "size") in _problems(result)


def test_same_size_edit_is_caught_by_hash_and_flagged_by_size_mtime(torch_env: Venv) -> None:
    target = torch_env.site_packages() / "torch" / "fx" / "_symbolic_trace.py"
    original = target.read_text()
    edited = original.replace("False", "True ")[: len(original)]
    assert len(edited) == len(original) and edited != original
    target.write_text(edited)
    later = os.stat(target).st_mtime + 60
    os.utime(target, (later, later))
    assert ("torch", "torch/fx/_symbolic_trace.py", "hash") in _problems(_verify(torch_env, "hash"))
    size_result = _problems(_verify(torch_env, "size"))
    assert ("torch", "torch/fx/_symbolic_trace.py", "modified-after-install") in size_result


def test_missing_file_and_missing_record(torch_env: Venv, venvs: VenvFactory,
                                         wheel_dir: Path) -> None:
    (torch_env.site_packages() / "torch" / "version.py").unlink()
    other = build_wheel(wheel_dir, "norecord", "0.1", {"norecord/__init__.py": ""})
    venvs.uv_install(torch_env, other)
    (torch_env.site_packages() / "norecord-0.1.dist-info" / "RECORD").unlink()
    result = _verify(torch_env, "size")
    assert ("torch", "torch/version.py", "missing") in _problems(result)
    assert result.without_record == ["norecord"]


def test_hash_cache_makes_a_warm_rerun_read_nothing(torch_env: Venv, tmp_path: Path) -> None:
    cache = HashMemo(tmp_path / "hashes.marshal")
    cold = _verify(torch_env, "hash", cache)
    assert cold.hashed_bytes > 0
    assert cache.save() is None
    warm_cache = HashMemo(tmp_path / "hashes.marshal")
    warm_cache.load()
    warm = _verify(torch_env, "hash", warm_cache)
    assert warm.hashed_bytes == 0
    assert warm.issues == []
    # An edit invalidates the entry through the stat key, and the edit is reported.
    target = torch_env.site_packages() / "torch" / "__init__.py"
    target.write_text(target.read_text().replace("torch", "TORCH"))
    after = _verify(torch_env, "hash", warm_cache)
    assert after.hashed_bytes > 0
    assert ("torch", "torch/__init__.py", "hash") in _problems(after)


def test_corrupt_hash_cache_is_ignored_with_a_note(tmp_path: Path) -> None:
    import marshal

    path = tmp_path / "hashes.marshal"
    path.write_bytes(b"\xffgarbage")
    cache = HashMemo(path)
    cache.load()
    assert cache.load_error is not None and "ignored" in cache.load_error
    assert cache.get("/x", (1, 2, 3, 4), "sha256") is None
    # Readable but of another format or shape: silently a miss, never a crash.
    for doc in ({"sha256:/x": ((1, 2, 3, 4), "d")}, (("other", 1, 1), {}),
                (("envguard-hashcache", 2, marshal.version), {"sha256:/x": ["bad"]})):
        path.write_bytes(marshal.dumps(doc))
        cache = HashMemo(path)
        cache.load()
        assert cache.get("/x", (1, 2, 3, 4), "sha256") is None


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown verify mode"):
        integrity.verify([], "everything")


def test_issue_list_is_capped_per_package(torch_env: Venv, venvs: VenvFactory,
                                          wheel_dir: Path) -> None:
    files = {f"big/m{i}.py": f"x = {i}\n" for i in range(integrity._MAX_ISSUES_PER_PACKAGE + 20)}
    venvs.uv_install(torch_env, build_wheel(wheel_dir, "big", "1.0", files))
    for path in (torch_env.site_packages() / "big").glob("m*.py"):
        path.unlink()
    result = _verify(torch_env, "size")
    assert sum(1 for i in result.issues if i.package == "big") == integrity._MAX_ISSUES_PER_PACKAGE


def test_parallel_map_keeps_order_and_reraises() -> None:
    from envguard.probe.background import Task, parallel_map

    assert list(parallel_map(lambda x: x * x, range(50), 4)) == [x * x for x in range(50)]
    assert list(parallel_map(lambda x: x, [], 4)) == []

    def boom(x: int) -> int:
        if x == 3:
            raise KeyError("three")
        return x

    with pytest.raises(KeyError, match="three"):
        list(parallel_map(boom, range(6), 3))
    assert Task(lambda: 41 + 1).result() == 42
    with pytest.raises(ZeroDivisionError):
        Task(lambda: 1 // 0).result()
