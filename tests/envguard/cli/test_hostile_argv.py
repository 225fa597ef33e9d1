"""Nothing read from a document or an environment becomes a command-line option or code.

A distribution whose METADATA names it ``-e/…/evil``, a snapshot whose interpreter version
is a script's path, a PEP 610 ``subdirectory`` that climbs out, non-UTF-8 bytes on the
command line: each is refused with one line (exit 2), never passed to uv, pip or conda,
and never an internal error. The argv builder (envguard/explain/remedies.py) is checked
with hypothesis: whatever the name, nothing that starts with ``-`` sits where a tool reads
an option, and the printed remedy is the same argv, quoted.

Real venvs built with uv, real subprocesses of ``python -m envguard``, the real uv where
a planted build backend or script would leave a marker file if it ran.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wheelfactory import Venv, VenvFactory, build_wheel

PY = sys.executable
BASE_ENV = {k: v for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "ENVGUARD_PYTHON", "LD_PRELOAD")}
OFFLINE = {"UV_OFFLINE": "1", "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}


def envguard(*args: str | Path | bytes, cwd: Path, extra: dict[str, str] | None = None,
             timeout: float = 180) -> subprocess.CompletedProcess[bytes]:
    argv = [os.fsencode(a) if not isinstance(a, bytes) else a for a in args]
    return subprocess.run([os.fsencode(PY), b"-m", b"envguard", *argv], cwd=cwd,
                          env={**BASE_ENV, **OFFLINE, **(extra or {})}, capture_output=True,
                          timeout=timeout, check=False)


def one_line_refusal(proc: subprocess.CompletedProcess[bytes]) -> str:
    """The refusal: exit 2, one line on stderr (environment notes aside), no traceback."""
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, (proc.returncode, err)
    lines = [ln for ln in err.strip().splitlines() if "envguard: environment:" not in ln]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


# ------------------------------------------------------------------ a hostile METADATA name

@pytest.fixture
def evil_root() -> Iterator[Path]:
    """A folder whose path survives PEP 503 normalisation unchanged (letters and digits
    only), so that ``-e<path>/evil==1.0`` names a real folder: a project whose in-tree
    build backend writes MARKER when uv imports it."""
    root = Path(f"/tmp/egevil{secrets.token_hex(6)}")
    project = root / "evil==1.0"
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    (project / "backend.py").write_text(
        f"import pathlib\npathlib.Path({str(root / 'MARKER')!r}).write_text('ran')\n"
        "raise SystemExit('the planted build backend ran')\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _edited(venvs: VenvFactory, wheel_dir: Path, name: str | None) -> Venv:
    """A venv with helperlib 1.0 whose file was edited (so doctor --fix plans a reinstall),
    installed from no URL (so the reinstall is by name); ``name``: what its METADATA
    says its name is instead."""
    env = venvs.create("job")
    venvs.uv_install(env, build_wheel(wheel_dir, "helperlib", "1.0",
                                      {"helperlib/__init__.py": "V = 1\n"}))
    info = env.site_packages() / "helperlib-1.0.dist-info"
    (info / "direct_url.json").unlink(missing_ok=True)
    if name is not None:
        meta = info / "METADATA"
        meta.write_text(meta.read_text().replace("Name: helperlib", f"Name: {name}"))
    edited = env.site_packages() / "helperlib" / "__init__.py"
    edited.unlink()
    edited.write_text("V = 2  # patched\n")
    return env


def test_doctor_fix_refuses_a_distribution_named_like_an_option(
        venvs: VenvFactory, wheel_dir: Path, evil_root: Path, clean_cwd: Path) -> None:
    """``Name: -e/…/evil`` in METADATA: before, ``doctor --fix`` ran
    ``uv pip install … -e/…/evil==1.0`` and uv built (ran) that folder's backend."""
    env = _edited(venvs, wheel_dir, f"-e{evil_root}/evil")
    for extra in ((), ("--dry-run",)):
        proc = envguard("doctor", "--python", env.python, "--fix", "-q", *extra,
                        cwd=clean_cwd)
        assert not (evil_root / "MARKER").exists(), proc.stderr
        line = one_line_refusal(proc)
        assert f"packages.-e{evil_root}/evil.name" in line and "not a valid" in line
    # the report's own remedies never hold it as a command either
    doc = json.loads(envguard("doctor", "--python", env.python, "--format", "json", "-q",
                              cwd=clean_cwd).stdout)
    for finding in doc["findings"]:
        for remedy in finding["remedy"]:
            if "evil" in remedy:
                assert remedy.startswith("(no command: ") or not remedy.startswith("uv"), remedy
    assert not (evil_root / "MARKER").exists()


def _fake_uv(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "uv-argv"
    fake = tmp_path / "fake-uv"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done >> "
                    f"{shlex.quote(str(log))}\nprintf '\\n' >> {shlex.quote(str(log))}\n")
    fake.chmod(0o755)
    return fake, log


def _doctor_with_uv(uv: Path, python: Path, cwd: Path, *args: str
                    ) -> subprocess.CompletedProcess[bytes]:
    """``envguard doctor`` in a subprocess whose uv is ``uv`` (find_uv patched)."""
    code = ("import sys, envguard.restore.build as b\n"
            f"b.find_uv = lambda: {str(uv)!r}\n"
            "from envguard.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([PY, "-c", code, "doctor", "--python", str(python), "-q", *args],
                          cwd=cwd, env={**BASE_ENV, **OFFLINE}, capture_output=True,
                          timeout=180, check=False)


def test_doctor_fix_puts_the_requirement_after_double_dash(
        venvs: VenvFactory, wheel_dir: Path, tmp_path: Path, clean_cwd: Path) -> None:
    env = _edited(venvs, wheel_dir, None)
    uv, log = _fake_uv(tmp_path)
    plan = _doctor_with_uv(uv, env.python, clean_cwd, "--fix", "--dry-run")
    assert plan.returncode == 1, plan.stderr
    shown = plan.stderr.decode()
    printed = next(ln.strip() for ln in shown.splitlines() if " pip install " in ln)
    proc = _doctor_with_uv(uv, env.python, clean_cwd, "--fix")
    assert proc.returncode == 0, proc.stderr
    (argv,) = [line.split(b"\0")[:-1] for line in log.read_bytes().splitlines() if line]
    words = [w.decode() for w in argv]
    assert words == ["pip", "install", "--python", str(env.python), "--reinstall",
                     "--no-deps", "--", "helperlib==1.0"]
    # the plan printed is the argv run, quoted for the shell
    assert shlex.split(printed) == [str(uv), *words]


def test_printed_remedies_hold_no_placeholders() -> None:
    """A remedy is pasted as it is: no ``<file>``, ``<wheel>`` or ``<good commit>``."""
    from envguard.explain import explain
    from tests.incident import incident_pair

    good, now = incident_pair()
    remedies = [r for f in explain(good, now) for r in f.remedy]
    assert remedies
    assert not [r for r in remedies if re.search(r"<[a-z][^>]*>", r)], remedies


# ------------------------------------------------------------------ restore: interpreter

@pytest.fixture
def good_json(venvs: VenvFactory, wheel_dir: Path, tmp_path: Path,
              clean_cwd: Path) -> tuple[Venv, Path]:
    env = venvs.create("job")
    venvs.uv_install(env, build_wheel(wheel_dir, "helperlib", "1.0",
                                      {"helperlib/__init__.py": "V = 1\n"}))
    out = tmp_path / "good.json"
    proc = envguard("snapshot", "--python", env.python, "-q", "-o", out, cwd=clean_cwd)
    assert proc.returncode == 0, proc.stderr
    return env, out


def _rewrite(path: Path, change: object) -> None:
    doc = json.loads(path.read_text())
    change(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))


def test_restore_refuses_an_interpreter_version_that_is_a_script(
        good_json: tuple[Venv, Path], tmp_path: Path, clean_cwd: Path) -> None:
    env, good = good_json
    marker = tmp_path / "MARKER"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\n")
    script.chmod(0o755)
    _rewrite(good, lambda d: d["interpreter"].update(version=str(script)))
    into = tmp_path / "restored"
    for extra in (("--into", str(into)), ("--dry-run",)):
        proc = envguard("restore", good, "--python", env.python, "--no-index", "--offline",
                        *extra, cwd=clean_cwd)
        assert not marker.exists(), proc.stderr  # uv ran the "interpreter" to query it
        line = one_line_refusal(proc)
        assert "interpreter.version" in line
        assert not into.exists()


def test_bisect_never_hands_uv_an_interpreter_path_from_a_snapshot(tmp_path: Path) -> None:
    import dataclasses

    from envguard.bisection.engine import default_python
    from envguard.errors import InputError
    from tests.incident import incident_pair

    script = tmp_path / "evil.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    good, bad = incident_pair()
    bad = dataclasses.replace(bad, interpreter=dataclasses.replace(
        bad.interpreter, executable=str(script), version="3.12.4"))
    assert default_python(good, bad) == "3.12"
    hostile = dataclasses.replace(bad, interpreter=dataclasses.replace(
        bad.interpreter, version=str(script)))
    with pytest.raises(InputError, match=r"interpreter\.version"):
        default_python(good, hostile)


# ------------------------------------------------------------------ restore: subdirectory

@pytest.mark.parametrize("subdirectory", ["../../etc", "/etc", "-e", "pkg/../../x",
                                          "pkg dir", "pkg\nx", ""])
def test_restore_refuses_an_unusable_subdirectory(
        good_json: tuple[Venv, Path], clean_cwd: Path, subdirectory: str) -> None:
    env, good = good_json

    def change(doc: dict[str, object]) -> None:
        for dist in doc["packages"]:  # type: ignore[attr-defined]
            if dist["name"] == "helperlib":
                dist["direct_url"] = {"url": "https://example.com/helperlib-1.0.tar.gz",
                                      "subdirectory": subdirectory}

    _rewrite(good, change)
    proc = envguard("restore", good, "--python", env.python, "--dry-run", "--no-index",
                    cwd=clean_cwd)
    line = one_line_refusal(proc)
    assert "packages.helperlib.direct_url.subdirectory" in line


def test_a_usable_subdirectory_is_kept_where_uv_reads_it(tmp_path: Path) -> None:
    """``#subdirectory=`` on a VCS or archive URL; joined to the path of a local folder,
    where uv reads no fragment (``-e /proj#subdirectory=pkg`` builds /proj)."""
    from envguard.model import DirectUrl, Distribution
    from envguard.restore.plan import requirement_for

    def dist(direct: DirectUrl, editable: bool = False) -> Distribution:
        return Distribution(name="subpkg", version="1.0", location="/x", metadata_dir="d",
                            direct_url=direct, editable=editable)

    proj = tmp_path / "proj"
    (proj / "pkg" / "sub").mkdir(parents=True)
    vcs = DirectUrl(url="https://example.com/r.git", vcs="git", commit_id="abc123",
                    subdirectory="pkg/sub")
    assert requirement_for(dist(vcs))[0] == (
        "subpkg @ git+https://example.com/r.git@abc123#subdirectory=pkg/sub")
    archive = DirectUrl(url="https://example.com/subpkg-1.0.tar.gz", subdirectory="pkg")
    assert requirement_for(dist(archive))[0] == (
        "subpkg @ https://example.com/subpkg-1.0.tar.gz#subdirectory=pkg")
    folder = DirectUrl(url=proj.as_uri(), subdirectory="pkg/sub")
    assert requirement_for(dist(folder))[0] == f"subpkg @ {proj.as_uri()}/pkg/sub"
    editable = DirectUrl(url=proj.as_uri(), editable=True, subdirectory="pkg/sub")
    assert requirement_for(dist(editable, True))[0] == f"-e {proj / 'pkg' / 'sub'}"
    gone = DirectUrl(url=proj.as_uri(), editable=True, subdirectory="nothere")
    assert requirement_for(dist(gone, True))[0] is None


# ------------------------------------------------------------------ non-UTF-8 arguments

def test_non_utf8_lock_options_are_one_line_refusals(tmp_path: Path) -> None:
    bad = b"x\xff"
    base: list[str | bytes] = ["lock", "demo", "--python", PY, "--distribution", "envguard"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / os.fsdecode(b"f\xff.txt")).write_text("x")
    for args in ([*base, "--file", bad], [*base, "--forbid", bad], [*base, "--extra", bad],
                 ["lock", "demo", "--python", PY, "--distribution", bad],
                 [*base, "--file", "sub/*"]):
        proc = envguard(*args, cwd=tmp_path)
        line = one_line_refusal(proc)
        assert "UTF-8" in line, args
    assert not (tmp_path / "lockfiles" / "demo.toml").exists()
    snapshots = tmp_path / "lockfiles" / "demo.snapshots"  # a refused lock leaves no part
    assert not snapshots.exists() or not any(snapshots.iterdir())


def test_non_utf8_restore_paths_are_written_escaped(good_json: tuple[Venv, Path],
                                                    tmp_path: Path) -> None:
    env, good = good_json
    odd = tmp_path / os.fsdecode(b"good\xff.json")
    shutil.copy(good, odd)
    reqs, lock = tmp_path / os.fsdecode(b"r\xff.txt"), tmp_path / os.fsdecode(b"p\xfe.toml")
    proc = envguard("restore", odd, "--python", env.python, "--dry-run", "--no-index",
                    "--requirements-out", reqs, "--pylock-out", lock, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = reqs.read_text(encoding="utf-8")
    assert "good\\udcff.json" in text and "helperlib @ file:" in text
    assert 'snapshot = "' in lock.read_text(encoding="utf-8")


# ------------------------------------------------------------------ the builder, by property

_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_VALUED = {"--python", "--index-url"}


def _no_option_smuggled(argv: list[str]) -> None:
    """Before ``--``: option values never start with ``-``; after it: nothing does."""
    cut = argv.index("--")
    for i, word in enumerate(argv[:cut]):
        if i and argv[i - 1] in _VALUED:
            assert not word.startswith("-"), argv
    assert all(not w.startswith("-") for w in argv[cut + 1:]), argv


@settings(max_examples=300, deadline=None)
@given(name=st.one_of(st.text(max_size=40), st.from_regex(_NAME, fullmatch=True)),
       version=st.one_of(st.text(max_size=20), st.sampled_from(
           ["1.0", "2.11.0+cu128", "1!2.0rc1.post3.dev4+local.7", "-1.0", "1.0 ; x"])))
def test_any_name_is_refused_or_cannot_be_an_option(name: str, version: str) -> None:
    from envguard.explain.remedies import UnsafeValue, pin, shell_line, uv_pip_install

    try:
        argv = uv_pip_install([pin(name, version, "packages.x")], python="/v/bin/python",
                              reinstall=True, no_deps=True)
    except UnsafeValue as exc:
        assert exc.exit_code == 2 and "\n" not in str(exc)
        assert not _NAME.fullmatch(name) or exc.field == "packages.x.version"
        return
    assert _NAME.fullmatch(name)
    _no_option_smuggled(argv)
    assert shlex.split(shell_line(argv)) == argv


@settings(max_examples=300, deadline=None)
@given(names=st.lists(st.one_of(st.text(min_size=1, max_size=30),
                                st.from_regex(_NAME, fullmatch=True),
                                st.sampled_from(["3.11", "3.12.4", "-3.11", "/tmp/x.sh"])),
                      min_size=1, max_size=4))
def test_uninstall_and_venv_builders_refuse_or_quote(names: list[str]) -> None:
    from envguard.explain.remedies import (
        UnsafeValue,
        shell_line,
        uv_cache_clean,
        uv_pip_uninstall,
        uv_venv,
    )

    for builder in (uv_pip_uninstall, uv_cache_clean):
        try:
            argv = builder(names)
        except UnsafeValue:
            assert not all(_NAME.fullmatch(n) for n in names)
        else:
            assert all(_NAME.fullmatch(n) for n in names)
            _no_option_smuggled(argv)
            assert shlex.split(shell_line(argv)) == argv
    try:
        venv = uv_venv(names[0], "/tmp/v")
    except UnsafeValue:
        assert not re.fullmatch(r"[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,4})?", names[0])
    else:
        assert venv == ["uv", "venv", "--python", names[0], "--", "/tmp/v"]


def test_a_chained_remedy_runs_both_or_says_why_not() -> None:
    from envguard.explain.remedies import chain, pin, uv_cache_clean, uv_pip_install

    def reinstall(name: str) -> list[str]:
        return uv_pip_install([pin(name, "1.0", f"packages.{name}")], reinstall=True)

    assert chain(lambda: uv_cache_clean(["torch"]), lambda: reinstall("torch")) == (
        'uv cache clean -- torch && uv pip install --reinstall -- "torch==1.0"')
    refused = chain(lambda: uv_cache_clean(["-e"]), lambda: reinstall("-e"))
    assert refused.startswith("(no command: packages.-e.name: '-e' is not a valid")
    assert "&&" not in refused
