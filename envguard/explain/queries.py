"""What the diff rules and the doctor both read off a snapshot, and the findings and
remedies they both build from it. A neutral module: the doctor imports these from here,
never from a rule module (``tests/test_architecture.py``); the tables themselves are in
:mod:`envguard.explain.tables`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from envguard.changes import Change
from envguard.explain.remedies import chain, conda_command, remedy, uv_cache_clean
from envguard.explain.tables import CONDA_CUDA
from envguard.findings import Finding, Severity
from envguard.model import Distribution, IntegrityIssue, Snapshot

__all__ = ["clean_then_reinstall", "cold_story", "conda_cuda_families", "conda_reinstall",
           "edit_in_uv_cache", "overlap_finding", "shared_note", "shared_story"]

_IN_UV_CACHE = (
    " Edited files with more than one hard link are shared with other paths: uv installs by "
    "hard link from its cache (its default link mode on Linux), so the edit is in uv's cache "
    "too, in every venv linked from it, and in the next venv uv installs the package into. A "
    "reinstall alone links the same edited file back: drop the package from uv's cache "
    "first, then reinstall. --link-mode=copy (UV_LINK_MODE=copy) on that reinstall gives "
    "this venv copies of its own, so that a later edit stays in it; on its own it copies the "
    "edited file out of the cache.")
_LINKED = (
    " Edited files with more than one hard link are shared with other paths (a tree copied "
    "with cp -l, another installer's cache): the edit is in each of them. A reinstall "
    "replaces this environment's file only; the other paths keep the edit.")


def conda_cuda_families(snapshot: Snapshot) -> dict[str, list[str]]:
    """``{"cu12": ["cuda-runtime=12.4.1 (conda)", ...]}``: the CUDA majors conda brought."""
    out: dict[str, list[str]] = {}
    for pkg in snapshot.conda:
        major = pkg.version.split(".")[0]
        if pkg.name in CONDA_CUDA and major.isdigit() and int(major) >= 10:
            out.setdefault(f"cu{major}", []).append(f"{pkg.name}={pkg.version} (conda)")
    return out


def conda_reinstall(snapshot: Snapshot, owner: str) -> str:
    """``conda install --force-reinstall "nccl=2.18.5.1=h6103f9b_0"`` for ``conda:nccl``."""
    name = owner.removeprefix("conda:")
    pkg = next((p for p in snapshot.conda if p.name == name), None)
    spec = f"{name}={pkg.version}={pkg.build}" if pkg is not None else name
    return remedy(lambda: conda_command("install", [spec], options=["--force-reinstall"]))


def overlap_finding(evidence: list[str], names: list[str],
                    changes: tuple[Change, ...] = ()) -> Finding:
    """pip or uv installed over conda packages: for the diff (it happened since) and for
    the doctor (it is so now)."""
    return Finding(
        rule="conda-pip-overlap", severity=Severity.CRITICAL,
        title=f"pip or uv installed over conda packages: {', '.join(names[:6])}",
        explanation="Both conda and pip think they own the package: the files on disk are "
                    "the last installer's, conda's record says otherwise, and the next "
                    "conda transaction may overwrite or remove them (torch from both is "
                    "the usual case).",
        evidence=tuple(evidence),
        remedy=("keep one owner: pip uninstall the package and conda install it again, or "
                "remove the conda package and keep pip's",),
        changes=changes, weight=85, keywords=tuple(names))


def _has_flex(snapshot: Snapshot) -> bool:
    """flex_attention is in torch from 2.5, and the bundled trainer uses it."""
    if snapshot.package("envguard") is not None and snapshot.package("torch") is not None:
        return True
    version = (snapshot.torch.version or "").split("+")[0].split(".")
    return len(version) >= 2 and version[0].isdigit() and version[1].isdigit() \
        and (int(version[0]), int(version[1])) >= (2, 5)


def cold_story(snapshot: Snapshot) -> tuple[str, str]:
    """(title tail, explanation) of a cold compile cache, quoting only facts that apply
    here: flex_attention's figures where torch has it, GPU timings only on a GPU host."""
    if not snapshot.torch.present:
        return (", so the next torch.compile starts cold",
                "With a warm cache, compiles hit the FX-graph and AOTAutograd caches and skip "
                "tracing; cold, every graph is traced and compiled again. (torch is not "
                "installed in this environment, so nothing here compiles today.)")
    flex = _has_flex(snapshot)
    gpu = bool(snapshot.system.gpus)
    parts = ["With a warm cache, compiles hit the FX-graph and AOTAutograd caches and skip "
             "tracing. Cold, every graph is traced again"
             + (": the first flex_attention forward and backward took 8.3 s on the H200."
                if flex and gpu else ".")]
    parts.append("Tracing sets a process-wide flag (torch.fx._symbolic_trace."
                 "_is_fx_tracing_flag), so first-time compiles in several threads of one "
                 "process can hang or fail"
                 + (": measured, 3 threads compiling flex_attention at once on an empty "
                    "cache hung (> 110 s, 2 of 2 processes), and threads that compile while "
                    "another calls a compiled function raise 'Detected that you are using FX "
                    "to symbolically trace a dynamo-optimized function'." if flex else "."))
    parts.append("A warm cache hid this race for days in the incident; deleting the cache "
                 "exposed it.")
    tail = (", so every process compiles flex_attention cold at its first step" if flex
            else ", so every process compiles cold at its first step")
    return tail, " ".join(parts)


def built_here(dist: Distribution | None) -> bool:
    """Built on this machine from its sdist: every wheel tag has the bare ``linux_*``
    platform, which no index serves (PyPI takes only ``manylinux``/``musllinux``)."""
    return bool(dist is not None and dist.wheel_tags) and all(
        re.search(r"-linux_[a-z0-9_]+$", tag) for tag in (dist.wheel_tags if dist else ()))


def shared_note(issue: IntegrityIssue) -> str:
    """What shares an edited file, for its evidence line (empty for a file of one link):
    ``; 3 hard links: uv's cache (/root/.cache/uv/archive-v0/ID) and 1 other path``."""
    if not issue.links:
        return ""
    if not issue.shared_with:
        return f"; {issue.links} hard links: other paths share the edit"
    others = max(0, issue.links - 2)
    return (f"; {issue.links} hard links: uv's cache ({issue.shared_with})"
            + (f" and {others} other path(s), venvs linked from it" if others else ""))


def shared_story(snapshot: Snapshot, names: Iterable[str]) -> str:
    """What the ``installed-files-modified`` finding (diff's and doctor's) adds when edited
    files of ``names`` are shared by hard link: uv's cache, or other paths; else nothing."""
    names = list(names)
    if any(edit_in_uv_cache(snapshot, n) for n in names):
        return _IN_UV_CACHE
    wanted = set(names)
    return _LINKED if any(i.links and i.package in wanted
                          for i in snapshot.integrity.issues) else ""


def edit_in_uv_cache(snapshot: Snapshot, name: str) -> bool:
    """Whether an edit of ``name``'s files is in uv's cache too, so that a reinstall alone
    would link it back: a shared file was found there, or uv installed the package and a
    file it edited has other links (the cache was not found within the search's bounds)."""
    dist = snapshot.package(name)
    by_uv = dist is not None and dist.installer == "uv"
    return any(i.package == name and i.links and (i.shared_with or by_uv)
               for i in snapshot.integrity.issues)


def clean_then_reinstall(name: str, reinstall: Callable[[], Sequence[str]],
                         suffix: str = "") -> str:
    """``uv cache clean -- "NAME" && <reinstall>``: the remedy for an edit shared with uv's
    cache (:func:`edit_in_uv_cache`)."""
    return chain(lambda: uv_cache_clean([name]), reinstall, suffix=suffix)
