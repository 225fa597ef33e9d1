"""What an uninstall removes from the environment (envguard.install.uninstalls.record_paths),
against an oracle that resolves every row's folder with ``realpath``: the fast path (one
``lstat`` a folder, no ``normpath`` for a plain row) must give the same list on rows that
climb out with ``..``, hold ``.`` or ``//``, and pass through links that lead out of the
venv, back into it, or to the venv's own parent. Real files and links; nothing mocked."""

from __future__ import annotations

import os
from pathlib import Path

from envguard.install.uninstalls import record_paths, whole_folders


def _oracle(prefix: str, meta: str) -> list[str]:
    site = os.path.dirname(os.path.join(prefix, meta))
    out: list[str] = []
    for line in Path(prefix, meta, "RECORD").read_text().splitlines():
        rel = line.split(",")[0]
        path = os.path.normpath(os.path.join(site, rel))
        real = os.path.realpath(os.path.dirname(path))
        if not path.startswith(prefix + os.sep) or not (
                real == prefix or real.startswith(prefix + os.sep)):
            continue
        out.append(path)
        if path.endswith(".py"):
            cache = os.path.join(os.path.dirname(path), "__pycache__")
            stem = os.path.basename(path)[:-3] + "."
            names = os.listdir(cache) if os.path.isdir(cache) else []
            out += [os.path.join(cache, n) for n in names
                    if n.startswith(stem) and n.endswith(".pyc")]
    for folder, _, files in os.walk(os.path.join(prefix, meta)):
        out += [os.path.join(folder, n) for n in files]
    return out


def test_rows_of_every_shape_are_resolved_as_realpath_resolves_them(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "pkg").mkdir(parents=True)
    (outside / "pkg" / "mod.py").write_text("")
    prefix = tmp_path / "venv"
    site = prefix / "lib" / "python3.11" / "site-packages"
    for folder in (site / "pkg" / "sub" / "__pycache__", site / "other", prefix / "bin"):
        folder.mkdir(parents=True)
    (site / "pkg" / "sub" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"")
    (site / "pkg" / "sub" / "__pycache__" / "m.cpython-311.opt-1.pyc").write_bytes(b"")
    (site / "pkg" / "sub" / "__pycache__" / "mx.cpython-311.pyc").write_bytes(b"")
    (site / "out").symlink_to(outside)  # leads out: its rows are left alone
    (site / "back").symlink_to(site / "other")  # leads back in
    (site / "up").symlink_to(tmp_path)  # the venv's parent: up/venv/... is inside again
    meta = site / "pkg-1.0.dist-info"
    meta.mkdir()
    rows = ["pkg/__init__.py", "pkg/sub/m.py", "pkg/sub/../sub/m.py", "./pkg/x.py",
            "pkg//y.py", "pkg/sub/.", "../../../bin/tool", "../../../../outside/z.py",
            "/abs/elsewhere.py", "out/pkg/mod.py", "back/b.py", "up/venv/bin/tool2",
            "up/outside/pkg/mod.py", "pkg-1.0.dist-info/RECORD", "pkg-1.0.dist-info/METADATA"]
    (meta / "RECORD").write_text("".join(f"{r},,\n" for r in rows))
    (meta / "METADATA").write_text("Name: pkg\n")
    rel = os.path.relpath(meta, prefix)
    assert record_paths(str(prefix), rel) == _oracle(str(prefix), rel)
    got = record_paths(str(prefix), rel)
    assert str(site / "pkg" / "sub" / "__pycache__" / "m.cpython-311.opt-1.pyc") in got
    assert str(site / "pkg" / "sub" / "__pycache__" / "mx.cpython-311.pyc") not in got
    assert str(site / "out" / "pkg" / "mod.py") not in got
    assert str(site / "back" / "b.py") in got and str(prefix / "bin" / "tool") in got
    assert str(site / "up" / "venv" / "bin" / "tool2") in got
    # only a top folder every file of which is removed moves in one step
    removed = dict.fromkeys(got)
    assert whole_folders(removed, (str(site),)) == [str(meta)]
    (site / "pkg" / "__init__.py").write_text("")
    (site / "pkg" / "x.py").write_text("")
    (site / "pkg" / "y.py").write_text("")
    (site / "pkg" / "sub" / "m.py").write_text("")
    assert whole_folders(removed, (str(site),)) == [str(meta)]  # mx's bytecode stays
    (site / "pkg" / "sub" / "__pycache__" / "mx.cpython-311.pyc").unlink()
    assert whole_folders(removed, (str(site),)) == [str(site / "pkg"), str(meta)]
