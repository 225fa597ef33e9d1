"""Known breaks between versions that pip's metadata allows, as data.

``breaks.toml`` beside this module holds one entry per break a public report describes:
a package at some versions that fails with a dependency at others (jinja2 2.x with
markupsafe ≥ 2.1, pandas built for numpy 1 under numpy 2, old generated ``_pb2.py`` under
protobuf ≥ 4), the error lines users saw, the requirements that fix it, and the report.
:func:`known_breaks` reads and checks it once; :func:`broken_pairs` finds the entries an
environment meets. The diff rule ``known-break`` (:mod:`envguard.explain.packages`) and
the doctor rule of the same id read it; so does the gate's comparison after a failed run,
through the diff rules. docs/KNOWLEDGE.md says how to add an entry.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from envguard.changes import Change
from envguard.findings import Finding, Severity
from envguard.frozen import frozen
from envguard.model import Distribution, Snapshot

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["RULE", "KnownBreak", "Pair", "broken_pairs", "known_breaks", "pair_finding",
           "parse_breaks", "reported"]

FILE = Path(__file__).with_name("breaks.toml")
_ID = re.compile(r"[a-z0-9][a-z0-9.]*(?:-[a-z0-9.]+)*")
_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")


@frozen
class KnownBreak:
    """One entry of ``breaks.toml`` (see its header for each field)."""

    id: str
    package: str
    """Empty for an API the dependency removed: it breaks whatever calls it."""
    versions: str
    dependency: str
    dependency_versions: str
    errors: tuple[str, ...]
    fix: tuple[str, ...]
    report: str
    note: str = ""

    def matches_error(self, text: str) -> bool:
        """Whether ``text`` holds one of the reported error lines (case ignored)."""
        lower = text.lower()
        return any(e.lower() in lower for e in self.errors)


@frozen(kw_only=False)
class Pair:
    """A known break an environment meets: the entry, the package and the dependency."""

    entry: KnownBreak
    package: Distribution
    dependency: Distribution


def _field(raw: dict[str, Any], key: str, where: str, kind: type, default: Any = None) -> Any:
    value = raw.get(key, default)
    if value is None or not isinstance(value, kind):
        raise ValueError(f"{where}.{key}: must be {kind.__name__}")
    return value


def _strings(raw: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = _field(raw, key, where, list)
    if not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}.{key}: must be a non-empty list of strings")
    return tuple(value)


def parse_breaks(text: str, *, check_syntax: bool = True) -> tuple[KnownBreak, ...]:
    """The entries of a ``breaks.toml`` text; ValueError naming the field (``break[3].fix``)
    for anything malformed: a bad name, a specifier ``packaging`` cannot read (unless not
    ``check_syntax``), a repeated id, a report that is not an https URL."""
    entries: list[KnownBreak] = []
    for i, raw in enumerate(tomllib.loads(text).get("break", [])):
        where = f"break[{i}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: must be a table")
        entry = KnownBreak(
            id=_field(raw, "id", where, str), package=_field(raw, "package", where, str),
            versions=_field(raw, "versions", where, str, ""),
            dependency=_field(raw, "dependency", where, str),
            dependency_versions=_field(raw, "dependency_versions", where, str, ""),
            errors=_strings(raw, "errors", where), fix=_strings(raw, "fix", where),
            report=_field(raw, "report", where, str), note=_field(raw, "note", where, str, ""))
        if not _ID.fullmatch(entry.id):
            raise ValueError(f"{where}.id: {entry.id!r} is not lower-case words joined by -")
        for key in ("package", "dependency"):
            value = getattr(entry, key)
            if not _NAME.fullmatch(value) and not (key == "package" and value == ""):
                raise ValueError(f"{where}.{key}: not a normalized distribution name")
        if not entry.package and entry.versions:
            raise ValueError(f"{where}.versions: an entry with no package has no versions")
        if check_syntax:
            _check_syntax(entry, where)
        if not entry.report.startswith("https://"):
            raise ValueError(f"{where}.report: must be an https URL")
        if any(e.id == entry.id for e in entries):
            raise ValueError(f"{where}.id: {entry.id!r} is used twice")
        entries.append(entry)
    return tuple(entries)


def _check_syntax(entry: KnownBreak, where: str) -> None:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    for key in ("versions", "dependency_versions"):
        try:
            SpecifierSet(getattr(entry, key))
        except InvalidSpecifier:
            raise ValueError(f"{where}.{key}: not a version specifier") from None
    for n, req in enumerate(entry.fix):
        try:
            Requirement(req)
        except InvalidRequirement:
            raise ValueError(f"{where}.fix[{n}]: not a requirement") from None


@functools.cache
def known_breaks() -> tuple[KnownBreak, ...]:
    """The bundled entries, read once. Their specifiers and requirements are checked by
    the file's test (``tests/envguard/explain/test_knowledge.py``), not at every start:
    packaging's parsers cost 50 ms of every diff and install on a 2-core VM."""
    return parse_breaks(FILE.read_text(encoding="utf-8"), check_syntax=False)


def reported(text: str, snapshots: Iterable[Snapshot]) -> list[str]:
    """The dependencies of the entries whose reported error ``text`` holds, where one of
    ``snapshots`` has that dependency at a version the entry says breaks."""
    found = []
    for entry in known_breaks():
        if entry.matches_error(text) and any(
                _within(d.version, entry.dependency_versions)
                for s in snapshots for d in s.packages if d.name == entry.dependency):
            found.append(entry.dependency)
    return found


def _within(version: str | None, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if version is None:
        return False
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def broken_pairs(snapshot: Snapshot) -> Iterator[Pair]:
    """Every entry whose package and dependency are both installed in ``snapshot`` at
    versions the entry says break."""
    installed = {d.name: d for d in snapshot.packages}
    for entry in known_breaks():
        if not entry.package:
            continue  # an API removed from the dependency: it breaks its callers, not a pair
        package, dependency = installed.get(entry.package), installed.get(entry.dependency)
        if (package is not None and dependency is not None
                and _within(package.version, entry.versions)
                and _within(dependency.version, entry.dependency_versions)):
            yield Pair(entry, package, dependency)


RULE = "known-break"
"""The id of the diff rule and of the doctor rule that report a :class:`Pair`."""


def pair_finding(pair: Pair, changes: tuple[Change, ...] = (), *, python: str | None = None
                 ) -> Finding:
    """The finding for ``pair`` (``changes``: the diff's changes of its two packages), with
    the entry's fixes as one ``uv pip install`` remedy each, most conservative first."""
    from envguard.explain.remedies import remedy, uv_pip_install

    entry, pkg, dep = pair.entry, pair.package, pair.dependency
    return Finding(
        rule=RULE, severity=Severity.CRITICAL,
        title=f"{dep.name} {dep.version} is known to break {pkg.name} {pkg.version}",
        explanation=(entry.note + " " if entry.note else "")
        + f"{pkg.name} {entry.versions or '(any version)'} does not work with {dep.name} "
          f"{entry.dependency_versions or '(any version)'}, although its metadata allows it "
          "(pip check and uv pip check pass).",
        evidence=(f"{pkg.name} {pkg.version} with {dep.name} {dep.version}",
                  f"users saw: {entry.errors[0]}", f"reported: {entry.report}"),
        remedy=tuple(remedy(functools.partial(uv_pip_install, [req], python=python))
                     for req in entry.fix),
        changes=changes, weight=96,
        keywords=(*entry.errors, dep.name, pkg.name))
