"""Doctor rules about what is imported before the environment's own packages: a module in
the working folder or on ``PYTHONPATH`` named like a standard-library module or an
installed one (``random.py``, ``numpy.py``), and ``PYTHONPATH`` holding another Python's
``site-packages``. Read from :attr:`Scene.shadows` (:func:`envguard.doctor.facts.shadows`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

from envguard.doctor.interface import DoctorRule, Scene, Shadow
from envguard.explain.culprits import IMPORT_NAMES
from envguard.explain.interface import Finding, Severity
from envguard.model import Snapshot

_NOT_A_SHADOW = frozenset({"test", "tests", "__init__", "__main__", "setup", "conftest"})
"""Names a project folder holds without meaning to replace anything (the stdlib's ``test``
package is never imported by a job)."""


def installed_modules(snapshot: Snapshot) -> dict[str, str]:
    """Top-level module → the distribution that provides it (RECORD's ``top_level``, else
    the import names the world uses, else the distribution's own name)."""
    found: dict[str, str] = {}
    for module, dists in IMPORT_NAMES.items():
        for d in dists:
            if snapshot.package(d) is not None and "." not in module:
                found.setdefault(module, d)
    for dist in snapshot.packages:
        found.setdefault(dist.name.replace("-", "_"), dist.name)
        for module in dist.top_level:
            found[module.split(".")[0]] = dist.name
    return found


def _own_project(snapshot: Snapshot, shadow: Shadow, module: str, owner: str | None) -> bool:
    """The module is the project's own, installed editable from this folder."""
    dist = snapshot.package(owner) if owner else None
    url = dist.direct_url.url if dist is not None and dist.direct_url is not None else ""
    return bool(dist and dist.editable and url.rstrip("/").endswith(shadow.folder.rstrip("/")))


def shadowed(shadows: Iterable[Shadow], snapshot: Snapshot) -> list[tuple[Shadow, str, str]]:
    """(folder, module, whose) for each module of ``shadows`` that hides a standard-library
    module (``the standard library's``) or an installed one (``numpy's``)."""
    installed = installed_modules(snapshot)
    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
    hits: list[tuple[Shadow, str, str]] = []
    for shadow in shadows:
        for module in shadow.modules:
            if module in _NOT_A_SHADOW:
                continue
            owner = installed.get(module)
            if module in stdlib:
                hits.append((shadow, module, "the standard library's"))
            elif owner and not _own_project(snapshot, shadow, module, owner):
                hits.append((shadow, module, f"{owner}'s"))
    return hits


def module_shadowed(scene: Scene) -> Iterator[Finding]:
    hits = shadowed(scene.shadows, scene.snapshot)
    if not hits:
        return
    yield Finding(
        rule="module-shadowed", severity=Severity.CRITICAL,
        title="imported instead of the real module: "
              + ", ".join(f"'{m}' from the {s.source}" for s, m, _ in hits[:4])
              + (" …" if len(hits) > 4 else ""),
        explanation="Python imports from the working folder (python -c, python -m) and from "
                    "PYTHONPATH before site-packages: a file or package named like a "
                    "standard-library or installed module replaces it, and the real one's "
                    "users fail (`partially initialized module 'random' has no attribute "
                    "'randint'`, `module 'numpy' has no attribute ...`).",
        evidence=tuple(f"{s.folder}: '{m}' hides {whose} {m}" for s, m, whose in hits[:10]),
        remedy=(f"rename or move {', '.join(sorted({m for _, m, _ in hits}))} out of "
                + ", ".join(sorted({s.folder for s, _, _ in hits}))
                + " (and delete its __pycache__ copies)",),
        weight=95, keywords=("partially initialized module", "circular import",
                             *(m for _, m, _ in hits)))


def pythonpath_other_python(scene: Scene) -> Iterator[Finding]:
    mine = ".".join(scene.snapshot.interpreter.version.split(".")[:2])
    odd = [s for s in scene.shadows if s.site_python and s.site_python != mine]
    if not odd:
        return
    yield Finding(
        rule="pythonpath-other-python", severity=Severity.CRITICAL,
        title=f"PYTHONPATH puts Python {odd[0].site_python}'s site-packages before this "
              f"environment's (Python {mine})",
        explanation="Packages installed for another Python are imported first: their "
                    "compiled parts do not load under this one (`No module named "
                    "'numpy.core._multiarray_umath'`, `undefined symbol`), and their pure "
                    "parts shadow this environment's versions.",
        evidence=tuple(f"PYTHONPATH: {s.folder} (Python {s.site_python}, "
                       f"{len(s.modules)} modules)" for s in odd),
        remedy=("unset PYTHONPATH (or drop those folders from it) and run again",),
        weight=96, keywords=("PYTHONPATH", "_multiarray_umath", "from its source directory"))


RULES = (
    DoctorRule(id="module-shadowed", title="a module shadowed by the working folder or "
               "PYTHONPATH", check=module_shadowed),
    DoctorRule(id="pythonpath-other-python", title="PYTHONPATH holds another Python's "
               "packages", check=pythonpath_other_python),
)
