"""torch's build identity, read from ``torch/version.py`` with ``ast``; torch is never imported.

``import torch`` takes about 2 s and can crash in a broken environment, which is
exactly when envguard is needed. ``version.py`` is generated at build time and
holds only literal assignments, so parsing it is safe and takes well under 1 ms.
"""

from __future__ import annotations

import hashlib
import os

from envguard.explain.tables import CUDA_SUFFIX, TRACKS_CUDA_MAJOR, UNSUFFIXED_CUDA
from envguard.input_file import SMALL_FILE_BYTES, NotReadable, read_bounded
from envguard.model import Distribution, ProbeIssue, TorchIdentity
from envguard.probe.distributions import InstalledDist
from envguard.probe.stated import parse_version_py

_TRITON_NAMES = ("triton", "pytorch-triton", "pytorch-triton-rocm", "triton-rocm")


def cuda_wheels(dists: list[Distribution]) -> tuple[str | None, list[str]]:
    """The CUDA wheel family present (``cu12``, ``cu13``, ``mixed``) and the wheels behind it."""
    families: set[str] = set()
    names: list[str] = []
    for dist in dists:
        family = None
        match = CUDA_SUFFIX.match(dist.name)
        if match:
            family = f"cu{match.group(1)}"
        elif dist.name in UNSUFFIXED_CUDA:
            major = (dist.version or "").split(".", 1)[0]
            tracked = dist.name in TRACKS_CUDA_MAJOR and major.isdigit() and int(major) >= 13
            family = f"cu{major}" if tracked else "cu13"
        if family:
            families.add(family)
            names.append(f"{dist.name}=={dist.version}")
    if not families:
        return None, []
    return (families.pop() if len(families) == 1 else "mixed"), sorted(names)


def _find_version_py(sys_path: list[str], torch_dist: Distribution | None) -> str | None:
    candidates = [torch_dist.location] if torch_dist else []
    candidates += sys_path
    for folder in candidates:
        path = os.path.join(folder or ".", "torch", "version.py")
        if os.path.lexists(path):  # a FIFO or a link to a device is found, and refused
            return path
    return None


def probe(
    installed: list[InstalledDist], sys_path: list[str]
) -> tuple[TorchIdentity, list[ProbeIssue]]:
    dists = [i.dist for i in installed]
    by_name = {d.name: d for d in dists}
    torch_dist = by_name.get("torch")
    triton = next((by_name[n] for n in _TRITON_NAMES if n in by_name), None)
    family, wheels = cuda_wheels(dists)
    issues: list[ProbeIssue] = []
    common = {
        "dist_version": torch_dist.version if torch_dist else None,
        "triton_version": triton.version if triton else None,
        "triton_fingerprint": triton.fingerprint if triton else None,
        "cuda_wheel_family": family,
        "cuda_wheels": wheels,
    }
    path = _find_version_py(sys_path, torch_dist)
    if path is None:
        if torch_dist is not None:
            issues.append(ProbeIssue(section="torch", message="torch is installed but "
                                     "torch/version.py is missing", path=torch_dist.location))
        return TorchIdentity(present=torch_dist is not None, **common), issues  # type: ignore[arg-type]
    try:  # a regular file of at most 1 MiB: a FIFO or /dev/zero here must not hang us
        text = read_bounded(path, limit=SMALL_FILE_BYTES, what="torch/version.py").decode()
        fields = parse_version_py(text)
    except (NotReadable, OSError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        why = exc.reason if isinstance(exc, NotReadable) else (str(exc) or type(exc).__name__)
        issues.append(ProbeIssue(section="torch", path=path, message="cannot read "
                                 f"torch/version.py: {why.splitlines()[0]}"))
        return TorchIdentity(present=True, location=os.path.dirname(path), **common), issues  # type: ignore[arg-type]

    def text_field(name: str) -> str | None:
        value = fields.get(name)
        return value if isinstance(value, str) else None

    debug = fields.get("debug")
    return (
        TorchIdentity(
            present=True,
            location=os.path.dirname(path),
            version=text_field("__version__"),
            git_version=text_field("git_version"),
            cuda=text_field("cuda"),
            hip=text_field("hip"),
            debug=debug if isinstance(debug, bool) else None,
            version_fields=fields,
            **common,  # type: ignore[arg-type]
        ),
        issues,
    )


def compat_key(
    identity: TorchIdentity, torch_item: InstalledDist | None, gpu_names: list[str]
) -> str | None:
    """An import-free stand-in for inductor's cache keys.

    torch's own key hashes every torch ``.py`` source (``torch_key``), triton's
    sources and ``libtriton`` (``triton_key``), and the GPU name with the CUDA
    version (``CacheBase.get_system``). The RECORD digests of torch's ``.py`` files
    and triton's fingerprint carry the same information without reading 1 GB.
    A changed key means every cached compile artifact will miss, silently.
    """
    if not identity.present or identity.version is None:
        return None
    h = hashlib.sha256()
    for part in (identity.version, identity.git_version, identity.cuda, identity.hip,
                 identity.triton_version, identity.triton_fingerprint, *sorted(gpu_names)):
        h.update(f"{part}\n".encode())
    if torch_item is not None and torch_item.record is not None:
        h.update(torch_item.record.py_material())  # the sorted .py rows, kept by the memo
    return "sha256:" + h.hexdigest()
