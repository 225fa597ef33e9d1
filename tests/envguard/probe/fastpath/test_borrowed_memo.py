"""A scratch copy's snapshot reads the memo of the environment it was copied from
(envguard.probe.fastpath.records.BorrowedMemo): a dist-info folder the installer left alone
is not read again, one it wrote is read, and the environment's memo is never written. A
real uv venv and real installs; the copy is envguard install's own metadata clone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from envguard.install.predict import snapshot_options
from envguard.install.scratch import scratch_copy
from envguard.probe import collect, distributions
from envguard.probe.fastpath.records import RecordMemo
from envguard.probe.interpreter import probe_python
from tests.wheelfactory import VenvFactory, build_wheel


def test_a_copy_reads_only_what_the_installer_wrote(venvs: VenvFactory, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    memo = tmp_path / "memo"
    monkeypatch.setenv("ENVGUARD_CACHE_DIR", str(memo))
    for name in ("keep", "swap"):
        build_wheel(venvs.wheels, name, "1.0", {f"{name}/__init__.py": "A = 1\n"})
    env = venvs.create("env")
    venvs.uv_install(env, venvs.wheels / "keep-1.0-py3-none-any.whl",
                     venvs.wheels / "swap-1.0-py3-none-any.whl")
    first = collect(snapshot_options(str(env.python)))  # the environment's memo, written
    written = sorted(memo.rglob("records-*.marshal"))
    assert written, "the environment's snapshot kept no memo"
    kept = {p: p.read_bytes() for p in written}

    sites = [str(p) for p in probe_python(str(env.python)).facts["site_packages"]]
    with scratch_copy(env.path.resolve(), site_packages=sites) as (folder, _guard, _cloned):
        site = next(folder.glob("lib/python3*/site-packages"))
        record = site / "swap-1.0.dist-info" / "RECORD"
        rows = record.read_text(encoding="utf-8")
        record.unlink()  # another build of swap, as an installer writes it: a new file
        record.write_text(rows.replace("A = 1", "") + "swap/extra.py,sha256=AAAA,1\n",
                          encoding="utf-8")
        read: list[str] = []
        real = distributions._read_folder

        def spy(site_dir: str, meta_name: str, m: RecordMemo | None):  # type: ignore[no-untyped-def]
            read.append(meta_name)
            return real(site_dir, meta_name, m)

        options = snapshot_options(str(folder / "bin" / "python"), memo=False)
        with monkeypatch.context() as patched:
            patched.setattr(distributions, "_read_folder", spy)
            copy = collect(dataclasses.replace(options, memo_of=first.interpreter.prefix))
        copy_memo = RecordMemo.for_prefix_path(str(folder))
    assert read == ["swap-1.0.dist-info"]  # keep's folder came from the memo
    old = {p.name: p.fingerprint for p in first.packages}
    new = {p.name: p.fingerprint for p in copy.packages}
    assert new["keep"] == old["keep"]
    assert new["swap"] != old["swap"]
    assert {p: p.read_bytes() for p in sorted(memo.rglob("records-*.marshal"))} == kept
    assert not copy_memo.exists()
