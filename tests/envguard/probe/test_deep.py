"""``--deep``: torch imported in a crash-isolated subprocess; crashes and hangs are recorded."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envguard.probe import SnapshotOptions, collect, deep
from envguard.probe.stated import parse_version_py
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files


def _venv_with_torch(venvs: VenvFactory, wheel_dir: Path, init: str) -> Venv:
    env = venvs.create()
    venvs.uv_install(env, build_wheel(wheel_dir, "torch", "2.11.0+cu128",
                                      fake_torch_files(init=init)))
    return env


def test_import_error_is_recorded_and_the_snapshot_completes(
        venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path) -> None:
    env = _venv_with_torch(venvs, wheel_dir, "raise ImportError('libcudart.so.12: cannot open "
                           "shared object file: No such file or directory')\n")
    snapshot = collect(SnapshotOptions(python=str(env.python), deep=True, cwd=clean_cwd,
                                       verify="none"))
    assert snapshot.deep is not None
    assert snapshot.deep.ok is False
    assert snapshot.deep.error is not None
    assert snapshot.deep.error.startswith("import torch failed: python")
    assert "exit status 1" in snapshot.deep.error
    assert "ImportError: libcudart.so.12: cannot open shared object file" in snapshot.deep.error
    assert snapshot.torch.version == "2.11.0+cu128"  # the import-free facts are all there
    assert [(e.section, e.message) for e in snapshot.errors] == [
        ("deep", snapshot.deep.error)]
    assert snapshot.validate() == snapshot


def test_abort_during_import_is_reported_as_sigabrt(venvs: VenvFactory,
                                                    wheel_dir: Path) -> None:
    env = _venv_with_torch(venvs, wheel_dir, "import os\nos.abort()\n")
    result = deep.collect(str(env.python))
    assert result.ok is False
    assert result.error is not None and "killed by SIGABRT" in result.error


def test_hanging_import_times_out(venvs: VenvFactory, wheel_dir: Path) -> None:
    env = _venv_with_torch(venvs, wheel_dir, "import time\ntime.sleep(60)\n")
    started = time.monotonic()
    result = deep.collect(str(env.python), timeout=3)
    assert time.monotonic() - started < 20
    assert result.ok is False
    assert result.error is not None and "timed out after 3 s" in result.error


def test_partial_torch_gives_partial_facts(venvs: VenvFactory, wheel_dir: Path) -> None:
    """A torch without cuda, backends or inductor: what can be read is, the rest is None."""
    env = _venv_with_torch(venvs, wheel_dir, "from torch.version import __version__\n")
    result = deep.collect(str(env.python))
    assert result.ok is True
    assert result.torch_version == "2.11.0+cu128"
    assert result.error is not None and result.error.startswith("cuda query failed")
    assert (result.cudnn_version, result.nccl_version, result.torch_key) == (None, None, None)
    assert result.config is not None and result.config.startswith("unavailable")
    assert result.seconds is not None and result.seconds >= 0


def test_probe_output_that_is_not_facts(venvs: VenvFactory, wheel_dir: Path) -> None:
    # Something in torch's import registers an exit hook that prints after the facts.
    env = _venv_with_torch(venvs, wheel_dir, "import atexit\n"
                           "atexit.register(print, '42')\n"
                           "from torch.version import __version__\n")
    result = deep.collect(str(env.python))
    assert (result.ok, result.error) == (False, "import torch printed no facts")


def test_probe_keeps_out_of_the_real_compile_caches(venvs: VenvFactory,
                                                    wheel_dir: Path) -> None:
    # Importing torch._inductor creates its cache folder; the probe must not do that to the
    # caches the snapshot is walking at the same time.
    env = _venv_with_torch(venvs, wheel_dir, "import os\n"
                           "os.makedirs(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
                           "os.makedirs(os.environ['TRITON_CACHE_DIR'])\n"
                           "from torch.version import __version__\n")
    result = deep.collect(str(env.python))
    assert result.ok, result.error
    assert not Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).exists()
    assert not Path(os.environ["TRITON_CACHE_DIR"]).exists()


@pytest.mark.slow
def test_real_torch(clean_cwd: Path) -> None:
    """The project venv's real CPU torch, imported for real, agrees with the ast reading."""
    # Import torch in a subprocess while the deep probe runs: two cores, half the wait.
    imported = subprocess.Popen(
        [sys.executable, "-c", "import torch.version as v; print(v.__version__, v.git_version)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=clean_cwd)
    try:
        result = deep.collect(sys.executable)
        out, err = imported.communicate(timeout=300)
    finally:
        imported.kill()
        imported.wait()
    assert imported.returncode == 0, err
    real_version, real_git_version = out.split()

    spec = importlib.util.find_spec("torch")  # finds torch without importing it
    assert spec is not None and spec.origin is not None
    fields = parse_version_py((Path(spec.origin).parent / "version.py").read_text())
    assert result.ok, result.error
    assert result.error is None
    assert result.torch_version == fields["__version__"] == real_version
    assert result.cuda_available is False
    assert result.device_count == 0 and result.device_capability == []
    assert result.torch_key is not None and re.fullmatch(r"[0-9a-f]{64}", result.torch_key)
    assert result.config is not None and "PyTorch built with" in result.config
    assert not Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).exists()

    snapshot = collect(SnapshotOptions(cwd=clean_cwd, verify="none"))
    assert snapshot.torch.present and snapshot.deep is None
    assert snapshot.torch.version == real_version
    assert snapshot.torch.git_version == real_git_version
    assert re.fullmatch(r"[0-9a-f]{40}", real_git_version)
