"""Rules about torch's build: version, commit, CUDA, triton."""

from __future__ import annotations

import re
from collections.abc import Iterator

from envguard.explain.interface import (
    Context,
    Finding,
    Rule,
    Severity,
    short,
)
from envguard.explain.queries import conda_cuda_families
from envguard.explain.remedies import (
    index_url_for,
    pin,
    remedy,
    uv_pip_install,
    uv_pip_uninstall,
)
from envguard.explain.tables import CONDA_CUDA
from envguard.model import TorchIdentity

_LOCAL_CUDA = re.compile(r"\+cu(\d+)")


def _install_hint(version: str | None, prefix: str = "", suffix: str = "") -> str:
    """``uv pip install --reinstall --index-url URL -- "torch==VERSION"`` (one builder,
    :func:`envguard.explain.remedies.uv_pip_install`)."""
    return remedy(lambda: uv_pip_install([pin("torch", str(version), "torch")], reinstall=True,
                                         index_url=index_url_for(version)), prefix, suffix)


def torch_build_changed(ctx: Context) -> Iterator[Finding]:
    old, new = ctx.old.torch, ctx.new.torch
    if not (old.present and new.present) or old.version != new.version:
        return
    git = ctx.diff.first("torch", "git_version")
    fingerprint = ctx.diff.first("packages", "torch", "fingerprint")
    if git is None and fingerprint is None:
        return
    evidence = []
    if git is not None:
        evidence.append(f"torch.version.git_version: {git.old} → {git.new}")
    if fingerprint is not None:
        evidence.append(f"build fingerprint (RECORD): {short(fingerprint.old, 16)} → "
                        f"{short(fingerprint.new, 16)}")
    old_dist = ctx.old.package("torch")
    if old_dist is not None and old_dist.direct_url is not None:
        evidence.append(f"the good build came from {old_dist.direct_url.url}")
    yield Finding(
        rule="torch-build-changed",
        severity=Severity.CRITICAL,
        title=f"torch was reinstalled under the same version {new.version} but from a "
              f"different build (git {short(git.old if git else None)} → "
              f"{short(git.new if git else None)})",
        explanation=(
            "The version string is identical, so pip freeze, uv sync --check and "
            "--require-hashes all call this environment unchanged, but the binary is another "
            "commit. Compile behaviour can differ between commits (Dynamo's handling of "
            "threads and the FX tracing flag changed within 2.11–2.13), and inductor keys "
            "every compile-cache entry with a hash of torch's sources, so everything the old "
            "build compiled now misses silently and is compiled again."
        ),
        evidence=tuple(evidence),
        remedy=(
            _install_hint(new.version, "reinstall the exact good build (same wheel file or URL), "
                          "not just the same version: ",
                          " gives whatever build the index serves today"),
            "confirm with: python -c \"import torch; print(torch.version.git_version)\" "
            f"(good: {old.git_version})",
            "then warm the compile cache single-threaded before starting worker threads",
        ),
        changes=tuple(c for c in (git, fingerprint) if c is not None),
        weight=100,
    )


def torch_version_changed(ctx: Context) -> Iterator[Finding]:
    old, new = ctx.old.torch, ctx.new.torch
    if old.version == new.version and old.present == new.present:
        return
    if not new.present:
        title = f"torch {old.version} was removed"
    elif not old.present:
        title = f"torch {new.version} was installed"
    else:
        title = f"torch changed from {old.version} to {new.version}"
    yield Finding(
        rule="torch-version-changed",
        severity=Severity.CRITICAL,
        title=title,
        explanation=(
            "A different torch release changes compiled kernels, torch.compile, flex_attention "
            "and the CUDA libraries it loads; extensions built against the old one (flash-attn, "
            "flashinfer, custom ops) can fail with undefined symbols. Installing another stack "
            "into the venv is the usual way this happens unnoticed."
        ),
        evidence=(f"torch.__version__: {old.version} → {new.version}",),
        remedy=(_install_hint(old.version) if old.version else "uninstall torch",
                "or rebuild the venv from the good snapshot's package list"),
        changes=tuple(ctx.diff.find("torch", "version")),
        weight=90,
    )


def _cuda_name(t: TorchIdentity) -> str:
    if not t.present:
        return "no torch"
    return f"CUDA {t.cuda}" if t.cuda else (f"ROCm {t.hip}" if t.hip else "CPU-only")


def cuda_build_changed(ctx: Context) -> Iterator[Finding]:
    old, new = ctx.old.torch, ctx.new.torch
    cuda = ctx.diff.first("torch", "cuda")
    family = ctx.diff.first("torch", "cuda_wheel_family")
    wheels = ctx.diff.first("torch", "cuda_wheels")
    mixed = new.cuda_wheel_family == "mixed"
    conda_old, conda_new = conda_cuda_families(ctx.old), conda_cuda_families(ctx.new)
    conda_changed = sorted(conda_old) != sorted(conda_new)
    pip_family = {"cu12": "cu12", "cu13": "cu13", "cu11": "cu11"}.get(new.cuda_wheel_family
                                                                      or "")
    conda_mixed = bool(pip_family and conda_new and set(conda_new) - {pip_family})
    if cuda is None and family is None and not (mixed and wheels is not None) \
            and not conda_changed and not (conda_mixed and (conda_changed or family)):
        return
    evidence = []
    if conda_changed:
        evidence.append(f"conda CUDA packages: {'+'.join(sorted(conda_old)) or 'none'} → "
                        f"{'+'.join(sorted(conda_new)) or 'none'} ("
                        + ", ".join([x for found in conda_new.values() for x in found][:4])
                        + ")")
    if conda_mixed:
        evidence.append(f"conda's {'+'.join(sorted(conda_new))} beside {pip_family} pip wheels")
    if cuda is not None:
        evidence.append(f"torch.version.cuda: {cuda.old} → {cuda.new}")
    if family is not None:
        evidence.append(f"CUDA wheel family: {family.old} → {family.new}")
    if wheels is not None:
        if wheels.old:
            evidence.append("CUDA wheels gone: " + ", ".join(wheels.old))
        if wheels.new:
            evidence.append("CUDA wheels added: " + ", ".join(wheels.new))
    if mixed:
        evidence.append("both cu12 (nvidia-*-cu12) and cu13 (cuda-toolkit / unsuffixed "
                        "nvidia-*) wheels are installed")
    if mixed:
        title = "CUDA 12 and CUDA 13 wheels are mixed in one environment"
    elif conda_mixed:
        title = (f"conda's CUDA packages ({'+'.join(sorted(conda_new))}) and {pip_family} pip "
                 "wheels are mixed in one environment")
    elif conda_changed and cuda is None and family is None:
        title = (f"the conda CUDA packages changed ({'+'.join(sorted(conda_old)) or 'none'} → "
                 f"{'+'.join(sorted(conda_new)) or 'none'})")
    elif cuda is None and family is not None:  # torch's own CUDA stayed; its wheels did not
        title = (f"the CUDA wheels changed ({family.old} → {family.new}) under torch built for "
                 f"{_cuda_name(new)}")
    else:
        title = f"the CUDA build changed ({_cuda_name(old)} → {_cuda_name(new)})"
    yield Finding(
        rule="cuda-build-changed",
        severity=Severity.CRITICAL,
        title=title,
        explanation=(
            "torch and every CUDA extension link against one CUDA major (libcudart.so.12 vs "
            ".so.13, libcublas, nvrtc). Swapping cu128 and cu130 wheels, or leaving both sets "
            "installed, loads mismatched libraries: undefined symbols, 'no kernel image is "
            "available', NCCL or cuBLAS errors, or silently slower kernels."
        ),
        evidence=tuple(evidence),
        remedy=(
            _install_hint(old.version, "reinstall torch for the good CUDA build: "),
            remedy(lambda: uv_pip_uninstall([w.split("==")[0] for w in wheels.new]),
                   "remove the other family's wheels: ") if wheels and wheels.new else
            "remove the other family's nvidia-* wheels (uv pip list names them)",
        ),
        changes=(*(c for c in (cuda, family, wheels) if c is not None),
                 *(c for c in ctx.diff.find("conda") if c.key in CONDA_CUDA)),
        weight=95,
    )


def triton_changed(ctx: Context) -> Iterator[Finding]:
    version = ctx.diff.first("torch", "triton_version")
    build = ctx.diff.first("torch", "triton_fingerprint")
    if version is None and build is None:
        return
    old, new = ctx.old.torch.triton_version, ctx.new.torch.triton_version
    evidence = [f"triton: {old} → {new}"] if version else [
        f"triton {new}: build fingerprint {short(build.old if build else None, 16)} → "
        f"{short(build.new if build else None, 16)}"]
    yield Finding(
        rule="triton-changed",
        severity=Severity.WARNING,
        title=f"triton changed ({old} → {new})" if version else
              f"triton {new} was reinstalled from a different build",
        explanation=(
            "Inductor generates Triton kernels; a different triton compiles them differently "
            "and its source hash (triton_key) is part of every cache key, so cached kernels "
            "miss and are rebuilt at the first step. Each torch release pins the triton it "
            "was tested with."
        ),
        evidence=tuple(evidence),
        remedy=(remedy(lambda: uv_pip_install([pin("triton", str(old), "torch.triton")]))
                if old else "uninstall the extra triton",),
        changes=tuple(c for c in (version, build) if c is not None),
        weight=70,
    )


RULES = (
    Rule(id="torch-build-changed", title="same torch version, different build",
         check=torch_build_changed,
         keywords=("is_fx_symbolic_tracing", "symbolically trace", "fx", "dynamo",
                   "inductor", "compile", "undefined symbol", "segmentation fault",
                   "illegal instruction", "git_version")),
    Rule(id="torch-version-changed", title="torch version changed",
         check=torch_version_changed,
         keywords=("undefined symbol", "importerror", "attributeerror",
                   "dynamo", "inductor", "out of memory", "deprecat")),
    Rule(id="cuda-build-changed", title="CUDA build or wheel family changed",
         check=cuda_build_changed,
         keywords=("undefined symbol", "libcudart", "libcublas", "libcudnn", "libnvrtc",
                   ".so.12", ".so.13", "cuda error", "no kernel image", "nccl",
                   "cublas", "cudnn", "cuda driver version is insufficient", "cuda")),
    Rule(id="triton-changed", title="triton version or build changed",
         check=triton_changed,
         keywords=("triton", "ptxas", "inductor", "compile", "llvm")),
)
