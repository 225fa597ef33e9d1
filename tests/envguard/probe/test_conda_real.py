"""Conda prefixes written by a real installer: py-rattler (the library under pixi) installs
tiny packages built here into a local channel, and writes ``conda-meta/`` as conda does.

The prefix is a uv venv (so there is an interpreter to probe) that rattler installs conda
packages into, offline, from ``file://`` channels. micromamba, mamba and conda are not
installed on the test machines: the restore test puts a stand-in ``micromamba`` on PATH
that reads the ``@EXPLICIT`` file it is given and installs exactly those archives with
rattler, and says so.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.wheelfactory import VenvFactory

rattler = pytest.importorskip("rattler", reason="py-rattler (a dev dependency) is missing")
from rattler.index import index_fs  # noqa: E402

PLACEHOLDER = "/opt/anaconda1anaconda2anaconda3"


def package(channel: Path, name: str, version: str, build: str,
            files: dict[str, bytes], *, placeholder: tuple[str, ...] = ()) -> Path:
    """A ``.tar.bz2`` conda package in ``channel/noarch`` (info/index.json, info/paths.json,
    info/files; a path in ``placeholder`` holds the build prefix, rewritten at install)."""
    folder = channel / "noarch"
    folder.mkdir(parents=True, exist_ok=True)
    index = {"name": name, "version": version, "build": build, "build_number": 0,
             "depends": [], "subdir": "noarch", "noarch": "generic"}
    paths = []
    for rel, data in files.items():
        entry: dict[str, object] = {"_path": rel, "path_type": "hardlink",
                                    "sha256": hashlib.sha256(data).hexdigest(),
                                    "size_in_bytes": len(data)}
        if rel in placeholder:
            entry.update({"prefix_placeholder": PLACEHOLDER, "file_mode": "text"})
        paths.append(entry)
    archive = folder / f"{name}-{version}-{build}.tar.bz2"
    with tarfile.open(archive, "w:bz2") as tf:
        def add(member: str, data: bytes) -> None:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))

        for rel, data in files.items():
            add(rel, data)
        add("info/index.json", json.dumps(index).encode())
        add("info/paths.json", json.dumps({"paths": paths, "paths_version": 1}).encode())
        add("info/files", ("\n".join(files) + "\n").encode())
    return archive


def install(prefix: Path, channel: Path, specs: list[str], cache: Path) -> None:
    """Solve ``specs`` against ``channel`` and make ``prefix`` hold exactly that (rattler
    removes what the transaction drops)."""
    async def run() -> None:
        await index_fs(channel, force=True)
        records = await rattler.solve(sources=[rattler.Channel(channel.as_uri())],
                                      specs=specs, platforms=["linux-64", "noarch"])
        installed = [rattler.PrefixRecord.from_path(p)
                     for p in sorted((prefix / "conda-meta").glob("*.json"))]
        await rattler.install(records, target_prefix=prefix, cache_dir=cache,
                              installed_packages=installed, show_progress=False)

    asyncio.run(run())


def envguard(*args: str | Path, cwd: Path, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=180, check=False)


@pytest.fixture
def world(venvs: VenvFactory, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(prefix, channel, rattler cache): cudatoolkit 11.8, nccl, mkl and a package with a
    rewritten prefix placeholder, installed by rattler into a uv venv."""
    channel = tmp_path / "channel"
    package(channel, "cudatoolkit", "11.8.0", "h6a678d5_0",
            {"lib/libcudart.so.11.0": b"x" * 300})
    package(channel, "cudatoolkit", "12.1.0", "h3f7c2a1_0",
            {"lib/libcudart.so.12": b"y" * 320})
    package(channel, "nccl", "2.18.5.1", "h6103f9b_0",
            {"lib/libnccl.so.2": b"n" * 200, "include/nccl.h": b"h" * 50})
    package(channel, "mkl", "2023.1.0", "h213fc3f_46344", {"lib/libmkl_rt.so.2": b"m" * 90})
    package(channel, "libfoo", "1.0", "0",
            {"etc/conda/activate.d/foo.sh": f"export FOO={PLACEHOLDER}/share\n".encode()},
            placeholder=("etc/conda/activate.d/foo.sh",))
    prefix = venvs.create("conda-env").path
    install(prefix, channel, ["cudatoolkit==11.8.0", "nccl", "mkl", "libfoo"],
            tmp_path / "rattler-cache")
    return prefix, channel, tmp_path / "rattler-cache"


def snapshot(prefix: Path, out: Path, *extra: str) -> dict[str, object]:
    proc = envguard("snapshot", "-q", "--python", prefix, "-o", out, *extra, cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_a_real_installers_records_are_read(world: tuple[Path, Path, Path],
                                            tmp_path: Path) -> None:
    prefix, _channel, _cache = world
    doc = snapshot(prefix, tmp_path / "s.json", "--verify", "hash")
    conda = {p["name"]: p for p in doc["conda"]}  # type: ignore[union-attr]
    assert set(conda) == {"cudatoolkit", "nccl", "mkl", "libfoo"}
    cuda = conda["cudatoolkit"]
    assert (cuda["version"], cuda["build"], cuda["subdir"]) == ("11.8.0", "h6a678d5_0", "noarch")
    assert cuda["md5"] and cuda["sha256"] and cuda["fingerprint"] and cuda["files"] == 1
    assert cuda["url"].startswith("file://") and cuda["url"].endswith(
        "cudatoolkit-11.8.0-h6a678d5_0.tar.bz2")
    # the placeholder file was rewritten to this prefix by rattler, and is not reported
    assert str(prefix) in (prefix / "etc/conda/activate.d/foo.sh").read_text()
    assert not [i for i in doc["integrity"]["issues"]  # type: ignore[index]
                if i["package"].startswith("conda:")]
    # counted like a venv's files: 4 checked (cudatoolkit 1, nccl 2, mkl 1), the rewritten one
    # tolerated
    assert doc["integrity"]["checked_files"] == 4  # type: ignore[index]
    assert doc["integrity"]["tolerated"] == 1  # type: ignore[index]


def test_cuda_upgrade_and_removed_mkl_found_and_no_change_is_equivalent(
        world: tuple[Path, Path, Path], tmp_path: Path) -> None:
    prefix, channel, cache = world
    snapshot(prefix, tmp_path / "good.json")
    snapshot(prefix, tmp_path / "again.json")
    same = envguard("diff", "good.json", "again.json", cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
    install(prefix, channel, ["cudatoolkit==12.1.0", "nccl", "libfoo"], cache)
    assert not (prefix / "lib/libmkl_rt.so.2").exists()  # rattler unlinked it
    snapshot(prefix, tmp_path / "bad.json")
    proc = envguard("diff", "good.json", "bad.json", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    findings = {f["rule"]: f for f in json.loads(proc.stdout)["findings"]}
    changed = findings["conda-package-changed"]
    assert changed["severity"] == "critical" and "cudatoolkit" in changed["title"]
    assert "mkl" in findings["conda-package-removed"]["title"]
    assert findings["cuda-build-changed"]["title"] == (
        "the conda CUDA packages changed (cu11 → cu12)")


def test_altered_and_missing_files(world: tuple[Path, Path, Path], tmp_path: Path) -> None:
    prefix, _channel, _cache = world
    (prefix / "lib/libnccl.so.2").write_bytes(b"N" * 200)  # same size, other content
    (prefix / "include/nccl.h").unlink()
    doc = snapshot(prefix, tmp_path / "s.json", "--verify", "hash")
    issues = {(i["package"], i["path"].rsplit("/", 1)[-1]): i["problem"]
              for i in doc["integrity"]["issues"]}  # type: ignore[index]
    assert issues == {("conda:nccl", "libnccl.so.2"): "hash",
                      ("conda:nccl", "nccl.h"): "missing"}


def test_channel_change(venvs: VenvFactory, tmp_path: Path) -> None:
    forge, other = tmp_path / "forge", tmp_path / "other"
    for channel in (forge, other):
        package(channel, "nccl", "2.18.5.1", "h6103f9b_0", {"lib/libnccl.so.2": b"n" * 200})
    a, b = venvs.create("from-forge").path, venvs.create("from-other").path
    install(a, forge, ["nccl"], tmp_path / "c1")
    install(b, other, ["nccl"], tmp_path / "c2")
    snapshot(a, tmp_path / "a.json")
    snapshot(b, tmp_path / "b.json")
    proc = envguard("diff", "a.json", "b.json", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    rules = {f["rule"] for f in json.loads(proc.stdout)["findings"]}
    assert "conda-channel-changed" in rules


STAND_IN = '''#!{python}
"""A stand-in for micromamba (not installed on the test machines): `create --yes --prefix P
--file F` installs exactly the archives F lists, with py-rattler."""
import asyncio, json, os, sys
from pathlib import Path
import rattler
args = sys.argv[1:]
Path({log!r}).write_text(json.dumps(args))
prefix, spec = Path(args[args.index("--prefix") + 1]), Path(args[args.index("--file") + 1])
urls = [ln.split("#")[0] for ln in spec.read_text().splitlines()
        if ln and not ln.startswith(("#", "@"))]
channel = Path(urls[0].removeprefix("file://")).parent.parent
specs = []
for url in urls:
    name, version, build = url.rsplit("/", 1)[1].removesuffix(".tar.bz2").rsplit("-", 2)
    specs.append(f"{{name}} =={{version}} {{build}}")
async def main():
    records = await rattler.solve(sources=[rattler.Channel(channel.as_uri())], specs=specs,
                                  platforms=["linux-64", "noarch"])
    await rattler.install(records, target_prefix=prefix, show_progress=False,
                          cache_dir={cache!r})
asyncio.run(main())
print("stand-in micromamba: installed", len(specs), "package(s)", flush=True)
# py-rattler's runtime crashed once in the interpreter's teardown (SIGSEGV after the
# install and the line above, on a loaded 2-core VM): leave without the teardown.
os._exit(0)
'''


def test_restore_writes_explicit_spec_and_environment_yml(
        world: tuple[Path, Path, Path], tmp_path: Path) -> None:
    prefix, _channel, cache = world
    snapshot(prefix, tmp_path / "good.json")
    # no conda tool on PATH: the spec files are written, the commands shown, exit 4
    bare = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "MAMBA_EXE": "",
            "CONDA_EXE": ""}
    proc = envguard("restore", "good.json", "--into", tmp_path / "new", cwd=tmp_path,
                    env=bare)
    assert proc.returncode == 4, proc.stderr
    assert "no micromamba, mamba or conda on PATH" in proc.stderr
    assert f"micromamba create --yes --prefix {tmp_path / 'new'} --file " in proc.stdout
    explicit = (tmp_path / "good.conda-explicit.txt").read_text().splitlines()
    assert "@EXPLICIT" in explicit
    urls = [ln for ln in explicit if ln.startswith("file://")]
    assert len(urls) == 4 and all("#" in u and len(u.rsplit("#", 1)[1]) == 32 for u in urls)
    yml = (tmp_path / "good.environment.yml").read_text()
    assert "  - " + _channel_line(tmp_path / "good.json") in yml
    assert "cudatoolkit=11.8.0=h6a678d5_0" in yml
    # the same plan as a report: JSON and Markdown, written whether or not a tool is here
    for fmt in ("json", "markdown"):
        dry = envguard("restore", "good.json", "--into", tmp_path / "new", "--dry-run",
                       "--format", fmt, cwd=tmp_path, env=bare)
        assert dry.returncode == 0, dry.stderr
        if fmt == "json":
            conda = json.loads(dry.stdout)["conda"]
            assert conda["packages"] == 4 and conda["built"] is False and conda["tools"] == []
        else:
            assert dry.stdout.startswith("## envguard restore: good.json (conda)")
            assert f"micromamba create --yes --prefix {tmp_path / 'new'} --file " in dry.stdout
    # a (stand-in) micromamba on PATH: the prefix is built from the explicit file, then checked
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "micromamba-args.json"
    stand_in = tools / "micromamba"
    stand_in.write_text(STAND_IN.format(python=sys.executable, log=str(log), cache=str(cache)))
    stand_in.chmod(0o755)
    target = tmp_path / "rebuilt"
    proc = envguard("restore", "good.json", "--into", target, cwd=tmp_path,
                    env={"PATH": f"{tools}:{bare['PATH']}"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(log.read_text()) == ["create", "--yes", "--prefix", str(target), "--file",
                                           str(tmp_path / "good.conda-explicit.txt")]
    assert "verified: the conda packages match GOOD" in proc.stdout
    assert sorted(p.name for p in (target / "conda-meta").glob("*.json")) == sorted(
        p.name for p in (prefix / "conda-meta").glob("*.json"))


def _channel_line(snapshot_path: Path) -> str:
    doc = json.loads(snapshot_path.read_text())
    return doc["conda"][0]["channel"]
