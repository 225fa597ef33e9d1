"""Every explain rule: one or more hits and a near miss each, built from the real H200 snapshot.

The tables below are keyed by rule id and the tests iterate ``ALL_RULES``, so a rule
added without cases fails here (``<id>-NO-CASES``) instead of going untested.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from envguard.changes import diff
from envguard.explain import ALL_RULES, Finding, Severity, explain, matches_symptom
from envguard.explain.interface import short
from envguard.model import (
    BuildStamp,
    CondaPackage,
    Deep,
    Distribution,
    EnvValue,
    Gpu,
    IntegrityIssue,
    Snapshot,
    TrackedFile,
)
from tests.incident import BAD_GIT, CU12, GOOD_GIT, incident_pair, real_h200

Pair = tuple[Snapshot, Snapshot]

# Facts of tests/data/h200-snapshot.json that the cases below rely on.
REAL_GIT = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
REAL_TORCH = "2.11.0+cu130"
REAL_FILE = "/work/main/dflash/__init__.py"
REAL_FILE_MD5 = "d41d8cd98f00b204e9800998ecf8427e"
NEW_MD5 = "5f3c9a0d2b7e41c8a6d2e9f01b3c4d5e"
OTHER_KEY = "sha256:" + "7" * 64
TOKEN_DIGEST_OLD = "hmac-sha256:" + "a1" * 16
TOKEN_DIGEST_NEW = "hmac-sha256:" + "b2" * 16


# --- building snapshots -------------------------------------------------------------------


@functools.cache
def base() -> Snapshot:
    """The real snapshot, read once; cases only ever ``replace`` it, never mutate it."""
    return real_h200()


def with_torch(s: Snapshot, **kw: Any) -> Snapshot:
    return replace(s, torch=replace(s.torch, **kw))


def with_package(s: Snapshot, name: str, **kw: Any) -> Snapshot:
    assert s.package(name) is not None, name
    return replace(s, packages=[replace(p, **kw) if p.name == name else p for p in s.packages])


def without_package(s: Snapshot, name: str) -> Snapshot:
    assert s.package(name) is not None, name
    return replace(s, packages=[p for p in s.packages if p.name != name])


def adding(s: Snapshot, *names_versions: tuple[str, str]) -> Snapshot:
    extra = [Distribution(name=n, version=v, location=s.interpreter.site_packages[0],
                          metadata_dir=f"{n}-{v}.dist-info", installer="uv",
                          fingerprint="sha256:" + n.encode().hex()[:64].ljust(64, "0"))
             for n, v in names_versions]
    return replace(s, packages=sorted([*s.packages, *extra], key=lambda p: p.name))


def with_cache(s: Snapshot, kind: str, **kw: Any) -> Snapshot:
    assert any(c.kind == kind for c in s.caches), kind
    return replace(s, caches=[replace(c, **kw) if c.kind == kind else c for c in s.caches])


def warm(path: str = "/tmp/torchinductor_root", files: int = 1234,
         size: int = 353_000_000, **kw: Any) -> dict[str, Any]:
    """Keyword arguments for a cache folder that holds compiled entries."""
    return {"path": path, "exists": True, "files": files, "total_bytes": size,
            "entries": {"fxgraph": files // 2, "aotautograd": files - files // 2}, **kw}


COLD: dict[str, Any] = {"exists": False, "files": 0, "total_bytes": 0, "entries": {}}


def stamp(key: str, torch_version: str = "2.10.0+cu130", git: str = GOOD_GIT) -> BuildStamp:
    return BuildStamp(compat_key=key, torch_version=torch_version, torch_git_version=git,
                      triton_version="3.5.1", first_seen="2026-10-01T08:00:00Z")


def with_env(s: Snapshot, mask_key_id: str | None = None, **values: EnvValue | None) -> Snapshot:
    variables = dict(s.environment.variables)
    for name, value in values.items():
        if value is None:
            del variables[name]
        else:
            variables[name] = value
    return replace(s, environment=replace(s.environment, variables=variables,
                                          mask_key_id=mask_key_id or s.environment.mask_key_id))


def secret(digest: str) -> EnvValue:
    return EnvValue(value=None, masked=True, digest=digest)


def with_file(s: Snapshot, path: str, **kw: Any) -> Snapshot:
    files = [replace(f, **kw) if f.path == path else f for f in s.files.files]
    return replace(s, files=replace(s.files, files=files))


def tracking_new_file(s: Snapshot) -> Snapshot:
    """A file that a new match of a --file pattern adds (not a material change)."""
    new = TrackedFile(pattern="/work/main/dflash/*.py", path="/work/main/dflash/new.py",
                      exists=True, size=3, md5=NEW_MD5, sha256="0" * 64)
    return replace(s, files=replace(s.files, files=[*s.files.files, new]))


def with_git(s: Snapshot, **kw: Any) -> Snapshot:
    assert s.files.git is not None
    return replace(s, files=replace(s.files, git=replace(s.files.git, **kw)))


def with_issues(s: Snapshot, *issues: IntegrityIssue) -> Snapshot:
    return replace(s, integrity=replace(s.integrity, issues=list(issues)))


DEEP = Deep(ok=True, torch_version=REAL_TORCH, cuda_available=True, device_count=1,
            device_capability=["9.0"], cudnn_version="91900", nccl_version="2.28.9",
            torch_key="f" * 64, seconds=4.2)


def versions(s: Snapshot, **pins: str) -> Snapshot:
    """``s`` with these installed packages at these versions (``markupsafe="2.1.1"``)."""
    assert all(s.package(n) for n in pins), pins
    return replace(s, packages=[replace(p, version=pins[p.name]) if p.name in pins else p
                                for p in s.packages])


def changed(make: Callable[[Snapshot], Snapshot]) -> Callable[[], Pair]:
    """old = the real snapshot, new = ``make(real)``."""
    return lambda: (base(), make(base()))


def both(old: Callable[[Snapshot], Snapshot],
         new: Callable[[Snapshot], Snapshot]) -> Callable[[], Pair]:
    return lambda: (old(base()), new(base()))


def same(make: Callable[[Snapshot], Snapshot]) -> Callable[[], Pair]:
    """A self-diff of ``make(real)``."""
    return lambda: (make(base()), make(base()))


# --- conda (conda-meta records, written as conda writes them) ------------------------------

def conda_pkg(name: str, version: str, build: str = "h0_0", channel: str = "conda-forge",
              **kw: Any) -> CondaPackage:
    return CondaPackage(name=name, version=version, build=build, channel=channel,
                        subdir="linux-64", fingerprint=f"sha256:{name}-{version}-{build}", **kw)


CONDA_BASE = (conda_pkg("cudatoolkit", "11.8.0", "h6a678d5_0", "pkgs/main"),
              conda_pkg("mkl", "2023.1.0", "h213fc3f_46344", "pkgs/main"),
              conda_pkg("nccl", "2.18.5.1", "h6103f9b_0"), conda_pkg("tqdm", "4.66.1"),
              conda_pkg("pytorch", "2.1.0", "py3.11_cuda11.8_cudnn8.7.0_0", "pytorch"))


def with_conda(s: Snapshot, *pkgs: CondaPackage, drop: tuple[str, ...] = ()) -> Snapshot:
    by = {p.name: p for p in CONDA_BASE}
    by.update({p.name: p for p in pkgs})
    return replace(s, conda=sorted((p for n, p in by.items() if n not in drop),
                                   key=lambda p: p.name))


def conda_pair(*pkgs: CondaPackage, drop: tuple[str, ...] = ()) -> Callable[[], Pair]:
    return both(lambda s: with_conda(s), lambda s: with_conda(s, *pkgs, drop=drop))


# --- the case tables ----------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    name: str
    build: Callable[[], Pair]
    severity: Severity | None = None
    title: tuple[str, ...] = ()
    """Substrings of the title."""
    evidence: tuple[str, ...] = ()
    """Lines that must be in the evidence, exactly."""
    mentions: tuple[str, ...] = ()
    """Substrings of evidence or remedy."""
    hidden: tuple[str, ...] = ()
    """Strings that appear nowhere in what the finding shows (secrets, digests)."""


@dataclass(frozen=True)
class Miss:
    name: str
    build: Callable[[], Pair]
    instead: tuple[str, ...] = ()
    """Rules the same pair must fire: the near miss is explained by its neighbour."""


HITS: dict[str, tuple[Hit, ...]] = {
    "known-break": (
        Hit("markupsafe-2.1-under-jinja2-2",
            both(lambda s: versions(s, jinja2="2.11.3", markupsafe="2.0.1"),
                 lambda s: versions(s, jinja2="2.11.3", markupsafe="2.1.1")),
            severity=Severity.CRITICAL, title=("markupsafe 2.1.1", "jinja2 2.11.3"),
            evidence=("users saw: cannot import name 'soft_unicode' from 'markupsafe'",),
            mentions=("markupsafe<2.1",)),
    ),
    "conda-package-changed": (
        Hit("cudatoolkit", conda_pair(conda_pkg("cudatoolkit", "12.1.0", "h2b0f8c8_0",
                                                "pkgs/main")),
            severity=Severity.CRITICAL, title=("cudatoolkit",),
            evidence=("cudatoolkit version: 11.8.0 → 12.1.0",
                      "cudatoolkit build: h6a678d5_0 → h2b0f8c8_0"),
            mentions=("cudatoolkit=11.8.0=h6a678d5_0",)),
        Hit("tqdm", conda_pair(conda_pkg("tqdm", "4.67.0")), severity=Severity.WARNING),
        Hit("same-version-rebuilt", conda_pair(replace(conda_pkg("nccl", "2.18.5.1",
                                                                 "h6103f9b_0"),
                                                       fingerprint="sha256:other")),
            severity=Severity.CRITICAL),
    ),
    "conda-package-added": (
        Hit("cuda-runtime", conda_pair(conda_pkg("cuda-runtime", "12.4.1", "0", "nvidia")),
            severity=Severity.WARNING, evidence=("+ cuda-runtime 12.4.1",)),
    ),
    "conda-package-removed": (
        Hit("mkl", conda_pair(drop=("mkl",)), severity=Severity.CRITICAL,
            evidence=("- mkl 2023.1.0",), mentions=("mkl=2023.1.0=h213fc3f_46344",)),
        Hit("tqdm", conda_pair(drop=("tqdm",)), severity=Severity.WARNING),
    ),
    "conda-channel-changed": (
        Hit("nccl", conda_pair(conda_pkg("nccl", "2.18.5.1", "h6103f9b_0", "nvidia")),
            severity=Severity.WARNING, evidence=("nccl: conda-forge → nvidia",)),
    ),
    "conda-pip-overlap": (
        Hit("torch-from-both", conda_pair(conda_pkg("pytorch", "2.1.0",
                                                    "py3.11_cuda11.8_cudnn8.7.0_0", "pytorch",
                                                    pip_also="pip")),
            severity=Severity.CRITICAL, title=("pytorch",)),
    ),
    "torch-build-changed": (
        Hit("same-version-other-commit",
            changed(lambda s: with_package(
                with_torch(s, git_version=GOOD_GIT), "torch", fingerprint="sha256:" + "e" * 64)),
            severity=Severity.CRITICAL,
            title=(f"same version {REAL_TORCH}", f"git {short(REAL_GIT)} → {short(GOOD_GIT)}"),
            evidence=(f"torch.version.git_version: {REAL_GIT} → {GOOD_GIT}",),
            mentions=("build fingerprint (RECORD)", f"(good: {REAL_GIT})")),
        Hit("fingerprint-only",
            changed(lambda s: with_package(s, "torch", fingerprint="sha256:" + "e" * 64)),
            severity=Severity.CRITICAL,
            mentions=("build fingerprint (RECORD): 43a4ba8038b056be… → eeeeeeeeeeeeeeee…",)),
        Hit("incident", incident_pair, severity=Severity.CRITICAL,
            evidence=(f"torch.version.git_version: {GOOD_GIT} → {BAD_GIT}",)),
    ),
    "torch-version-changed": (
        Hit("upgrade", changed(lambda s: with_torch(s, version="2.12.0+cu130",
                                                    git_version="1" * 40)),
            severity=Severity.CRITICAL, title=(f"torch changed from {REAL_TORCH} to 2.12.0+cu130",),
            evidence=(f"torch.__version__: {REAL_TORCH} → 2.12.0+cu130",),
            mentions=("--index-url https://download.pytorch.org/whl/cu130",)),
        Hit("removed", changed(lambda s: with_torch(s, present=False, version=None)),
            severity=Severity.CRITICAL, title=(f"torch {REAL_TORCH} was removed",)),
        Hit("installed", both(lambda s: with_torch(s, present=False, version=None),
                              lambda s: s),
            title=(f"torch {REAL_TORCH} was installed",)),
    ),
    "cuda-build-changed": (
        Hit("cu130-to-cu128",
            changed(lambda s: with_torch(s, version="2.11.0+cu128", cuda="12.8",
                                         cuda_wheel_family="cu12", cuda_wheels=CU12)),
            severity=Severity.CRITICAL, title=("CUDA 13.0 → CUDA 12.8",),
            evidence=("torch.version.cuda: 13.0 → 12.8", "CUDA wheel family: cu13 → cu12"),
            mentions=("CUDA wheels added: nvidia-cublas-cu12==12.8.4.1",
                      "uv pip uninstall -- nvidia-cublas-cu12")),
        Hit("conda-cuda-11-to-12-beside-cu13-wheels",  # conda's own CUDA, not torch's wheels
            both(lambda s: with_conda(s, conda_pkg("cudatoolkit", "11.8.0")),
                 lambda s: with_conda(s, conda_pkg("cudatoolkit", "12.1.0"))),
            severity=Severity.CRITICAL,
            title=("conda's CUDA packages (cu12) and cu13 pip wheels are mixed",),
            evidence=("conda CUDA packages: cu11 → cu12 (cudatoolkit=12.1.0 (conda))",
                      "conda's cu12 beside cu13 pip wheels")),
        Hit("only-the-wheels-swapped",  # torch's CUDA stays 13.0: the title must not say
            changed(lambda s: with_torch(s, cuda_wheel_family="cu12", cuda_wheels=CU12)),
            severity=Severity.CRITICAL,
            title=("the CUDA wheels changed (cu13 → cu12) under torch built for CUDA 13.0",)),
        Hit("cu12-and-cu13-mixed",
            changed(lambda s: with_torch(s, cuda_wheel_family="mixed",
                                         cuda_wheels=sorted([*s.torch.cuda_wheels, *CU12]))),
            severity=Severity.CRITICAL, title=("CUDA 12 and CUDA 13 wheels are mixed",),
            evidence=("CUDA wheel family: cu13 → mixed",)),
    ),
    "triton-changed": (
        Hit("version", changed(lambda s: with_torch(s, triton_version="3.7.0")),
            severity=Severity.WARNING, title=("triton changed (3.6.0 → 3.7.0)",),
            evidence=("triton: 3.6.0 → 3.7.0",), mentions=('"triton==3.6.0"',)),
        Hit("rebuilt", changed(lambda s: with_torch(s, triton_fingerprint="sha256:" + "0" * 64)),
            severity=Severity.WARNING, title=("triton 3.6.0 was reinstalled",),
            evidence=("triton 3.6.0: build fingerprint eb7216373eba1802… → 0000000000000000…",)),
    ),
    "compile-cache-cold": (
        Hit("deleted", both(lambda s: with_cache(s, "inductor", **warm()),
                            lambda s: with_cache(s, "inductor", **{**warm(), **COLD})),
            severity=Severity.CRITICAL, title=("is now gone",),
            evidence=("inductor cache /tmp/torchinductor_root: 353.0 MB in 1,234 files → "
                      "missing",)),
        Hit("emptied", both(lambda s: with_cache(s, "inductor", **warm()),
                            lambda s: with_cache(s, "inductor", **warm(files=0, size=0))),
            severity=Severity.CRITICAL, title=("is now empty",),
            evidence=("inductor cache /tmp/torchinductor_root: 353.0 MB in 1,234 files → "
                      "empty",)),
        Hit("moved-by-variable",
            both(lambda s: with_cache(s, "triton", **warm("/root/.triton/cache", 40, 9_000_000)),
                 lambda s: with_cache(s, "triton", path="/scratch/triton",
                                      source="TRITON_CACHE_DIR", **COLD)),
            evidence=("triton cache moved /root/.triton/cache (9.0 MB in 40 files) → "
                      "/scratch/triton (missing), set by TRITON_CACHE_DIR",)),
        Hit("incident", incident_pair, severity=Severity.CRITICAL),
    ),
    "compile-cache-stale": (
        Hit("filled-by-another-build",
            changed(lambda s: with_cache(s, "inductor", **warm(
                populated_under=[stamp(OTHER_KEY)], marker="created"))),
            severity=Severity.WARNING, title=("the inductor cache was filled by another",),
            evidence=("inductor cache /tmp/torchinductor_root: 353.0 MB in 1,234 files",
                      f"populated under torch 2.10.0+cu130 (git {short(GOOD_GIT)}), triton "
                      "3.5.1, since 2026-10-01T08:00:00Z")),
        Hit("compat-key-changed-under-a-warm-cache",
            both(lambda s: with_cache(s, "inductor", **warm()),
                 lambda s: with_cache(with_torch(s, compat_key=OTHER_KEY), "inductor",
                                      **warm(files=1300))),
            severity=Severity.WARNING,
            evidence=("compile-compat key: bf70766179738b3d… → 7777777777777777…",),
            mentions=("rm -rf /tmp/torchinductor_root",)),
    ),
    "compile-cache-volatile": (
        Hit("moved-into-tmp",
            both(lambda s: with_cache(s, "inductor", **warm("/root/.cache/torchinductor")),
                 lambda s: with_cache(s, "inductor", **warm())),
            severity=Severity.INFO, title=("lives in /tmp/torchinductor_root",),
            evidence=("inductor: /tmp/torchinductor_root (ext4), location from default",),
            mentions=("export TORCHINDUCTOR_CACHE_DIR=$HOME/.cache/torchinductor",)),
        Hit("now-on-tmpfs",
            both(lambda s: with_cache(s, "triton", **warm("/root/.triton/cache", 40)),
                 lambda s: with_cache(s, "triton", **warm("/root/.triton/cache", 40,
                                                          filesystem="tmpfs"))),
            title=("on tmpfs",), mentions=("export TRITON_CACHE_DIR=$HOME/.cache/triton",)),
        Hit("cold-in-tmp", both(lambda s: with_cache(s, "inductor", **warm()),
                                lambda s: with_cache(s, "inductor", **COLD))),
    ),
    "foreign-stack-installed": (
        Hit("serving-stack-added",
            changed(lambda s: adding(s, ("sglang", "0.5.6"), ("flashinfer-python", "0.5.3"))),
            severity=Severity.WARNING,
            title=("(flashinfer-python sglang)",),
            evidence=("added: flashinfer-python 0.5.3, sglang 0.5.6",),
            mentions=("uv pip uninstall -- flashinfer-python sglang",)),
        Hit("dragged-torch-along",
            changed(lambda s: with_torch(adding(s, ("vllm", "0.11.0")),
                                         version="2.9.1+cu128")),
            severity=Severity.CRITICAL,
            evidence=("added: vllm 0.11.0",
                      f"in the same change: torch version {REAL_TORCH} → 2.9.1+cu128")),
    ),
    "package-build-changed": (
        Hit("numpy-rebuilt",
            changed(lambda s: with_package(s, "numpy", fingerprint="sha256:" + "9" * 64)),
            severity=Severity.WARNING, title=("1 package(s)", "numpy"),
            evidence=("numpy 2.5.2: d8313b4f7c8d02f3… → 9999999999999999…",)),
        # PyYAML rebuilt from its sdist without libyaml: a pure wheel where the index's
        # had compiled code (benchmarks/cases_pypi.toml, yaml/pyyaml#108)
        Hit("rebuilt-here-without-its-extension",
            changed(lambda s: with_package(s, "numpy", fingerprint="sha256:" + "9" * 64,
                                           wheel_tags=["py3-none-any"])),
            severity=Severity.CRITICAL, title=("numpy rebuilt here from source",),
            evidence=("numpy: wheel tag py3-none-any (built here; GOOD's: "
                      "cp312-cp312-manylinux_2_27_x86_64, cp312-cp312-manylinux_2_28_x86_64)",)),
    ),
    "package-version-changed": (
        Hit("major-core", changed(lambda s: with_package(s, "numpy", version="3.0.0")),
            severity=Severity.WARNING, evidence=("numpy: 2.5.2 → 3.0.0, major [core]",),
            mentions=('"numpy==2.5.2"',)),
        Hit("minor-core", changed(lambda s: with_package(s, "transformers", version="5.18.0")),
            severity=Severity.WARNING,
            evidence=("transformers: 5.17.0 → 5.18.0, minor [core]",)),
        Hit("patch", changed(lambda s: with_package(s, "tabulate", version="0.10.1")),
            severity=Severity.INFO, evidence=("tabulate: 0.10.0 → 0.10.1, patch",)),
        Hit("local-label", changed(lambda s: with_package(s, "torchaudio",
                                                          version="2.11.0+cu130")),
            evidence=("torchaudio: 2.11.0 → 2.11.0+cu130, local",)),
        Hit("downgrade-of-a-torch-requirement",
            changed(lambda s: with_package(s, "sympy", version="1.13.3")),
            severity=Severity.WARNING,
            evidence=("sympy: 1.14.0 → 1.13.3, minor (downgrade) [core]",)),
        Hit("core-listed-first",
            changed(lambda s: with_package(with_package(s, "tabulate", version="0.10.1"),
                                           "nvidia-nccl-cu13", version="2.29.0")),
            title=("2 package(s) changed version: nvidia-nccl-cu13, tabulate",)),
    ),
    "package-added": (
        Hit("ordinary", changed(lambda s: adding(s, ("wandb", "0.22.0"))),
            severity=Severity.INFO, title=("1 package(s) appeared: wandb",),
            evidence=("wandb 0.22.0",), mentions=("uv pip uninstall -- wandb",)),
    ),
    "package-removed": (
        Hit("einops", changed(lambda s: without_package(s, "einops")),
            severity=Severity.WARNING, title=("disappeared: einops",),
            evidence=("einops 0.8.2",), mentions=('uv pip install -- "einops==0.8.2"',)),
    ),
    "installed-files-modified": (
        Hit("patched-torch-file",
            changed(lambda s: with_issues(s, *s.integrity.issues, IntegrityIssue(
                package="torch", path="torch/fx/_symbolic_trace.py", problem="size",
                expected="51874", actual="52233"))),
            severity=Severity.CRITICAL, title=("1 installed file(s)", "in torch"),
            evidence=("torch: torch/fx/_symbolic_trace.py (size)",),
            mentions=('uv pip install --reinstall --no-deps -- "torch==2.11.0"',)),
        Hit("size-to-hash", both(
            lambda s: with_issues(s, IntegrityIssue(package="certifi", path="certifi/cacert.pem",
                                                    problem="size")),
            lambda s: with_issues(s, IntegrityIssue(package="certifi", path="certifi/cacert.pem",
                                                    problem="missing"))),
            evidence=("certifi: certifi/cacert.pem (missing)",)),
    ),
    "file-changed": (
        Hit("edited", changed(lambda s: with_file(s, REAL_FILE, md5=NEW_MD5, size=10)),
            severity=Severity.WARNING, title=("1 tracked file(s) changed: __init__.py",),
            evidence=(f"{REAL_FILE}: md5 {REAL_FILE_MD5} → {NEW_MD5}",)),
        Hit("deleted", changed(lambda s: with_file(s, REAL_FILE, exists=False, size=None,
                                                   md5=None, sha256=None)),
            evidence=(f"{REAL_FILE}: missing now (md5 was {REAL_FILE_MD5})",)),
        Hit("edited-with-commit", changed(lambda s: with_git(
            with_file(s, REAL_FILE, md5=NEW_MD5), commit="c" * 40)),
            evidence=(f"git commit None → {'c' * 40}",)),
        Hit("incident", incident_pair,
            evidence=("/root/dflash_model.py: md5 210c008e7560ff68dbea6c7ae461aa21 → "
                      "5f3c9a0d2b7e41c8a6d2e9f01b3c4d5e",)),
    ),
    "python-changed": (
        Hit("minor", changed(lambda s: replace(s, interpreter=replace(
            s.interpreter, version="3.13.1"))),
            severity=Severity.CRITICAL,
            title=("Python changed from cpython 3.12.3 to cpython 3.13.1",),
            evidence=("version: 3.12.3 → 3.13.1",),
            mentions=("uv venv --python 3.12.3 -- /opt/torch/.venv",)),
        Hit("patch", changed(lambda s: replace(s, interpreter=replace(
            s.interpreter, version="3.12.9"))), severity=Severity.WARNING),
        Hit("venv-recreated", changed(lambda s: replace(s, interpreter=replace(
            s.interpreter, prefix="/opt/torch/.venv2",
            executable="/opt/torch/.venv2/bin/python3"))),
            severity=Severity.WARNING, title=("the venv was recreated (/opt/torch/.venv2)",)),
    ),
    "gpu-driver-changed": (
        Hit("driver", changed(lambda s: replace(s, system=replace(
            s.system, driver_version="575.57.08"))),
            severity=Severity.WARNING, title=("the NVIDIA driver or CUDA toolkit changed",),
            evidence=("driver_version: 580.159.04 → 575.57.08",)),
        Hit("gpu-model", changed(lambda s: replace(s, system=replace(s.system, gpus=[
            Gpu(index=0, name="NVIDIA H100 80GB HBM3", memory_mib=81559,
                compute_capability="9.0")]))),
            severity=Severity.CRITICAL, title=("the GPUs changed",)),
    ),
    "cuda-runtime-changed": (
        Hit("cuda-lost", both(lambda s: replace(s, deep=DEEP), lambda s: replace(
            s, deep=replace(DEEP, cuda_available=False, device_count=0, device_capability=[]))),
            severity=Severity.CRITICAL, title=("torch can no longer use CUDA",),
            evidence=("cuda_available: True → False",)),
        Hit("nccl", both(lambda s: replace(s, deep=DEEP),
                         lambda s: replace(s, deep=replace(DEEP, nccl_version="2.27.3"))),
            severity=Severity.WARNING, evidence=("nccl_version: 2.28.9 → 2.27.3",)),
    ),
    "env-var-changed": (
        Hit("nccl-set", changed(lambda s: with_env(s, NCCL_P2P_DISABLE=EnvValue(value="1"))),
            severity=Severity.WARNING, evidence=("NCCL_P2P_DISABLE set to 1",)),
        Hit("unset", changed(lambda s: with_env(s, PYTHONPATH=None)),
            severity=Severity.WARNING, evidence=("PYTHONPATH unset (was .)",)),
        Hit("harmless-variable", changed(lambda s: with_env(
            s, UV_HTTP_TIMEOUT=EnvValue(value="600"))),
            severity=Severity.INFO, evidence=("UV_HTTP_TIMEOUT: 300 → 600",),
            mentions=("export UV_HTTP_TIMEOUT=300",)),
        Hit("masked-secret-changed",
            both(lambda s: with_env(s, "k1", HF_TOKEN=secret(TOKEN_DIGEST_OLD)),
                 lambda s: with_env(s, "k1", HF_TOKEN=secret(TOKEN_DIGEST_NEW))),
            severity=Severity.WARNING, evidence=("HF_TOKEN: <masked> → <masked, changed>",),
            hidden=(TOKEN_DIGEST_OLD, TOKEN_DIGEST_NEW, "a1a1a1", "b2b2b2",
                    "export HF_TOKEN")),
        Hit("masked-secret-added",
            changed(lambda s: with_env(s, "k1", WANDB_API_KEY=secret(TOKEN_DIGEST_NEW))),
            severity=Severity.INFO, evidence=("WANDB_API_KEY set to <masked>",),
            hidden=(TOKEN_DIGEST_NEW, "b2b2b2")),
        Hit("redacted-url",
            both(lambda s: with_env(s, "k1", PIP_INDEX_URL=EnvValue(
                value="https://***@pypi.example/simple", masked=True, digest=TOKEN_DIGEST_OLD)),
                 lambda s: with_env(s, "k1", PIP_INDEX_URL=EnvValue(
                     value="https://***@pypi.example/simple", masked=True,
                     digest=TOKEN_DIGEST_NEW))),
            evidence=("PIP_INDEX_URL: https://***@pypi.example/simple → <masked, changed>",),
            hidden=(TOKEN_DIGEST_OLD, TOKEN_DIGEST_NEW)),
    ),
    "git-state-changed": (
        Hit("commit", changed(lambda s: with_git(s, commit="c" * 40)),
            severity=Severity.INFO, evidence=(f"commit: None → {'c' * 40}",)),
        Hit("commit-with-a-newly-tracked-file",
            changed(lambda s: tracking_new_file(with_git(s, commit="c" * 40, branch="fix"))),
            evidence=(f"commit: None → {'c' * 40}", "branch: main → fix")),
    ),
}

MISSES: dict[str, tuple[Miss, ...]] = {
    "known-break": (
        Miss("markupsafe-2.0-still", both(
            lambda s: versions(s, jinja2="2.11.3", markupsafe="2.0.0"),
            lambda s: versions(s, jinja2="2.11.3", markupsafe="2.0.1")),
            instead=("package-version-changed",)),
        Miss("already-broken-in-good", both(
            lambda s: versions(s, jinja2="2.11.3", markupsafe="2.1.0"),
            lambda s: versions(s, jinja2="2.11.3", markupsafe="2.1.1")),
            instead=("package-version-changed",)),
        Miss("jinja2-3-fixed", both(
            lambda s: versions(s, jinja2="3.1.2", markupsafe="2.0.1"),
            lambda s: versions(s, jinja2="3.1.2", markupsafe="2.1.1")),
            instead=("package-version-changed",)),
    ),
    "conda-package-changed": (
        Miss("only-the-spec", conda_pair(conda_pkg("tqdm", "4.66.1",
                                                   requested_spec="tqdm>=4"))),
        Miss("channel-only", conda_pair(conda_pkg("nccl", "2.18.5.1", "h6103f9b_0", "nvidia")),
             instead=("conda-channel-changed",)),
    ),
    "conda-package-added": (Miss("nothing-new", conda_pair()),),
    "conda-package-removed": (
        Miss("version-changed", conda_pair(conda_pkg("mkl", "2024.0.0")),
             instead=("conda-package-changed",)),
    ),
    "conda-channel-changed": (Miss("same-channel", conda_pair(conda_pkg("tqdm", "4.67.0")),
                                   instead=("conda-package-changed",)),),
    "conda-pip-overlap": (Miss("conda-own-dist-info", conda_pair()),),
    "torch-build-changed": (
        Miss("version-changed-too", changed(lambda s: with_package(with_torch(
            s, version="2.12.0+cu130", git_version=GOOD_GIT), "torch", version="2.12.0",
            fingerprint="sha256:" + "e" * 64)), instead=("torch-version-changed",)),
        Miss("torch-removed", changed(lambda s: with_torch(s, present=False, version=None,
                                                           git_version=None)),
             instead=("torch-version-changed",)),
        Miss("only-moved", changed(lambda s: with_torch(s, location="/elsewhere/torch"))),
    ),
    "torch-version-changed": (
        Miss("same-version-other-build", changed(lambda s: with_torch(s, git_version=GOOD_GIT)),
             instead=("torch-build-changed",)),
    ),
    "cuda-build-changed": (
        Miss("cuda-wheel-patch-update",
             changed(lambda s: with_package(with_torch(s, cuda_wheels=[
                 "nvidia-nvtx==13.0.86" if w.startswith("nvidia-nvtx==") else w
                 for w in s.torch.cuda_wheels]), "nvidia-nvtx", version="13.0.86")),
             instead=("package-version-changed",)),
    ),
    "triton-changed": (
        Miss("torch-rebuilt-triton-same", changed(lambda s: with_torch(s, git_version=GOOD_GIT)),
             instead=("torch-build-changed",)),
    ),
    "compile-cache-cold": (
        Miss("grew", both(lambda s: with_cache(s, "inductor", **warm()),
                          lambda s: with_cache(s, "inductor", **warm(files=2000,
                                                                     size=500_000_000)))),
        Miss("shrank", both(lambda s: with_cache(s, "inductor", **warm()),
                            lambda s: with_cache(s, "inductor", **warm(files=3, size=4096)))),
        Miss("was-never-warm", changed(lambda s: with_cache(s, "inductor", exists=True))),
        Miss("compat-key-changed", both(
            lambda s: with_cache(s, "inductor", **warm()),
            lambda s: with_cache(with_torch(s, compat_key=OTHER_KEY), "inductor", **warm())),
            instead=("compile-cache-stale",)),
    ),
    "compile-cache-stale": (
        Miss("filled-by-this-build", changed(lambda s: with_cache(s, "inductor", **warm(
            populated_under=[stamp(s.torch.compat_key or "", REAL_TORCH, REAL_GIT)],
            marker="seen")))),
        Miss("key-changed-but-cache-cold", both(
            lambda s: with_cache(s, "inductor", **warm()),
            lambda s: with_cache(with_torch(s, compat_key=OTHER_KEY), "inductor", **COLD)),
            instead=("compile-cache-cold",)),
    ),
    "compile-cache-volatile": (
        Miss("self-diff-of-a-warm-tmp-cache", same(lambda s: with_cache(s, "inductor", **warm()))),
        Miss("tmp-cache-grew", both(
            lambda s: with_cache(s, "inductor", **warm()),
            lambda s: with_cache(s, "inductor", **warm(files=5000, size=900_000_000)))),
        Miss("moved-out-of-tmp", both(
            lambda s: with_cache(s, "inductor", **warm()),
            lambda s: with_cache(s, "inductor", **warm("/root/.cache/torchinductor",
                                                       source="TORCHINDUCTOR_CACHE_DIR")))),
    ),
    "foreign-stack-installed": (
        Miss("ordinary-package", changed(lambda s: adding(s, ("wandb", "0.22.0"))),
             instead=("package-added",)),
        Miss("training-kernel", changed(lambda s: adding(s, ("flash-attn", "2.8.3"))),
             instead=("package-added",)),
        Miss("serving-stack-already-there", same(lambda s: adding(s, ("sglang", "0.5.6")))),
    ),
    "package-build-changed": (
        Miss("version-changed", changed(lambda s: with_package(
            s, "numpy", version="2.5.3", fingerprint="sha256:" + "9" * 64)),
            instead=("package-version-changed",)),
        Miss("torch-rebuilt", changed(lambda s: with_package(
            s, "torch", fingerprint="sha256:" + "9" * 64)), instead=("torch-build-changed",)),
    ),
    "package-version-changed": (
        Miss("torch-itself", changed(lambda s: with_package(with_torch(
            s, version="2.12.0+cu130"), "torch", version="2.12.0")),
            instead=("torch-version-changed",)),
        Miss("only-the-installer", changed(lambda s: with_package(s, "numpy", installer="pip",
                                                                  requested=True))),
    ),
    "package-added": (
        Miss("serving-stack", changed(lambda s: adding(s, ("sglang", "0.5.6"))),
             instead=("foreign-stack-installed",)),
    ),
    "package-removed": (
        Miss("moved-to-another-folder", changed(lambda s: with_package(
            s, "einops", location="/usr/lib/python3/dist-packages"))),
        Miss("added", changed(lambda s: adding(s, ("wandb", "0.22.0"))),
             instead=("package-added",)),
    ),
    "installed-files-modified": (
        Miss("issue-fixed", changed(lambda s: with_issues(s, *s.integrity.issues[1:]))),
        Miss("not-verified-now", changed(lambda s: replace(s, integrity=replace(
            s.integrity, mode="none", issues=[IntegrityIssue(
                package="torch", path="torch/fx/_symbolic_trace.py", problem="size")])))),
    ),
    "file-changed": (
        Miss("newly-tracked-file", changed(tracking_new_file)),
        Miss("only-the-commit", changed(lambda s: with_git(s, commit="c" * 40)),
             instead=("git-state-changed",)),
    ),
    "python-changed": (
        Miss("pythonpath-variable", changed(lambda s: with_env(
            s, PYTHONPATH=EnvValue(value="/work/other"))), instead=("env-var-changed",)),
        Miss("site-packages-listing", changed(lambda s: replace(s, interpreter=replace(
            s.interpreter, site_packages=s.interpreter.site_packages[:1])))),
    ),
    "gpu-driver-changed": (
        Miss("other-host-same-hardware", changed(lambda s: replace(s, system=replace(
            s.system, hostname="vm2", kernel="6.18.45", memory_bytes=10**12)))),
        Miss("cuda-home-variable", changed(lambda s: with_env(
            s, CUDA_HOME=EnvValue(value="/usr/local/cuda-12.8"))), instead=("env-var-changed",)),
    ),
    "cuda-runtime-changed": (
        Miss("deep-only-in-new", changed(lambda s: replace(s, deep=DEEP))),
        Miss("only-probe-time", both(lambda s: replace(s, deep=DEEP),
                                     lambda s: replace(s, deep=replace(DEEP, seconds=9.9)))),
    ),
    "env-var-changed": (
        Miss("secret-under-another-mask-key",
             both(lambda s: with_env(s, "k1", HF_TOKEN=secret(TOKEN_DIGEST_OLD)),
                  lambda s: with_env(s, "k2", HF_TOKEN=secret(TOKEN_DIGEST_NEW)))),
        Miss("secret-unchanged",
             same(lambda s: with_env(s, "k1", HF_TOKEN=secret(TOKEN_DIGEST_OLD)))),
    ),
    "git-state-changed": (
        Miss("with-an-edited-file", changed(lambda s: with_git(
            with_file(s, REAL_FILE, md5=NEW_MD5), commit="c" * 40)),
            instead=("file-changed",)),
        Miss("only-untracked-count", changed(lambda s: with_git(s, untracked=40))),
    ),
}


# --- the tests ----------------------------------------------------------------------------


def _params(table: dict[str, tuple[Any, ...]]) -> list[Any]:
    params = []
    for rule in ALL_RULES:
        cases = table.get(rule.id, ())
        if not cases:
            params.append(pytest.param(rule.id, None, id=f"{rule.id}-NO-CASES"))
        params += [pytest.param(rule.id, case, id=f"{rule.id}-{case.name}") for case in cases]
    return params


def _shown(f: Finding) -> str:
    return "\n".join((f.title, f.explanation, *f.evidence, *f.remedy))


@pytest.mark.parametrize(("rule_id", "case"), _params(HITS))
def test_rule_hits(rule_id: str, case: Hit | None) -> None:
    if case is None:
        pytest.fail(f"rule {rule_id} has no hit case in tests/envguard/explain/test_rules.py")
    old, new = case.build()
    findings = explain(old, new)
    mine = [f for f in findings if f.rule == rule_id]
    assert len(mine) == 1, [f.rule for f in findings]
    f = mine[0]
    if case.severity is not None:
        assert f.severity is case.severity
    for text in case.title:
        assert text in f.title
    for line in case.evidence:
        assert line in f.evidence
    for text in case.mentions:
        assert text in "\n".join((*f.evidence, *f.remedy))
    shown = _shown(f)
    for text in case.hidden:
        assert text not in shown
    assert f.title and "\n" not in f.title
    assert f.evidence and f.remedy


@pytest.mark.parametrize(("rule_id", "case"), _params(MISSES))
def test_rule_misses(rule_id: str, case: Miss | None) -> None:
    if case is None:
        pytest.fail(f"rule {rule_id} has no near-miss case in tests/envguard/explain/test_rules.py")
    old, new = case.build()
    fired = [f.rule for f in explain(old, new)]
    assert rule_id not in fired
    for other in case.instead:
        assert other in fired


def test_every_case_names_a_real_rule() -> None:
    ids = {rule.id for rule in ALL_RULES}
    assert set(HITS) == ids
    assert set(MISSES) == ids


def test_rule_ids_are_unique() -> None:
    ids = [rule.id for rule in ALL_RULES]
    assert len(ids) == len(set(ids))


def test_public_rule_ids_exist() -> None:
    contract = {
        "torch-build-changed", "torch-version-changed", "cuda-build-changed", "triton-changed",
        "compile-cache-cold", "compile-cache-stale", "compile-cache-volatile",
        "foreign-stack-installed", "package-build-changed", "package-version-changed",
        "package-added", "package-removed", "installed-files-modified", "file-changed",
        "python-changed", "gpu-driver-changed", "env-var-changed",
        "conda-package-changed", "conda-package-added", "conda-package-removed",
        "conda-channel-changed", "conda-pip-overlap",
    }
    assert contract <= {rule.id for rule in ALL_RULES}


def test_real_snapshot_against_itself_is_silent() -> None:
    s = real_h200()
    assert diff(s, s).equivalent
    assert diff(s, s).changes == ()
    assert explain(s, s) == []
    assert explain(s, real_h200()) == []


def test_growth_of_a_warm_cache_is_not_a_material_difference() -> None:
    old = with_cache(base(), "inductor", **warm())
    new = with_cache(base(), "inductor", **warm(files=2000, size=500_000_000))
    changes = diff(old, new)
    assert changes.changes and changes.equivalent


def _severity_then_weight(findings: list[Finding]) -> list[tuple[int, int]]:
    return [(f.severity.rank, -f.weight) for f in findings]


def test_without_symptom_order_is_severity_then_weight() -> None:
    findings = explain(*incident_pair())
    key = _severity_then_weight(findings)
    assert key == sorted(key)
    assert [f.rule for f in findings][:3] == ["torch-build-changed", "compile-cache-cold",
                                               "installed-files-modified"]
    assert explain(*incident_pair(), symptom="") == findings
    assert {f.severity for f in findings} == set(Severity)


def _nccl_pair() -> Pair:
    old = base()
    new = with_env(replace(old, interpreter=replace(old.interpreter, version="3.13.1")),
                   NCCL_P2P_DISABLE=EnvValue(value="1"),
                   UV_HTTP_TIMEOUT=EnvValue(value="600"))
    return old, adding(new, ("wandb", "0.22.0"))


def test_nccl_symptom_moves_the_nccl_variable_up() -> None:
    old, new = _nccl_pair()
    plain = [f.rule for f in explain(old, new)]
    assert plain.index("python-changed") < plain.index("env-var-changed")
    symptom = "NCCL WARN NET/IB : Got completion from peer with error 12, opcode 0"
    ranked = explain(old, new, symptom=symptom)
    assert ranked[0].rule == "env-var-changed"
    assert "nccl" in ranked[0].keywords
    hits = [matches_symptom(f, symptom) for f in ranked]
    assert hits == sorted(hits, reverse=True)  # every match before every non-match
    assert not matches_symptom(next(f for f in ranked if f.rule == "python-changed"), symptom)


def test_env_var_finding_without_nccl_does_not_match_nccl_symptom() -> None:
    old = base()
    new = with_env(old, UV_HTTP_TIMEOUT=EnvValue(value="600"))
    (finding,) = explain(old, new)
    assert finding.rule == "env-var-changed"
    assert not matches_symptom(finding, "NCCL WARN NET/IB : Got completion with error 12")


def test_undefined_cuda_symbol_puts_the_cuda_build_first() -> None:
    old = with_cache(with_issues(base()), "inductor", **warm())
    new = with_cache(with_torch(
        with_issues(base(), IntegrityIssue(package="torch", path="torch/_inductor/utils.py",
                                           problem="hash")),
        cuda_wheel_family="mixed", cuda_wheels=sorted([*base().torch.cuda_wheels, *CU12])),
        "inductor", **COLD)
    plain = [f.rule for f in explain(old, new)]
    assert plain[0] == "compile-cache-cold"
    assert plain.index("installed-files-modified") < plain.index("cuda-build-changed")
    ranked = explain(old, new, symptom="undefined symbol: cudaGetDriverEntryPointByVersion")
    assert ranked[0].rule == "cuda-build-changed"
    rest = ranked[1:]
    assert _severity_then_weight(rest) == sorted(_severity_then_weight(rest))


def test_symptom_matching_ignores_case_and_whitespace() -> None:
    old, new = _nccl_pair()
    finding = next(f for f in explain(old, new) if f.rule == "env-var-changed")
    assert matches_symptom(finding, "  nccl\n\twarn  ")
    assert matches_symptom(finding, "CUDA_VISIBLE\n  DEVICES... visible   devices")
    assert not matches_symptom(finding, "segmentation fault")


def test_cases_do_not_mutate_the_shared_snapshot() -> None:
    before = real_h200()
    for table in (HITS, MISSES):
        for cases in table.values():
            for case in cases:
                case.build()
    assert base() == before
    assert dataclasses.asdict(base()) == dataclasses.asdict(before)


def _remedy_of_env_change(old: Snapshot, new: Snapshot) -> tuple[str, ...]:
    return next(f for f in explain(old, new) if f.rule == "env-var-changed").remedy


def test_env_var_remedy_without_good_values_falls_back() -> None:
    old = base()  # a variable only added: there is no good value to export
    new = with_env(old, NCCL_P2P_DISABLE=EnvValue(value="1"))
    assert _remedy_of_env_change(old, new) == ("restore the launch environment",)


def test_env_var_remedy_never_cuts_an_export_line() -> None:
    names = [f"TORCH_SETTING_{i}" for i in range(12)]
    old = with_env(base(), **{n: EnvValue(value=f"{n.lower()}-" + "x" * 40) for n in names})
    new = with_env(base(), **{n: EnvValue(value="changed") for n in names})
    (remedy,) = _remedy_of_env_change(old, new)
    head, _, exports = remedy.partition(": ")
    assert head == "set them back in the launch script, or export the good values"
    shown = exports.split("; ")
    whole = {f"export {n}={n.lower()}-" + "x" * 40 for n in names}
    assert shown[-1].startswith("… and ") and shown[-1].endswith(" more"), shown[-1]
    assert set(shown[:-1]) <= whole and len(shown) > 2, shown  # every export shown is whole
    assert len(shown) - 1 + int(shown[-1].split()[2]) == len(names)


def test_a_file_newer_than_its_record_is_a_warning_that_names_verify_hash() -> None:
    """Same size, written after install: an edit or an exact revert; only --verify hash
    can tell, so it is not CRITICAL and the remedy says how to confirm."""
    good = base()
    touched = replace(good, integrity=replace(good.integrity, issues=[
        IntegrityIssue(package="torch", path="torch/fx/_symbolic_trace.py",
                       problem="modified-after-install")]))
    (finding,) = [f for f in explain(good, touched) if f.rule == "installed-files-modified"]
    assert finding.severity is Severity.WARNING
    assert "--verify hash" in finding.explanation and "--verify hash" in finding.remedy[-1]
    sized = replace(touched, integrity=replace(good.integrity, issues=[
        IntegrityIssue(package="torch", path="torch/fx/_symbolic_trace.py", problem="size",
                       expected="1", actual="2")]))
    (finding,) = [f for f in explain(good, sized) if f.rule == "installed-files-modified"]
    assert finding.severity is Severity.CRITICAL
