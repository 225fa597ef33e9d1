"""torch's build identity without importing torch; the CUDA wheel family."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from envguard.model import Distribution
from envguard.probe import distributions, torch_identity
from envguard.probe.fastpath.rows import RecordRows
from envguard.probe.stated import parse_version_py
from envguard.probe.torch_identity import cuda_wheels
from tests.wheelfactory import VenvFactory, build_wheel, fake_torch_files

H200_VERSION_PY = """\
__version__ = '2.11.0+cu130'
debug = False
cuda: Optional[str] = '13.0'
git_version = '70d99e998b4955e0049d13a98d77ae1b14db1f45'
hip: Optional[str] = None
rocm: Optional[str] = None
xpu: Optional[str] = None
"""


def test_parse_version_py_reads_every_literal_field() -> None:
    fields = parse_version_py("from typing import Optional\n" + H200_VERSION_PY)
    assert fields["__version__"] == "2.11.0+cu130"
    assert fields["git_version"] == "70d99e998b4955e0049d13a98d77ae1b14db1f45"
    assert fields["cuda"] == "13.0"
    assert fields["rocm"] is None and fields["xpu"] is None and fields["debug"] is False


def test_parse_version_py_ignores_code_it_must_not_run() -> None:
    text = "import os\n__version__ = '1.0'\nx = os.system('echo pwned')\ncuda = None\n"
    assert parse_version_py(text) == {"__version__": "1.0", "cuda": None}


def _dist(name: str, version: str) -> Distribution:
    return Distribution(name=name, version=version, location="/x", metadata_dir=f"{name}.dist-info")


@pytest.mark.parametrize(
    ("names", "family"),
    [
        ([("nvidia-cublas-cu12", "12.8.4.1"), ("nvidia-cudnn-cu12", "9.10.2.21")], "cu12"),
        ([("cuda-toolkit", "13.0.3"), ("nvidia-cublas", "13.1.0.3")], "cu13"),
        ([("nvidia-cudnn-cu13", "9.13.0.50")], "cu13"),
        # The H200 image's CUDA 13 set: unsuffixed libraries with their own versions.
        ([("cuda-toolkit", "13.0.2"), ("nvidia-cufft", "12.0.0.61"),
          ("nvidia-curand", "10.4.0.35"), ("nvidia-cufile", "1.15.1.6"),
          ("nvidia-cusparse", "12.6.3.3"), ("nvidia-nccl-cu13", "2.28.9")], "cu13"),
        ([("nvidia-cublas-cu12", "12.8.4.1"), ("nvidia-cublas", "13.1.0.3")], "mixed"),
        ([("nvidia-ml-py", "13.580.82"), ("numpy", "2.0")], None),
    ],
)
def test_cuda_wheel_family(names: list[tuple[str, str]], family: str | None) -> None:
    got, wheels = cuda_wheels([_dist(n, v) for n, v in names])
    assert got == family
    assert (wheels == []) == (family is None)


def test_identity_of_a_fake_torch_in_a_real_venv(venvs: VenvFactory, wheel_dir: Path) -> None:
    env = venvs.create()
    wheels = [
        build_wheel(wheel_dir, "torch", "2.11.0", fake_torch_files(version="2.11.0+cu130",
                                                                   cuda="13.0")),
        build_wheel(wheel_dir, "triton", "3.6.0", {"triton/__init__.py": ""}),
        build_wheel(wheel_dir, "nvidia-cublas", "13.1.0.3", {"nvidia/cublas/__init__.py": ""}),
    ]
    venvs.uv_install(env, *wheels)
    found, _ = distributions.scan([str(env.site_packages())])
    ident, issues = torch_identity.probe(found, [str(env.site_packages())])
    assert issues == []
    assert ident.version == "2.11.0+cu130"
    assert ident.dist_version == "2.11.0"  # PyPI builds drop the local label in METADATA
    assert ident.git_version == "70d99e998b4955e0049d13a98d77ae1b14db1f45"
    assert ident.cuda == "13.0" and ident.triton_version == "3.6.0"
    assert ident.cuda_wheel_family == "cu13"


def test_compat_key_changes_with_a_one_line_torch_edit_and_with_the_gpu() -> None:
    ident = torch_identity.TorchIdentity(present=True, version="2.11.0+cu130", git_version="a")
    rows_a = [("torch/fx/_symbolic_trace.py", "sha256=AAA", "10")]
    rows_b = [("torch/fx/_symbolic_trace.py", "sha256=BBB", "10")]
    def item(rows: list[tuple[str, str, str]]) -> distributions.InstalledDist:
        return distributions.InstalledDist(dist=_dist("torch", "2.11.0"), site_dir="/x",
                                           record=RecordRows.of(rows))
    key_a = torch_identity.compat_key(ident, item(rows_a), ["NVIDIA H200"])
    assert key_a == torch_identity.compat_key(ident, item(rows_a), ["NVIDIA H200"])
    assert key_a != torch_identity.compat_key(ident, item(rows_b), ["NVIDIA H200"])
    assert key_a != torch_identity.compat_key(ident, item(rows_a), ["NVIDIA H100"])


def test_compat_key_keeps_its_value_when_the_rows_come_packed_from_the_memo() -> None:
    """Snapshots and cache markers of earlier versions hold this key: its value is pinned
    to the original recipe (every sorted .py row hashed in turn after the parts)."""
    ident = torch_identity.TorchIdentity(present=True, version="2.11.0+cu130", git_version="a",
                                         cuda="13.0", triton_version="3.6.0")
    rows = [("torch/b.py", "sha256=B", "2"), ("torch/a.py", "sha256=A", "1"),
            ("torch/lib/x.so", "sha256=S", "9"), ("torch/é.py", "sha256=E", "3")]
    h = hashlib.sha256()
    for part in ("2.11.0+cu130", "a", "13.0", None, "3.6.0", None, "NVIDIA H200"):
        h.update(f"{part}\n".encode())
    for row in sorted(p + d for p, d, _ in rows if p.endswith(".py")):
        h.update(row.encode())
    packed = RecordRows.unpacked(RecordRows.of(rows).packed())
    for record in (RecordRows.of(rows), packed):
        torch = distributions.InstalledDist(dist=_dist("torch", "2.11.0"), site_dir="/x",
                                            record=record)
        assert torch_identity.compat_key(ident, torch, ["NVIDIA H200"]) == \
            "sha256:" + h.hexdigest()


def test_torch_installed_without_version_py_is_an_issue(venvs: VenvFactory,
                                                        wheel_dir: Path) -> None:
    env = venvs.create()
    files = fake_torch_files()
    del files["torch/version.py"]
    venvs.uv_install(env, build_wheel(wheel_dir, "torch", "2.11.0", files))
    found, _ = distributions.scan([str(env.site_packages())])
    ident, issues = torch_identity.probe(found, [str(env.site_packages())])
    assert ident.present and ident.version is None
    assert any("version.py is missing" in i.message for i in issues)


@pytest.mark.slow
def test_identity_matches_the_real_torch_import() -> None:
    """Real torch in this interpreter: the ast reading equals what ``import torch`` says."""
    pytest.importorskip("torch")
    code = "import torch, json; print(json.dumps([torch.__version__, torch.version.git_version, " \
           "torch.version.cuda]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    import json

    version, git, cuda = json.loads(out.strip().splitlines()[-1])
    found, _ = distributions.scan(sys.path[1:])
    ident, _ = torch_identity.probe(found, sys.path[1:])
    assert (ident.version, ident.git_version, ident.cuda) == (version, git, cuda)
