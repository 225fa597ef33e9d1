"""The machinery of the regression corpus (docs/CASES.md).

Each case rebuilds the environment a public bug report describes, with tiny offline wheels
(:mod:`tests.wheelfactory`) installed by real ``uv`` into a real venv, runs the real
``envguard`` CLI on it as a subprocess and checks the rule ids it answers with.

Only what cannot exist on a test machine is faked, and each fake says so where it is made:

* ``nvidia-smi``: a shell script first on PATH that prints what the reported driver
  printed (:meth:`World.gpus`); every case gets one, by default answering "No devices were
  found", so a real GPU on the machine running the tests cannot change the outcome;
* compiled extensions: wheels with this interpreter's platform tag whose files are plain
  text (the rules read metadata and files, never machine code);
* CUDA libraries in an ``LD_LIBRARY_PATH`` folder: empty files with the real sonames.

Packages are installed with ``--no-deps`` so that each case holds exactly the distributions
the report lists; a case leaves out requirements the report does not show.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.tags import sys_tags

from tests.conftest import venv_factory
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

PLATFORM_TAG = str(next(t for t in sys_tags() if t.platform.startswith("manylinux")))
"""The most specific manylinux tag this interpreter installs
(``cp311-cp311-manylinux_2_36_x86_64``): what a compiled extension's wheel from an index
carries (a bare ``linux_x86_64`` tag means a wheel built on this machine)."""

_CLEARED = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE",
            "VIRTUAL_ENV", "CONDA_PREFIX", "CUDA_VISIBLE_DEVICES", "ENVGUARD_PYTHON",
            "ENVGUARD_VERIFIED", "ENVGUARD_SNAPSHOT", "TMPDIR")
"""Variables of the developer's shell that would leak into a case; a case sets its own."""

NO_GPU = "No devices were found"


class Shop:
    """Builds each wheel once per test module."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._built: dict[tuple[object, ...], Path] = {}

    def wheel(self, name: str, version: str, *, requires: tuple[str, ...] = (),
              compiled: bool = False, files: dict[str, str | bytes] | None = None,
              filename: str | None = None) -> Path:
        """``compiled``: a platform tag, as a wheel with C++/CUDA code has. ``filename``: the
        name the file is published under when it differs from the metadata's version."""
        key = (name, version, requires, compiled, filename,
               tuple(sorted((files or {}).items())))
        if key not in self._built:
            module = name.replace("-", "_")
            contents = files if files is not None else {
                f"{module}/__init__.py": f"__version__ = {version!r}\n"}
            path = build_wheel(self.folder / str(len(self._built)), name, version, contents,
                               requires=requires, tag=PLATFORM_TAG if compiled else "py3-none-any")
            if filename is not None:
                path = path.rename(path.with_name(filename))
            self._built[key] = path
        return self._built[key]

    def torch(self, version: str, cuda: str | None, *, requires: tuple[str, ...] = ()) -> Path:
        """torch as its wheels describe themselves: ``torch/version.py`` holds the CUDA."""
        return self.wheel("torch", version, requires=requires, compiled=True,
                          files=fake_torch_files(version=version, cuda=cuda))

    def cuda_wheel(self, name: str, version: str, soname: str) -> Path:
        """One of NVIDIA's library wheels, with its library where the real wheel puts it:
        ``nvidia/nccl/lib/libnccl.so.2`` for ``nvidia-nccl-cu12`` (and for ``-cu11``: both
        families write the same paths), ``nvidia/cu13/lib/...`` for the CUDA 13 ones."""
        family = name.rsplit("-", 1)[1] if name.endswith(("-cu11", "-cu12")) else None
        component = name.removeprefix("nvidia-").removesuffix(f"-{family}").replace("-", "_")
        folder = f"nvidia/{component}/lib" if family else "nvidia/cu13/lib"
        # Real libraries of two releases differ in size, which is what the default (size)
        # integrity check compares.
        size = int(hashlib.sha256(f"{name} {version}".encode()).hexdigest(), 16) % 4096
        return self.wheel(name, version, compiled=True,
                          files={f"{folder}/{soname}": f"{name} {version}\n" + "." * size})


@dataclass(frozen=True)
class Answer:
    """What one envguard command said."""

    returncode: int
    document: dict[str, Any]

    @property
    def rules(self) -> list[str]:
        """Rule ids, in envguard's order (most likely first)."""
        return [f["rule"] for f in self.document["findings"]]

    @property
    def first(self) -> str | None:
        return self.rules[0] if self.rules else None

    def evidence(self, rule: str) -> str:
        return "\n".join(line for f in self.document["findings"] if f["rule"] == rule
                         for line in f["evidence"])


@dataclass
class World:
    """One case: its venvs, fake tools and the variables envguard runs with."""

    tmp: Path
    venvs: VenvFactory
    shop: Shop
    variables: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.bin = self.tmp / "bin"
        self.work = self.tmp / "work"
        self.work.mkdir()
        self.gpus(NO_GPU)
        # A warm compile cache, so that only the cases about caches see a cache finding.
        self.inductor = self.tmp / "inductor"
        (self.inductor / "fxgraph").mkdir(parents=True)
        (self.inductor / "fxgraph" / "entry").write_text("compiled\n")
        self.variables.update({"TORCHINDUCTOR_CACHE_DIR": str(self.inductor),
                               "ENVGUARD_CACHE_DIR": str(self.tmp / "envguard-cache"),
                               "GIT_CEILING_DIRECTORIES": str(self.tmp)})

    # -- the environment ----------------------------------------------------------------

    def venv(self, *wheels: Path, name: str = "env") -> Venv:
        env = self.venvs.create(name)
        if wheels:
            self.install(env, *wheels)
        return env

    def install(self, env: Venv, *wheels: Path) -> None:
        """``uv pip install --no-deps``: exactly these wheels, whatever they require."""
        self._uv("install", "--no-deps", "--no-index", *map(str, wheels), env=env)

    def uninstall(self, env: Venv, *names: str) -> None:
        self._uv("uninstall", *names, env=env)

    def _uv(self, verb: str, *args: str, env: Venv) -> None:
        proc = subprocess.run([self.venvs.uv, "pip", verb, "--quiet", "--python",
                               str(env.python), *args], env=self.venvs._env(),
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr

    def gpus(self, *rows: str, rejects_compute_cap: bool = False) -> None:
        """Put a stand-in ``nvidia-smi`` first on PATH (no GPU or driver exists on a test
        machine). It answers envguard's CSV query (index, name, memory.total,
        driver_version, compute_cap) with ``rows``; ``rejects_compute_cap`` makes it answer
        as drivers older than 510 do, which do not know that field."""
        self.bin.mkdir(exist_ok=True)
        text = "\n".join(rows)
        reject = ""
        if rejects_compute_cap:
            reject = ('case "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid '
                      'field to query.\'; echo; exit 2;; esac\n')
            text = "\n".join(r.rsplit(",", 1)[0] for r in rows)
        script = self.bin / "nvidia-smi"
        script.write_text(f"#!/bin/sh\n# stand-in for NVIDIA's tool\n{reject}"
                          f"cat <<'EOF'\n{text}\nEOF\n")
        script.chmod(0o755)

    def libraries(self, folder: str, *sonames: str) -> Path:
        """A folder of CUDA libraries, as a system CUDA or a module load provides (empty
        files: the doctor reads names, never the libraries)."""
        path = self.tmp / folder.strip("/")
        path.mkdir(parents=True, exist_ok=True)
        for soname in sonames:
            (path / soname).write_bytes(b"")
        return path

    def environ(self, variables: Mapping[str, str | None] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
        env["PATH"] = f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"
        env.update(self.variables)
        for key, value in (variables or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    # -- envguard ---------------------------------------------------------------------------

    def envguard(self, *args: str | Path, variables: Mapping[str, str | None] | None = None
                 ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)],
                              cwd=self.work, env=self.environ(variables), capture_output=True,
                              text=True, timeout=120, check=False)

    def doctor(self, env: Venv, symptom: str | None = None,
               variables: Mapping[str, str | None] | None = None) -> Answer:
        args = ["doctor", "--python", env.python, "--format", "json", "-q"]
        proc = self.envguard(*args, *(["--symptom", symptom] if symptom else []),
                             variables=variables)
        assert proc.returncode in (0, 1), proc.stderr
        answer = Answer(proc.returncode, json.loads(proc.stdout))
        # Exit 1 exactly when a finding is at warning or above.
        serious = any(f["severity"] != "info" for f in answer.document["findings"])
        assert answer.returncode == int(serious), proc.stdout
        return answer

    def snapshot(self, env: Venv, name: str,
                 variables: Mapping[str, str | None] | None = None) -> Path:
        path = self.tmp / f"{name}.json"
        proc = self.envguard("snapshot", "--python", env.python, "-o", path, "-q",
                             variables=variables)
        assert proc.returncode == 0, proc.stderr
        return path

    def diff(self, good: Path, bad: Path, symptom: str | None = None) -> Answer:
        proc = self.envguard("diff", good, bad, "--format", "json",
                             *(["--symptom", symptom] if symptom else []))
        assert proc.returncode in (0, 1), proc.stderr
        return Answer(proc.returncode, json.loads(proc.stdout))


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Shop:
    return Shop(tmp_path_factory.mktemp("case-wheels"))


@pytest.fixture
def world(tmp_path: Path, shop: Shop) -> Iterator[World]:
    yield World(tmp_path, venv_factory(tmp_path, shop.folder), shop)
