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


def test_compile_will_run_only_where_no_kernels_wait(tmp_path: Path, monkeypatch):
    """The start's early compile workers: only for a warm-up that will compile for real."""
    from dflash.compilation.megacache import compile_will_run, for_setting

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    store = tmp_path / "store"
    assert not compile_will_run("off")  # cannot be known: torch's own default stays
    assert compile_will_run(str(store))  # a new machine: nothing here, nothing to load
    mega = for_setting(str(store))
    assert mega is not None
    mega.path.parent.mkdir(parents=True)
    mega.path.write_bytes(b"an artifact")
    assert not compile_will_run(str(store))  # the cold start loads it instead
    mega.path.unlink()
    mega.mark_local()
    assert not compile_will_run(str(store))  # the warm start: the kernels are here


def test_the_compile_workers_start_early_only_for_a_real_compile(tmp_path: Path,
                                                                  monkeypatch):
    """parallelize() asks compile_will_run and starts inductor's workers when it says yes
    (counted here: a CPU torch has no triton, and its start call returns at once)."""
    import torch

    import dflash.parallelize as par
    from dflash.config import TrainConfig
    from dflash.distributed.world import World
    from dflash.parallelize import Runtime

    calls: list[str] = []
    monkeypatch.setattr(par, "start_compile_workers", lambda: calls.append("start"))
    monkeypatch.setattr(par, "kernels", lambda compiled: par.Kernels(
        flex=lambda *a: None, block_mask_builder=lambda *a: None, compiled=compiled))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    rt = Runtime(device=torch.device("cpu"), dtype=torch.float32, attention="flex",
                 compile=True)
    drafter = torch.nn.Linear(2, 2)
    assert TrainConfig().mega_cache == "auto"
    par.parallelize(drafter, rt, World(), str(tmp_path / "store"))  # type: ignore[arg-type]
    assert calls == ["start"]
    par.parallelize(drafter, rt, World(), "off")  # type: ignore[arg-type]
    assert calls == ["start"]
    eager = Runtime(device=torch.device("cpu"), dtype=torch.float32, attention="flex",
                    compile=False)
    par.parallelize(drafter, eager, World(), str(tmp_path / "store"))  # type: ignore[arg-type]
    assert calls == ["start"]


def test_start_compile_workers_is_main_thread_only():
    import threading

    from dflash.compilation.kernels import start_compile_workers
    from dflash.errors import CompileStateError

    start_compile_workers()  # a CPU torch: no triton, nothing to start, no error
    raised: list[BaseException] = []

    def other() -> None:
        try:
            start_compile_workers()
        except CompileStateError as exc:
            raised.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(raised) == 1 and "main thread" in str(raised[0])


def test_the_gates_snapshot_gives_the_key_without_a_second_snapshot(monkeypatch):
    """The key read from a snapshot this process holds (the gate's env.json) is the one a
    snapshot of its own computes; a document without one changes nothing."""
    from dflash.compilation import megacache
    from envguard import probe

    own = megacache._collected_compat_key()
    assert own is not None and own.startswith("sha256:")
    monkeypatch.setattr(megacache, "_GIVEN", {})
    for bad in ("{not json", "[]", '{"torch": null}', '{"torch": {"compat_key": 3}}',
                '{"torch": {"compat_key": "md5:x"}}'):
        megacache.use_compat_key_of(bad)
        assert megacache._GIVEN == {}, bad
    from dflash.cli.gate import Gate

    Gate(True, [], "handed over", None).share_compat_key()  # no snapshot: nothing
    assert megacache._GIVEN == {}
    gate_doc = probe.collect(probe.SnapshotOptions(verify="none")).to_json()
    Gate(True, [], "checked", gate_doc).share_compat_key()
    monkeypatch.setattr(megacache, "_collected_compat_key", lambda: pytest.fail("collected"))
    assert megacache.current_compat_key() == own


@pytest.mark.parametrize("plant", ["group-writable store", "world-writable artifact",
                                   "artifact is a link", "private"])
def test_an_artifact_is_handed_to_torch_only_from_a_private_store(
        tmp_path: Path, monkeypatch, plant: str):
    """torch unpickles a compile artifact: one another user could have written (a store or
    file others may write, a link) is never handed to it; the warm-up compiles cold and
    says why. A spy stands in for torch's loader (a forged artifact needs only a CRC32)."""
    import os

    import torch

    from dflash.compilation.megacache import compile_will_run, for_setting

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    handed: list[bytes] = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts",
                        lambda data: handed.append(data) or object())
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    mega = for_setting(str(store))  # this environment's key: what before_warmup looks for
    assert mega is not None
    if plant == "artifact is a link":
        (tmp_path / "elsewhere.bin").write_bytes(b"artifact")
        mega.path.symlink_to(tmp_path / "elsewhere.bin")
    else:
        mega.path.write_bytes(b"artifact")
    if plant == "group-writable store":
        store.chmod(0o770)
    if plant == "world-writable artifact":
        mega.path.chmod(0o666)
    cache = before_warmup(str(store))
    assert cache is not None
    if plant == "private":
        assert handed == [b"artifact"] and cache.problem is None
        assert not compile_will_run(str(store)) or mega.local_is_warm()
        return
    assert handed == [] and cache.loaded_seconds is None
    expected = {"group-writable store": "is writable by group or others (mode 770)",
                "world-writable artifact": "it is writable by group or others (mode 666)",
                "artifact is a link": "it is a link or not a regular file"}[plant]
    assert cache.problem is not None and expected in cache.problem, cache.problem
    assert "torch would unpickle it" in cache.problem and "\n" not in cache.problem
    assert compile_will_run(str(store))  # the warm-up compiles for real: workers start early
    assert os.path.exists(mega.path) or os.path.islink(mega.path)  # left as it was
