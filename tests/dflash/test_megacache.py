"""The trainer's Mega-Cache: saved after a compiled warm-up under the compile-compat key,
loaded by the next process with an empty inductor cache. Real torch.compile on CPU
(the guarded race harness compiles flex_attention's forward; CPU has no flex backward)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash.compilation.megacache import (
    MegaCache,
    WarmUpCache,
    before_warmup,
    current_compat_key,
)
from dflash.errors import MegaCacheError
from tests.dflash import launch
from tests.dflash.conftest import ColdRace


@pytest.mark.slow
def test_artifact_is_saved_then_loaded_by_a_cold_process(cold_guarded_race: ColdRace):
    first, store = cold_guarded_race.result, cold_guarded_race.store
    assert first["mega_cache_load_s"] is None
    assert isinstance(first["mega_cache_saved_bytes"], int) and first["mega_cache_saved_bytes"] > 0
    key = current_compat_key()
    assert key is not None
    artifact = MegaCache(store, key).path
    assert artifact.is_file() and artifact.stat().st_size == first["mega_cache_saved_bytes"]
    manifest = json.loads(artifact.with_suffix(".json").read_text())
    assert manifest["compat_key"] == key

    # Empty inductor dir, same build.
    second = launch.guarded_race(cold_guarded_race.root, "b", "--threads", "1", "--iters", "1",
                                 "--mega-cache", str(store))
    assert second["mega_cache_load_s"] is not None
    assert second["mega_cache_saved_bytes"] == 0  # loaded: nothing new to save
    assert second["ok"] == 1


def test_another_builds_key_finds_nothing_and_corruption_is_one_line(tmp_path: Path):
    store = tmp_path / "store"
    other = MegaCache(store, "sha256:" + "ab" * 32)
    assert other.load() is None
    other.path.parent.mkdir(parents=True)
    other.path.write_bytes(b"not an artifact")
    with pytest.raises(MegaCacheError) as err:
        other.load()
    assert "\n" not in str(err.value) and str(other.path) in str(err.value)


def test_a_folder_that_took_the_artifact_in_is_marked_warm(tmp_path: Path, monkeypatch):
    # The trainer skips loading (seconds) into an inductor folder that already holds it.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    mega = MegaCache(tmp_path / "store", "sha256:" + "cd" * 32)
    assert not mega.local_is_warm()
    mega.mark_local()
    assert mega.local_is_warm()
    assert not MegaCache(tmp_path / "store", "sha256:" + "ef" * 32).local_is_warm()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "another"))
    assert not mega.local_is_warm()  # a fresh folder: load again


def test_the_trainers_warm_up_loads_before_and_saves_after(tmp_path: Path, monkeypatch):
    """before_warmup and after_warmup, the trainer's two calls around its warm-up."""
    import torch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    store = tmp_path / "store"
    assert before_warmup("off") is None
    cold = before_warmup(str(store))
    assert cold is not None and cold.loaded_seconds is None and cold.problem is None
    # What this process compiled (stand-in bytes: a real compile is the slow test's).
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"compiled", None))
    assert cold.after_warmup() == len(b"compiled")
    assert cold.mega.path.read_bytes() == b"compiled" and cold.mega.local_is_warm()
    assert before_warmup(str(store)) is None  # this inductor folder holds the kernels

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "fresh"))
    broken = before_warmup(str(store))  # those bytes are no artifact torch can load
    assert broken is not None and broken.loaded_seconds is None
    assert broken.problem is not None and str(cold.mega.path) in broken.problem
    assert not broken.mega.local_is_warm()

    def no_save() -> None:
        raise AssertionError("a warm-up that loaded the artifact saves nothing")

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", no_save)
    loaded = WarmUpCache(cold.mega, loaded_seconds=0.5)
    assert loaded.after_warmup() == 0 and loaded.mega.local_is_warm()
