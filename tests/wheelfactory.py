"""Build tiny, real wheels and real venvs for the tests, with no network.

A wheel is a zip with ``{name}-{version}.dist-info/{METADATA,WHEEL,RECORD}``;
:func:`build_wheel` writes one from a dict of files, so tests can make two
builds of one version, a fake ``torch`` with a chosen ``git_version``, or a
package whose import crashes. :class:`VenvFactory` installs them with real
``uv`` (and real ``pip`` from the stdlib's ensurepip) into temporary venvs.
"""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def build_wheel(
    out_dir: Path,
    name: str,
    version: str,
    files: dict[str, str | bytes],
    *,
    requires: tuple[str, ...] = (),
    scripts: dict[str, str] | None = None,
    tag: str = "py3-none-any",
    generator: str = "envguard-tests (1.0)",
) -> Path:
    """Write ``{name}-{version}-{tag}.whl`` and return its path.

    ``files`` maps paths inside site-packages to contents; ``scripts`` maps
    console-script names to ``module:function`` entry points.
    """
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    contents: dict[str, bytes] = {
        path: data.encode() if isinstance(data, str) else data for path, data in files.items()
    }
    contents[f"{info}/METADATA"] = ("\n".join(meta) + "\n\n").encode()
    contents[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: {generator}\nRoot-Is-Purelib: true\nTag: {tag}\n\n"
    ).encode()
    if scripts:
        lines = ["[console_scripts]"] + [f"{k} = {v}" for k, v in scripts.items()]
        contents[f"{info}/entry_points.txt"] = ("\n".join(lines) + "\n").encode()
    record = [f"{p},{_record_hash(d)},{len(d)}" for p, d in contents.items()]
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p, d in contents.items():
            zf.writestr(p, d)
    return path


def fake_torch_files(
    version: str = "2.11.0+cu128",
    git_version: str = "70d99e998b4955e0049d13a98d77ae1b14db1f45",
    cuda: str | None = "12.8",
    init: str = "from torch.version import __version__\n",
    extra_fields: str = "rocm = None\n",
) -> dict[str, str | bytes]:
    """Files of a fake torch distribution whose ``torch/version.py`` says what the test wants."""
    version_py = (
        "from typing import Optional\n\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        f"__version__ = {version!r}\n"
        "debug = False\n"
        f"cuda: Optional[str] = {cuda!r}\n"
        f"git_version = {git_version!r}\n"
        "hip: Optional[str] = None\n"
        f"{extra_fields}"
    )
    return {
        "torch/__init__.py": init,
        "torch/version.py": version_py,
        "torch/fx/_symbolic_trace.py": "def is_fx_tracing():\n    return False\n",
    }


def run_checked(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def find_uv() -> str | None:
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return None


def base_python() -> str:
    """A real interpreter (not a venv's) to build test venvs from."""
    return os.path.realpath(sys.executable)


@dataclass
class Venv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def site_packages(self) -> Path:
        found = sorted(self.path.glob("lib/python3*/site-packages"))
        assert found, f"no site-packages in {self.path}"
        return found[0]


class VenvFactory:
    """Creates venvs in a temporary folder and installs local wheels into them, offline."""

    def __init__(self, root: Path, wheels: Path, uv: str) -> None:
        self.root = root
        self.wheels = wheels
        self.uv = uv
        self._n = 0

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"UV_NO_CONFIG": "1", "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never",
                    "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        for var in ("UV_FIND_LINKS", "UV_CONSTRAINT", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL",
                    "VIRTUAL_ENV", "PYTHONPATH"):
            env.pop(var, None)
        return env

    def create(self, name: str | None = None, *, with_pip: bool = False) -> Venv:
        self._n += 1
        path = self.root / (name or f"venv{self._n}")
        if with_pip:
            copy_pip_venv(path)
        else:
            run_checked([self.uv, "venv", "--quiet", "--python", base_python(), str(path)],
                        env=self._env())
        return Venv(path)

    def uv_install(self, env: Venv, *wheels: Path, reinstall: bool = False) -> None:
        args = [self.uv, "pip", "install", "--quiet", "--python", str(env.python), "--no-index",
                "--find-links", str(self.wheels)]
        if reinstall:
            args.append("--reinstall")
        run_checked([*args, *map(str, wheels)], env=self._env())

    def pip_install(self, env: Venv, *wheels: Path) -> None:
        run_checked([str(env.python), "-m", "pip", "install", "--quiet", "--no-index",
                     "--no-deps", *map(str, wheels)], env=self._env())


@functools.cache
def _ensurepip_venv() -> Path:
    """The one venv this process makes with the standard library's ``venv`` and ensurepip
    (pip from ensurepip's own wheel: no network), removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="envguard-tests-pip-venv-"))
    atexit.register(shutil.rmtree, root, True)
    venv.EnvBuilder(with_pip=True, symlinks=True).create(root / "venv")
    return root / "venv"


def copy_pip_venv(path: Path) -> None:
    """A venv at ``path`` as the standard library's ``venv`` with ensurepip makes it, copied
    from :func:`_ensurepip_venv`: making one costs about 4 s of ensurepip's pip run, a copy
    a few hundred milliseconds. The copy's links stay links (the interpreter is the same
    base Python) and every text that names the first venv's folder (pyvenv.cfg, the
    activate scripts, the console scripts' shebangs) names ``path`` instead."""
    template = _ensurepip_venv()
    shutil.copytree(template, path, symlinks=True)
    old, new = str(template).encode(), str(path).encode()
    for file in [path / "pyvenv.cfg", *(path / "bin").iterdir()]:
        if file.is_symlink() or not file.is_file():
            continue
        data = file.read_bytes()
        if old in data:
            file.write_bytes(data.replace(old, new))


def interruptible() -> None:
    """``preexec_fn`` for a child a test will SIGINT: a shell starts background jobs with
    SIGINT ignored, a child inherits that, and Python then never raises KeyboardInterrupt.
    The child gets the default disposition back, as a foreground command has."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
