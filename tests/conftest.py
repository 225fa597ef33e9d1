"""Shared fixtures: real venvs built with uv from wheels the tests make themselves."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files, find_uv

UV = find_uv()
requires_uv = pytest.mark.skipif(UV is None, reason="uv is not installed")


@pytest.fixture(scope="session", autouse=True)
def _isolated_uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """uv installs by hard-linking from its cache, so a test that patches an installed file
    in place would patch the cached copy too, and every later venv (this session's, or
    the developer's own) would get the patched file. Copy instead, into a cache of our own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache")))
        mp.setenv("UV_LINK_MODE", "copy")
        # A machine's own pip settings (this VM sets PIP_FIND_LINKS to a local wheel folder)
        # would reach every pip the tests run: installs resolve from the tests' wheels only.
        for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
            mp.delenv(var, raising=False)
        # The suite's own venv first on PATH, as `uv run pytest` puts it: a command run
        # outside any environment takes the python3 on PATH (docs/CLI.md), and that must be
        # this venv whether the suite was started by uv or by .venv/bin/python directly.
        mp.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                            os.environ.get("PATH", "")]))
        yield


@pytest.fixture(scope="session")
def _bytecode_pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``.pyc`` files envguard's commands compiled in any test's home, for the next."""
    pool = tmp_path_factory.mktemp("bytecode-pool")
    pool.chmod(0o700)
    return pool


def _link_pyc(src: Path, dst: Path) -> None:
    """Hard link every ``.pyc`` under ``src`` that ``dst`` lacks into the same place under
    ``dst`` (folders 0700, as envguard.bytecode requires of its own)."""
    for folder, _dirs, files in os.walk(src):
        rel = os.path.relpath(folder, src)
        out = dst if rel == "." else dst / rel
        made = False
        for name in files:
            if not name.endswith(".pyc"):
                continue
            if not made:
                out.mkdir(mode=0o700, parents=True, exist_ok=True)
                made = True
            target = out / name
            if not target.exists():
                with contextlib.suppress(OSError):  # raced, or another filesystem
                    os.link(os.path.join(folder, name), target)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                   _bytecode_pool: Path) -> Iterator[None]:
    """Keep envguard's and dflash's caches, mask key and compile-cache markers out of the
    real home.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this project's VMs and CI), an envguard
    command keeps its compiled modules in ``<cache>/bytecode`` (envguard.bytecode), and a
    new home meant compiling them from source again: 0.33 s of the first command of every
    test (0.58 s against 0.25 s for a snapshot). The homes share them instead, through
    hard links to a session pool (a ``.pyc`` is written atomically, so a link never sees
    a half-written one); the tests of the mechanism itself use folders of their own."""
    home = tmp_path_factory.mktemp("home")
    share = (bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
             and not os.environ.get("PYTHONPYCACHEPREFIX"))
    bytecode = home / "cache" / "bytecode"
    if share:
        (home / "cache").mkdir(mode=0o700)
        _link_pyc(_bytecode_pool, bytecode)
    monkeypatch.setenv("ENVGUARD_CACHE_DIR", str(home / "cache"))
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(home / "dflash"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(home / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(home / "triton"))
    monkeypatch.setenv("CUDA_CACHE_PATH", str(home / "nv"))
    monkeypatch.delenv("ENVGUARD_MASK_KEY", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    # A dflash-train launched with a new bytecode folder (every test's home is new)
    # compiles all of torch in a detached background process (dflash.cli.precompile):
    # dozens of them outlived their tests and took the cores from the rest of the suite.
    # tests/dflash/test_precompile.py starts it on purpose.
    monkeypatch.setenv("DFLASH_NO_PRECOMPILE", "1")
    yield
    if share and bytecode.is_dir():
        _link_pyc(bytecode, _bytecode_pool)


@pytest.fixture
def wheel_dir(tmp_path: Path) -> Path:
    path = tmp_path / "wheels"
    path.mkdir()
    return path


def venv_factory(root: Path, wheels: Path | None = None) -> VenvFactory:
    """The one way the suite makes venvs: ``root/venvs/<name>``, installing offline from
    ``wheels`` (``root/wheels`` unless given). Skips the test when uv is missing."""
    if UV is None:
        pytest.skip("uv is not installed")
    wheels = wheels if wheels is not None else root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    (root / "venvs").mkdir(parents=True, exist_ok=True)
    return VenvFactory(root / "venvs", wheels, UV)


@pytest.fixture
def venvs(tmp_path: Path, wheel_dir: Path) -> VenvFactory:
    """A venv factory for one test; its wheels go to :func:`wheel_dir`."""
    return venv_factory(tmp_path, wheel_dir)


@pytest.fixture(scope="module")
def module_venvs(tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> VenvFactory:
    """A venv factory shared by one test module's module-scoped fixtures (venvs are slow to
    build: a module builds its scene once and its tests only read it, or undo what they do)."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    return venv_factory(tmp_path_factory.mktemp(name))


@pytest.fixture
def clean_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory outside any git repo or pyproject."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    return cwd


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def small_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    """Share the RECORD check's stat work for any number of rows, as if on 4 cores (real
    forks, real stat calls): :mod:`envguard.probe.fastpath.statahead`."""
    from envguard.probe.fastpath import rows, statahead

    monkeypatch.setattr(statahead, "FORK_MIN_ROWS", 1)
    monkeypatch.setattr(statahead, "UNIT_ROWS", 2)
    monkeypatch.setattr(rows, "CHUNK_ROWS", 2)
    monkeypatch.setattr(statahead, "usable_cpus", lambda: 4)


@pytest.fixture
def fork_always(small_shares: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As ``small_shares``, even if an earlier test left a thread running in this pytest
    process (the workers only stat files, which takes no lock another thread holds)."""
    from envguard.probe.fastpath import statahead

    monkeypatch.setattr(statahead, "fork_is_safe", lambda: True)
    with warnings.catch_warnings():  # Python 3.12+ warns about fork with threads
        warnings.filterwarnings("ignore", message=".*fork", category=DeprecationWarning)
        yield


@pytest.fixture
def torch_and_tiny(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    """A venv with a fake torch and a tiny package, installed by uv: what the stat-ahead and
    records-memo tests snapshot."""
    made = venvs.create()
    venvs.uv_install(made, build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files()),
                     build_wheel(wheel_dir, "tiny", "1.0", {"tiny/__init__.py": "x = 1\n",
                                                           "tiny/data.txt": "data\n"}))
    return made


@pytest.fixture
def uv_hardlinks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """uv as it installs by default on Linux: by hard link from its cache, here a cache this
    test owns (the session's ``UV_LINK_MODE=copy`` and shared cache are overridden for this
    test alone, so an edit cannot reach another test's venvs). Returns the cache folder."""
    cache = tmp_path / "uv-cache"
    monkeypatch.setenv("UV_CACHE_DIR", str(cache))
    monkeypatch.setenv("UV_LINK_MODE", "hardlink")
    return cache


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (nox's integrations) runs too
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist: all of tests/dflash on one worker (its session fixtures, a
    trained drafter and a torchrun job, are built once), every other file whole on one
    worker (its module-scoped venvs are built once)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/dflash" if path.startswith("tests/dflash/") else path

    return ByFile(config, log)
