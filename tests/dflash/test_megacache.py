"""The trainer's Mega-Cache: saved after a compiled warm-up under the compile-compat key,
loaded by the next process with an empty inductor cache. Real torch.compile on CPU
(the guarded race harness compiles flex_attention's forward; CPU has no flex backward)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash.compilation.megacache import MegaCache, current_compat_key
from dflash.errors import MegaCacheError


def _guarded(tmp: Path, cache: str, store: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp / cache / "inductor"),
           "TRITON_CACHE_DIR": str(tmp / cache / "triton")}
    proc = subprocess.run(
        [sys.executable, "-m", "dflash.compilation.race", "--mode", "guarded", "--threads", "1",
         "--iters", "1", "--seq", "256", "--device", "cpu", "--timeout", "240",
         "--mega-cache", str(store)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_artifact_is_saved_then_loaded_by_a_cold_process(tmp_path: Path):
    store = tmp_path / "store"
    first = _guarded(tmp_path, "a", store)
    assert first["mega_cache_load_s"] is None and first["mega_cache_saved_bytes"] > 0
    key = current_compat_key()
    assert key is not None
    artifact = MegaCache(store, key).path
    assert artifact.is_file() and artifact.stat().st_size == first["mega_cache_saved_bytes"]
    manifest = json.loads(artifact.with_suffix(".json").read_text())
    assert manifest["compat_key"] == key

    second = _guarded(tmp_path, "b", store)  # empty inductor dir, same build
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
