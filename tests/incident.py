"""The incident of docs/INCIDENT.md, as a pair of snapshots derived from a real one.

``tests/data/h200-snapshot.json`` is a real snapshot of the H200 GPU machine
(torch 2.11.0+cu130, git 70d99e99…, the incident's build, 197 distributions).
``incident_pair()`` rewrites it into the good state and the broken state of the
write-ups: same torch version string from another commit, cu12 wheels mixed with
cu13 leftovers, SGLang/flashinfer/tilelang installed, a patched
``torch/fx/_symbolic_trace.py``, the 353 MB inductor cache deleted, and an edited
``dflash_model.py``. Deterministic, so renderers can be checked against goldens.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from envguard.model import (
    BuildStamp,
    CacheDir,
    Distribution,
    Files,
    IntegrityIssue,
    Snapshot,
    TrackedFile,
)
from envguard.snapshot_file import read_snapshot

DATA = Path(__file__).parent / "data"
GOOD_GIT = "e2b8a1c7f0d94c3b8a5f6e7d8c9b0a1f2e3d4c5b"
BAD_GIT = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
CU12 = ["nvidia-cublas-cu12==12.8.4.1", "nvidia-cuda-runtime-cu12==12.8.90",
        "nvidia-cudnn-cu12==9.10.2.21", "nvidia-nccl-cu12==2.27.3"]


def real_h200() -> Snapshot:
    return read_snapshot(DATA / "h200-snapshot.json")


def _dist(name: str, version: str, fingerprint: str) -> Distribution:
    return Distribution(name=name, version=version, metadata_dir=f"{name}-{version}.dist-info",
                        location="/opt/torch/.venv/lib/python3.12/site-packages",
                        installer="uv", fingerprint=fingerprint)


def _cache(path: str, files: int, size: int, stamp: BuildStamp | None) -> CacheDir:
    return CacheDir(kind="inductor", path=path, source="default", exists=files > 0,
                    total_bytes=size, files=files,
                    entries={"aotautograd": files // 4, "fxgraph": files // 4,
                             "triton": files // 2} if files else {},
                    filesystem="ext4", populated_under=[stamp] if stamp else [],
                    marker="seen" if stamp else "none")


def _files(md5_model: str, md5_train: str) -> Files:
    def tracked(name: str, md5: str) -> TrackedFile:
        return TrackedFile(pattern="/root/*.py", path=f"/root/{name}", exists=True, size=1000,
                           md5=md5, sha256=md5 * 2)

    return Files(files=[tracked("dflash_model.py", md5_model),
                        tracked("train_dflash_pipeline.py", md5_train)])


def incident_pair() -> tuple[Snapshot, Snapshot]:
    base = real_h200()
    others = [p for p in base.packages if not p.name.startswith(("nvidia-", "cuda-"))
              and p.name != "torch"]
    torch_dist = base.package("torch")
    assert torch_dist is not None
    good_key, bad_key = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    stamp = BuildStamp(compat_key=good_key, torch_version="2.11.0+cu128",
                       torch_git_version=GOOD_GIT, triton_version="3.6.0",
                       first_seen="2026-11-20T09:14:02Z")
    good_torch = dataclasses.replace(
        base.torch, version="2.11.0+cu128", git_version=GOOD_GIT, cuda="12.8",
        cuda_wheel_family="cu12", cuda_wheels=CU12, compat_key=good_key,
        version_fields={**base.torch.version_fields, "git_version": GOOD_GIT, "cuda": "12.8"})
    cu12 = [_dist(w.split("==")[0], w.split("==")[1], "sha256:" + str(i) * 64)
            for i, w in enumerate(CU12)]
    good = dataclasses.replace(
        base, torch=good_torch,
        packages=sorted([*others, *cu12, dataclasses.replace(
            torch_dist, version="2.11.0+cu128", fingerprint="sha256:" + "a" * 64)],
            key=lambda p: p.name),
        caches=[_cache("/tmp/torchinductor_root", 1234, 353_000_000, stamp),
                *[c for c in base.caches if c.kind != "inductor"]],
        files=_files("210c008e7560ff68dbea6c7ae461aa21", "03835dc46af1c679d330eef93d1351b2"),
        integrity=dataclasses.replace(base.integrity, issues=[]),
    )
    cu13 = [p for p in base.packages if p.name.startswith(("nvidia-", "cuda-"))]
    foreign = [_dist("sglang", "0.5.6", "sha256:" + "b" * 64),
               _dist("flashinfer-python", "0.5.3", "sha256:" + "c" * 64),
               _dist("tilelang", "0.1.7", "sha256:" + "d" * 64)]
    bad_torch = dataclasses.replace(
        good_torch, git_version=BAD_GIT, cuda_wheel_family="mixed",
        cuda_wheels=sorted([*CU12, *base.torch.cuda_wheels]), compat_key=bad_key,
        version_fields={**good_torch.version_fields, "git_version": BAD_GIT})
    now = dataclasses.replace(
        good, torch=bad_torch,
        packages=sorted(
            [p for p in good.packages if p.name != "torch"]
            + [dataclasses.replace(torch_dist, version="2.11.0+cu128",
                                   fingerprint="sha256:" + "e" * 64)]
            + foreign + cu13, key=lambda p: p.name),
        caches=[_cache("/tmp/torchinductor_root", 0, 0, None),
                *[c for c in base.caches if c.kind != "inductor"]],
        files=_files("5f3c9a0d2b7e41c8a6d2e9f01b3c4d5e", "03835dc46af1c679d330eef93d1351b2"),
        integrity=dataclasses.replace(base.integrity, issues=[
            IntegrityIssue(package="torch", path="torch/fx/_symbolic_trace.py", problem="size",
                           expected="51874", actual="52233")]),
    )
    return good, now
