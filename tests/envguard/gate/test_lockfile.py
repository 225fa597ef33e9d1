"""Lockfiles as data: the TOML round trip, hostile and malformed files, and closure().

The malformed-file cases run the real CLI (``python -m envguard check`` and ``run``) in a
temporary project: every bad lock is exit 2 with one stderr line that names the file.
closure() is run on a snapshot of a real uv-built venv whose tiny wheels carry markers
and extras.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from envguard.errors import InputError, UnsupportedSchemaError
from envguard.exitcodes import ExitCode
from envguard.gate import read_lock
from envguard.gate.lockfile import (
    DEFAULT_FORBIDDEN,
    Lock,
    LockedFile,
    LockedPackage,
    LockEntry,
    closure,
    dump_lock,
    parse_lock,
    project_requires,
)
from envguard.model import Snapshot
from envguard.probe import SnapshotOptions, collect
from envguard.redact import redact_text
from tests.wheelfactory import VenvFactory, build_wheel

HOSTILE = (
    'quote " inside',
    "back\\slash\\\\double",
    "line1\nline2\r\n",
    "\x1b[31mred\x1b[0m",
    "nul\x00byte",
    "del\x7f",
    "tab\there",
    '"""triple"""',
    "'''single'''",
    "\\u0041 is not A",
    "ünï©ødé 🚀 \u2028 \ufeff",
    'x"\nname = "evil"\n[[environment]]\nid = "injected',
    "",
)


def _inside(text: str) -> str:
    """A hostile text as a ``snapshot_file`` the reader takes: one name inside the lock's
    folder (a path climbing out is refused: tests/envguard/test_hostile_state_reads.py)."""
    for bad in ("/", "\\", "\x00"):
        text = text.replace(bad, "_")
    return f"demo.snapshots/e-{text}.json"


def hostile_lock(texts: tuple[str, ...] = HOSTILE) -> Lock:
    t = list(texts)
    return Lock(
        name=t[0], command=t[1], distribution=t[2], extras=tuple(t[3:6]),
        cache_policy="require-warm", forbidden=tuple(t), file_patterns=(t[6], t[7]),
        files=tuple(LockedFile(path=p, md5=p[::-1], sha256=p + p) for p in t),
        entries=(
            LockEntry(id=t[8], created_at=t[9], python_implementation=t[10],
                      python_version=t[11], torch_version=t[12], torch_git_version=t[0],
                      torch_cuda=None, triton_version=t[1],
                      packages=tuple(LockedPackage(name=p, version=p[::-1],
                                                   fingerprint=p or None) for p in t),
                      snapshot_digest=None, snapshot_file=_inside(t[2])),
            LockEntry(id="plain", created_at="", python_implementation="cpython",
                      python_version="3.11", packages=(
                          LockedPackage(name="p", version="1", fingerprint="sha256:00"),)),
        ),
    )


def test_round_trip_with_hostile_strings(tmp_path: Path) -> None:
    lock = hostile_lock()
    text = dump_lock(lock)
    assert parse_lock(text, "mem") == lock
    assert dump_lock(parse_lock(text, "mem")) == text  # deterministic
    path = tmp_path / "hostile.toml"
    path.write_text(text, encoding="utf-8")
    assert read_lock(path) == lock
    # Nothing a string holds can start a table or a key of its own.
    assert [e.id for e in read_lock(path).entries] == [HOSTILE[8], "plain"]


def test_only_missing_values_are_left_out() -> None:
    entry = LockEntry(id="e", created_at="", python_implementation="cpython",
                      python_version="3.11", torch_version="", torch_git_version=None,
                      packages=(LockedPackage(name="p", version="", fingerprint=""),
                                LockedPackage(name="q", version="1", fingerprint=None)))
    lock = Lock(name="n", command="n", distribution="d", entries=(entry,))
    text = dump_lock(lock)
    assert 'torch_version = ""' in text and "torch_git_version" not in text
    assert parse_lock(text, "mem") == lock  # "" stays "", None stays None


_chars = st.characters(exclude_categories=["Cs"])  # lone surrogates are not text
_text = st.text(alphabet=_chars, max_size=24)


@settings(max_examples=150, deadline=None, database=None)
@given(texts=st.lists(_text, min_size=13, max_size=13).map(tuple),
       fingerprint=st.none() | _text)
def test_round_trip_property(texts: tuple[str, ...], fingerprint: str | None) -> None:
    # A lock is redacted as it is read: the round trip holds for text with no credential
    assume(all(redact_text(t) == t for t in (*texts, fingerprint or "")))
    lock = hostile_lock(texts)
    entry = dataclasses.replace(lock.entries[1], packages=(
        LockedPackage(name="p", version="1", fingerprint=fingerprint),))
    lock = dataclasses.replace(lock, entries=(lock.entries[0], entry))
    assert parse_lock(dump_lock(lock), "mem") == lock


def test_default_forbidden_survives_and_newer_schema_is_refused() -> None:
    lock = Lock(name="n", command="n", distribution="d")
    text = dump_lock(lock)
    assert parse_lock(text, "x").forbidden == DEFAULT_FORBIDDEN
    minor = text.replace('schema = "envguard.lock/1"', 'schema = "envguard.lock/1.7"')
    assert parse_lock(minor, "x") == lock  # a newer minor is still read
    with pytest.raises(UnsupportedSchemaError, match=r"^x: lock schema envguard\.lock/2 "):
        parse_lock(text.replace('"envguard.lock/1"', '"envguard.lock/2"'), "x")


# ---------------------------------------------------------------------------- bad lockfiles

def _valid_text(*, packages: bool = True) -> str:
    pinned = (LockedPackage(name="torch", version="2.11.0+cu128", fingerprint="sha256:00"),)
    return dump_lock(Lock(
        name="demo-train", command="demo-train", distribution="demo-train",
        file_patterns=("src/*.py",),
        files=(LockedFile(path="src/x.py", md5="0" * 32, sha256="0" * 64),),
        entries=(LockEntry(id="e1", created_at="2026-01-01T00:00:00Z",
                           python_implementation="cpython", python_version="3.11",
                           torch_version="2.11.0+cu128",
                           packages=pinned if packages else ()),)))


def _edit(old: str, new: str) -> str:
    text = _valid_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


BAD_LOCKS: dict[str, tuple[str | bytes, str]] = {
    "malformed": ("schema = \n[[[", "not valid TOML"),
    "truncated": (_valid_text()[:-40], "not valid TOML"),
    "schema-2": (_edit('"envguard.lock/1"', '"envguard.lock/2"'), "newer than this envguard"),
    "no-schema": (_edit('schema = "envguard.lock/1"\n', ""), "not an envguard lockfile"),
    "other-tool": ('[project]\nname = "x"\n', "not an envguard lockfile"),
    "no-name": (_edit('name = "demo-train"\n', ""), "missing 'name'"),
    "name-int": (_edit('name = "demo-train"', "name = 7"), "'name' must be str, not int"),
    "version-float": (_edit('python_version = "3.11"', "python_version = 3.11"),
                      "'python_version' must be str, not float"),
    "created-datetime": (_edit('created_at = "2026-01-01T00:00:00Z"',
                               "created_at = 2026-01-01T00:00:00Z"), "must be str, not datetime"),
    "files-str": (_edit('files = [\n    "src/*.py",\n]', 'files = "src/*.py"'),
                  "'files' must be list, not str"),
    "extras-ints": (_edit("extras = []", "extras = [1, 2]"), "'extras' must be a list of strings"),
    "environment-table": (_edit("[[environment]]", "[environment]"),
                          "'environment' must be list, not dict"),
    "packages-not-tables": (_valid_text(packages=False).replace(
        'torch_version = "2.11.0+cu128"', 'torch_version = "2.11.0+cu128"\npackages = [1]'),
        "'packages' must be an array of tables"),
    "file-md5-bool": (_edit('md5 = "' + "0" * 32 + '"', "md5 = true"), "'md5' must be str"),
    "cache-policy": (_edit('cache_policy = "warn-if-cold"', 'cache_policy = "sometimes"'),
                     "cache_policy must be one of"),
    "deeply-nested": ("x = " + "[" * 5000, "nested too deeply"),
    "huge-integer": ("x = 1" + "0" * 5000, "not a usable lockfile"),
    "not-utf8": (b"\xff\xfe\x00name", "cannot read"),
}


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("case", sorted(BAD_LOCKS))
def test_bad_lockfile_is_one_line_exit_2(tmp_path: Path, case: str, command: str) -> None:
    content, needle = BAD_LOCKS[case]
    project = (tmp_path / "project").resolve()
    (project / "lockfiles").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "scratch"\nversion = "0"\n')
    lock = project / "lockfiles" / "demo-train.toml"
    if isinstance(content, bytes):
        lock.write_bytes(content)
    else:
        lock.write_text(content, encoding="utf-8")
    ran = tmp_path / "ran"
    script = tmp_path / "bin" / "demo-train"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\ntouch '{ran}'\n")
    script.chmod(0o755)
    args = ["check", "demo-train"] if command == "check" else ["run", "--", str(script), "0"]
    env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
    proc = subprocess.run([sys.executable, "-m", "envguard", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == ExitCode.USAGE, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"envguard: error: {lock}: "), lines[0]
    assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not ran.exists()
    assert not (project / ".envguard").exists()


def test_bad_lockfiles_raise_input_error_in_process() -> None:
    for case, (content, needle) in BAD_LOCKS.items():
        if isinstance(content, bytes):
            continue  # decoding is read_lock's job
        with pytest.raises(InputError, match=r"^src\.toml: ") as info:
            parse_lock(content, "src.toml")
        assert needle in str(info.value), case


# ---------------------------------------------------------------------------- closure

@pytest.fixture
def marker_snapshot(venvs: VenvFactory) -> Snapshot:
    """A real venv: app requires lib[fast] and some packages only under markers or extras."""
    w = venvs.wheels
    wheels = [
        build_wheel(w, "app", "1.0", {"app/__init__.py": ""}, requires=(
            "LIB[Fast]>=1",
            "old ; python_version < '3.0'",
            "gpuonly ; extra == 'gpu'",
            "armonly ; platform_machine == 'arm64'",
            "winonly ; sys_platform == 'win32'",
            "linuxonly ; sys_platform == 'linux' and platform_machine != 'arm64'",
        )),
        build_wheel(w, "lib", "1.0", {"lib/__init__.py": ""}, requires=(
            "speedy ; extra == 'fast'", "slowpoke ; extra == 'slow'")),
        build_wheel(w, "gpuonly", "1.0", {"gpuonly/__init__.py": ""}, requires=("deep",)),
    ]
    for name in ("speedy", "slowpoke", "old", "armonly", "winonly", "linuxonly", "deep"):
        wheels.append(build_wheel(w, name, "1.0", {f"{name}/__init__.py": ""}))
    env = venvs.create()
    venvs.uv_install(env, *wheels)
    snap = collect(SnapshotOptions(python=str(env.python), use_project_config=False))
    assert {"app", "lib", "old", "winonly", "deep"} <= {p.name for p in snap.packages}
    return snap


def _as(snapshot: Snapshot, *, platform: str | None = None,
        version: str | None = None) -> Snapshot:
    """The same snapshot, as if taken by an interpreter on another platform or version."""
    interp = snapshot.interpreter
    return dataclasses.replace(snapshot, interpreter=dataclasses.replace(
        interp, platform=platform or interp.platform, version=version or interp.version))


def test_closure_evaluates_markers_for_the_target(marker_snapshot: Snapshot) -> None:
    snap = _as(marker_snapshot, platform="linux-x86_64")
    assert closure(snap, "app") == ["app", "lib", "linuxonly", "speedy"]
    # The same installed packages seen as another interpreter's.
    assert "old" in closure(_as(snap, version="2.7.18"), "app")
    mac = closure(_as(snap, platform="macosx-14.0-arm64"), "app")
    assert "armonly" in mac and "linuxonly" not in mac
    assert "winonly" in closure(_as(snap, platform="win-amd64"), "app")


def test_closure_follows_extras_only_when_requested(marker_snapshot: Snapshot) -> None:
    snap = _as(marker_snapshot, platform="linux-x86_64")
    assert "slowpoke" not in closure(snap, "app")  # lib is wanted with [fast] only
    assert closure(snap, "lib") == ["lib"]
    assert closure(snap, "lib", ("slow",)) == ["lib", "slowpoke"]
    assert closure(snap, "app", ("gpu",)) == ["app", "deep", "gpuonly", "lib", "linuxonly",
                                              "speedy"]
    assert closure(snap, "app", ("no-such-extra",)) == closure(snap, "app")


def test_closure_of_an_uninstalled_project(marker_snapshot: Snapshot, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "My_Trainer"\nversion = "0"\ndependencies = ["lib"]\n'
        "[project.optional-dependencies]\n"
        "gpu = [\"gpuonly ; python_version >= '3' or sys_platform == 'nonexistent'\"]\n")
    requires = project_requires(tmp_path, "my-trainer")
    assert requires is not None
    assert project_requires(tmp_path, "someone-else") is None
    snap = _as(marker_snapshot, platform="linux-x86_64")
    # "a or b" in an optional dependency still needs the extra.
    assert closure(snap, "my-trainer", (), requires) == ["lib"]
    assert closure(snap, "my-trainer", ("gpu",), requires) == ["deep", "gpuonly", "lib"]
