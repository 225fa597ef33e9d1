"""The incident reproduced with real uv-built venvs, real files and a real inductor cache folder.

Only torch itself is a stand-in (a tiny wheel with a real ``torch/version.py``):
everything envguard reads — dist-info, RECORD, site-packages files, the cache folder,
the project file — is real.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envguard.changes import diff
from envguard.explain import explain
from envguard.probe import SnapshotOptions, collect
from tests.wheelfactory import VenvFactory, build_wheel, fake_torch_files


def test_incident_is_explained(venvs: VenvFactory, tmp_path: Path, clean_cwd: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "torchinductor_root"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    for sub, n in (("fxgraph", 3), ("aotautograd", 2), ("triton", 4)):
        (cache / sub).mkdir(parents=True)
        for i in range(n):
            (cache / sub / f"entry{i}.bin").write_bytes(b"k" * 4096)
    train = clean_cwd / "dflash_model.py"
    train.write_text("def forward(x):\n    return x\n")

    good_build = build_wheel(tmp_path / "w1", "torch", "2.11.0+cu128",
                             fake_torch_files(git_version="e2b8a1c7" * 5))
    other_build = build_wheel(tmp_path / "w2", "torch", "2.11.0+cu128", fake_torch_files())
    cu12 = build_wheel(venvs.wheels, "nvidia-cublas-cu12", "12.8.4.1",
                       {"nvidia/cublas/__init__.py": ""})
    env = venvs.create()
    venvs.uv_install(env, good_build, cu12)
    options = SnapshotOptions(python=str(env.python), cwd=clean_cwd,
                              file_patterns=("dflash_model.py",))
    good = collect(options)
    assert good.torch.git_version == "e2b8a1c7" * 5

    # What happened that day, step by step.
    venvs.uv_install(env, build_wheel(venvs.wheels, "sglang", "0.5.6", {"sglang/__init__.py": ""}),
                     build_wheel(venvs.wheels, "flashinfer-python", "0.5.3",
                                 {"flashinfer/__init__.py": ""}))
    venvs.uv_install(env, other_build, reinstall=True)
    patched = env.site_packages() / "torch" / "fx" / "_symbolic_trace.py"
    patched.write_text(patched.read_text() + "_is_fx_tracing_flag = False  # debugging hack\n")
    shutil.rmtree(cache)
    train.write_text("def forward(x):\n    return x * 2\n")
    now = collect(options)

    changes = diff(good, now)
    findings = explain(good, now, changes)
    rules = {f.rule for f in findings}
    assert {"torch-build-changed", "foreign-stack-installed", "installed-files-modified",
            "compile-cache-cold", "file-changed"} <= rules, rules
    assert "torch-version-changed" not in rules  # same version string: the whole point
    modified = next(f for f in findings if f.rule == "installed-files-modified")
    assert any("torch/fx/_symbolic_trace.py" in e for e in modified.evidence)
    assert findings[0].severity.value == "critical"
