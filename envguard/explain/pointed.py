"""Findings from the error's own words, where no change or rule explains what it names.

``diff`` and ``doctor`` with ``--symptom``, and the gate after a failed run, add these to
the rules' findings:

* ``shadowed-module-suspected``: the error says a module was only partially initialized
  (``partially initialized module 'random' has no attribute 'randint'``) and nothing
  changed the module's distribution (or it is the standard library's): a file or folder
  of that name in the working folder or on ``PYTHONPATH`` is imported instead;
* ``error-points-at`` (doctor only, no baseline): the distribution the error's module
  belongs to, with its installed version and, where a known break matches the error, its
  fix; a doctor without a baseline cannot say what changed, but it can say whose code
  failed.

Pure: snapshots and the error's facts in, findings out.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator, Sequence

from envguard.explain.culprits import names_suspect, suspects
from envguard.explain.error_forms import ErrorFacts
from envguard.explain.remedies import remedy, uv_pip_install
from envguard.findings import Finding, Severity
from envguard.model import Snapshot

__all__ = ["for_diff", "for_doctor"]


def _shadow(facts: ErrorFacts, new: Snapshot, old: Snapshot | None,
            exclude: Sequence[str]) -> Iterator[Finding]:
    if "circular-import" not in facts.kinds or not facts.modules:
        return
    module = facts.modules[0].split(".")[0]
    if module in exclude:
        return
    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
    owners = suspects(ErrorFacts(modules=(module,)), (new,))
    dist = new.package(owners[0]) if owners else None
    before = old.package(dist.name) if old is not None and dist is not None else None
    if dist is not None and old is not None and (
            before is None or (before.version, before.fingerprint)
            != (dist.version, dist.fingerprint)):
        return  # it changed: the rules say so, with the change
    if module in stdlib:
        whose = f"the standard library's '{module}'"
    elif dist is not None:
        whose = f"{dist.name} {dist.version}'s '{module}'" + (
            " (the same in both snapshots)" if old is not None else "")
    else:
        whose = f"'{module}'"
    yield Finding(
        rule="shadowed-module-suspected", severity=Severity.CRITICAL,
        title=f"'{module}' is probably shadowed: a {module}.py or {module}/ in the working "
              "folder or on PYTHONPATH is imported instead",
        explanation="Python imports from the command's folder (python -c, python -m, a "
                    "script's own folder) and from PYTHONPATH before site-packages. A file "
                    "named like a module that imports the real one ends up importing itself: "
                    "'partially initialized module ... (most likely due to a circular "
                    "import)'.",
        evidence=(f"the error names {whose}",),
        remedy=(f"look for {module}.py or a {module}/ folder where the command runs and on "
                f"PYTHONPATH; rename it and delete its __pycache__ (envguard doctor, run "
                "there, names it)",),
        weight=95, keywords=("partially initialized module", "circular import", module))


def for_diff(facts: ErrorFacts, new: Snapshot, old: Snapshot) -> list[Finding]:
    """What the error alone says, beside a diff's findings."""
    return list(_shadow(facts, new, old, ()))


def for_doctor(facts: ErrorFacts, text: str, snapshot: Snapshot,
               findings: Sequence[Finding]) -> list[Finding]:
    """What the error alone says, beside the doctor's findings (which may already name a
    shadowing file, or the distribution)."""
    shown = {f.rule for f in findings}
    out = [] if "module-shadowed" in shown else list(_shadow(facts, snapshot, None, ()))
    if out or any(f.severity is Severity.CRITICAL for f in findings):
        return out  # a critical finding speaks for itself
    names = suspects(facts, (snapshot,), text)
    dist = snapshot.package(names[0]) if names else None
    if dist is None or any(names_suspect(f, (dist.name,)) is not None for f in findings):
        return out
    from envguard.explain.knowledge import known_breaks

    fixes = [req for e in known_breaks() if e.dependency == dist.name and e.matches_error(text)
             for req in e.fix]
    out.append(Finding(
        rule="error-points-at", severity=Severity.INFO,
        title=f"the error points at {dist.name} {dist.version}",
        explanation="The module the error names belongs to this distribution. With no "
                    "earlier snapshot the doctor cannot say what changed; envguard diff "
                    "@last-good @now --symptom ... can, where a good state was recorded.",
        evidence=tuple(f"the error names {m}" for m in facts.modules[:2])
        + tuple(f"the error names {d}" for d in facts.dists[:2] if d not in facts.modules),
        remedy=tuple(remedy(functools.partial(uv_pip_install, [req]), "a known fix: ")
                     for req in fixes[:2])
        or (remedy(functools.partial(uv_pip_install, [f"{dist.name}<{dist.version}"]),
                   "go back to a version before this one: "),),
        weight=40, keywords=(dist.name, *facts.modules[:2])))
    return out
