"""Known error messages and the rules they point at, as data.

``envguard diff --symptom`` and ``envguard doctor --symptom`` take a pasted error line;
findings whose rule a matching row names come first, by the row's weight, then by the
rule's own keywords (:func:`envguard.explain.symptom_score`). A row may also name a
``key`` (an environment variable): it then counts only for a finding that mentions it,
so "invalid device ordinal" lifts the CUDA_VISIBLE_DEVICES change, not every variable.

Each pattern was checked against real error lines from public bug reports; docs/CASES.md
cites them, and the cases in tests/cases/ pass those lines as ``--symptom``.
"""

from __future__ import annotations

import re

from envguard.explain.interface import Finding
from envguard.frozen import frozen
from envguard.redact import redact_text


@frozen
class Symptom:
    pattern: re.Pattern[str]
    rules: tuple[str, ...]
    """Rule ids, most likely first (an earlier rule gets a little more weight)."""
    weight: int
    key: str | None = None
    """Only findings that mention this name (in the title or evidence) count."""


def _s(pattern: str, rules: tuple[str, ...], weight: int, key: str | None = None) -> Symptom:
    return Symptom(pattern=re.compile(pattern, re.IGNORECASE), rules=rules, weight=weight,
                   key=key)


SYMPTOMS: tuple[Symptom, ...] = (
    _s(r"invalid device ordinal", ("env-var-changed",), 20, key="CUDA_VISIBLE_DEVICES"),
    _s(r"CUDA_VISIBLE_DEVICES|no CUDA-capable device is detected|no CUDA GPUs are available",
       ("env-var-changed", "torch-cpu-build-on-gpu-host", "gpu-changed"), 12,
       key="CUDA_VISIBLE_DEVICES"),
    _s(r"Torch not compiled with CUDA enabled",
       ("torch-cpu-build-on-gpu-host", "cuda-build-changed", "torch-version-changed"), 20),
    _s(r"undefined symbol",
       ("extension-built-for-other-torch", "cuda-build-changed", "torch-build-changed",
        "torch-version-changed", "requirements-unsatisfied", "package-version-changed"), 16),
    _s(r"lib(cudnn|cublas|cublasLt|cudart|nvrtc|cusparse|cufft|nccl|nvJitLink)[\w.]*\.so"
       r"[\w.]*: cannot open shared object file",
       ("cuda-wheels-mixed", "package-removed", "cuda-library-shadowed", "cuda-build-changed"),
       16),
    _s(r"cannot open shared object file",
       ("cuda-wheels-mixed", "package-removed", "cuda-library-shadowed"), 8),
    _s(r"Detected that you are using FX to symbolically trace a dynamo-optimized function"
       r"|is_fx_symbolic_tracing|_is_fx_tracing_flag",
       ("compile-cache-cold", "torch-build-changed", "installed-files-modified"), 20),
    _s(r"driver version is insufficient|CUDA driver version is too old|found no NVIDIA "
       r"driver|The NVIDIA driver on your system is too old",
       ("cuda-driver-too-old", "cuda-build-changed", "gpu-driver-changed"), 20),
    _s(r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+",
       ("cuda-wheels-mixed", "cuda-library-shadowed", "cuda-build-changed"), 12),
    _s(r"no kernel image is available for execution on the device",
       ("cuda-build-changed", "torch-version-changed", "gpu-changed"), 14),
    _s(r"No module named|ModuleNotFoundError",
       ("package-removed", "requirements-unsatisfied", "package-version-changed"), 10),
    _s(r"ImportError: cannot import name|has no attribute",
       ("package-version-changed", "requirements-unsatisfied", "duplicate-distribution",
        "installed-files-modified"), 10),
    _s(r"version mismatch|was compiled against|compiled using|built for",
       ("extension-built-for-other-torch", "cuda-library-shadowed", "requirements-unsatisfied",
        "package-version-changed"), 10),
    _s(r"NCCL (?:error|WARN)|ncclInternalError|ncclUnhandledCudaError",
       ("env-var-changed", "package-version-changed", "cuda-build-changed"), 10, key="NCCL"),
    _s(r"recompil|cache miss|fxgraph_cache", ("compile-cache-stale", "compile-cache-cold"), 8),
)


def _mentions(finding: Finding, key: str) -> bool:
    return key in finding.title or any(key in line for line in finding.evidence)


def symptom_text(symptom: str | None) -> str | None:
    """A pasted ``--symptom`` as it may enter a report or a record: credentials in it
    masked (an error line may quote a URL with its password, a ``--token=`` flag, an
    ``Authorization:`` header). Matching uses this text too."""
    return redact_text(symptom) if symptom else symptom


def table_score(finding: Finding, symptom: str) -> int:
    """The weight the table gives ``finding`` for ``symptom`` (0 when no row applies)."""
    score = 0
    for row in SYMPTOMS:
        if finding.rule not in row.rules or not row.pattern.search(symptom):
            continue
        if row.key is not None and not _mentions(finding, row.key):
            continue
        score += row.weight + (len(row.rules) - row.rules.index(finding.rule))
    return score


def keyed_match(finding: Finding, symptom: str) -> bool:
    """Whether a row of the table that names one variable or library (its ``key``: "invalid
    device ordinal" and ``CUDA_VISIBLE_DEVICES``) applies to ``finding``: a match that
    specific lifts the finding above every other severity, as a named package does."""
    return any(row.key is not None and finding.rule in row.rules
               and row.pattern.search(symptom) and _mentions(finding, row.key)
               for row in SYMPTOMS)
