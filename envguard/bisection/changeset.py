"""The changes between two snapshots that a bisection can apply one by one.

One :class:`Step` per distribution that differs (install, remove, upgrade, downgrade,
same-version rebuild) and per recorded environment variable that differs. A trial starts
from GOOD's package set and GOOD's values of those variables and applies a subset of the
steps: :meth:`ChangeSet.requirements` and :meth:`ChangeSet.environment` give what it runs in.

Pure: nothing here runs uv or reads a wheel. Where a step needs an exact build (a rebuild),
the caller supplies it (:mod:`envguard.bisection.builds`).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping
from dataclasses import field

from packaging.version import InvalidVersion, Version

from envguard.frozen import frozen
from envguard.model import Distribution, EnvValue, Snapshot
from envguard.restore.plan import requirement_for

INSTALL, REMOVE, UPGRADE, DOWNGRADE, REBUILD, ENV = (
    "install", "remove", "upgrade", "downgrade", "rebuild", "env")
KINDS = (INSTALL, REMOVE, UPGRADE, DOWNGRADE, REBUILD, ENV)


@frozen
class Step:
    """One change from GOOD to BAD."""

    id: str
    """The package name, or ``env:NAME`` for a variable."""
    kind: str
    good: str | None
    """GOOD's version (or the variable's value); None: absent in GOOD."""
    bad: str | None
    good_fingerprint: str | None = None
    bad_fingerprint: str | None = None

    @property
    def label(self) -> str:
        """``torch 2.11.0+cu130 rebuilt (sha256:1a2b… → sha256:9f8e…)``, ``numpy 1.26.4 →
        2.1.0``, ``+ sglang 0.5.2``, ``- flash-attn 2.8.3``, ``env CUDA_HOME: a → b``."""
        if self.kind == ENV:
            name = self.id.removeprefix("env:")
            return f"env {name}: {_shown(self.good)} → {_shown(self.bad)}"
        if self.kind == INSTALL:
            return f"+ {self.id} {self.bad}"
        if self.kind == REMOVE:
            return f"- {self.id} {self.good}"
        if self.kind == REBUILD:
            return (f"{self.id} {self.good} rebuilt ({short(self.good_fingerprint)} → "
                    f"{short(self.bad_fingerprint)})")
        return f"{self.id} {self.good} → {self.bad}"


def short(fingerprint: str | None) -> str:
    text = (fingerprint or "unknown build").removeprefix("sha256:")
    return text[:12] + "…" if len(text) > 12 else text


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else repr(value)


def _version_kind(good: str | None, bad: str | None) -> str:
    try:
        return UPGRADE if Version(bad or "") > Version(good or "") else DOWNGRADE
    except InvalidVersion:
        return UPGRADE


def _direct(d: Distribution) -> str | None:
    return d.direct_url.url if d.direct_url else None


def _rebuilt(g: Distribution, x: Distribution) -> bool:
    """Same version, another build: the fingerprints differ (or, without both, the URLs)."""
    if g.fingerprint and x.fingerprint:
        return g.fingerprint != x.fingerprint
    return _direct(g) != _direct(x)


def package_steps(good: Snapshot, bad: Snapshot) -> list[Step]:
    a = {d.name: d for d in good.packages}
    b = {d.name: d for d in bad.packages}
    steps: list[Step] = []
    for name in sorted(a.keys() | b.keys()):
        g, x = a.get(name), b.get(name)
        if g is None and x is not None:
            steps.append(Step(id=name, kind=INSTALL, good=None, bad=x.version,
                              bad_fingerprint=x.fingerprint))
        elif x is None and g is not None:
            steps.append(Step(id=name, kind=REMOVE, good=g.version, bad=None,
                              good_fingerprint=g.fingerprint))
        elif g is not None and x is not None:
            if g.version != x.version:
                kind = _version_kind(g.version, x.version)
            elif _rebuilt(g, x):
                kind = REBUILD
            else:
                continue
            steps.append(Step(id=name, kind=kind, good=g.version, bad=x.version,
                              good_fingerprint=g.fingerprint, bad_fingerprint=x.fingerprint))
    return steps


NOT_APPLIED = ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME", "UV_*", "PIP_*",
               "ENVGUARD_*")
"""Variables a trial sets itself (its venv on PATH) or that steer envguard and uv: their
differences are noted, not searched."""


def _value(v: EnvValue | None) -> str | None:
    return None if v is None else v.value


def env_steps(good: Snapshot, bad: Snapshot) -> tuple[list[Step], list[str]]:
    """Variable changes that can be applied, and notes on those that cannot (masked)."""
    a, b = good.environment.variables, bad.environment.variables
    steps: list[Step] = []
    notes: list[str] = []
    for name in sorted(a.keys() | b.keys()):
        p, q = a.get(name), b.get(name)
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in NOT_APPLIED):
            continue
        if (p is not None and p.masked) or (q is not None and q.masked):
            if (p.digest if p else None) != (q.digest if q else None):
                notes.append(f"{name} changed, but its value is masked in the snapshots: "
                             "it is not part of the search (each trial inherits this "
                             "shell's value)")
            continue
        if "\0" in (_value(p) or "") + (_value(q) or ""):
            notes.append(f"{name} changed, but a value holds a NUL byte, which no process "
                         "environment can: it is not part of the search")
            continue
        if _value(p) != _value(q):
            steps.append(Step(id=f"env:{name}", kind=ENV, good=_value(p), bad=_value(q)))
    return steps, notes


@frozen
class ChangeSet:
    """GOOD, BAD, and the steps between them (packages first, then variables)."""

    good: Snapshot
    bad: Snapshot
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    exact: Mapping[tuple[str, str | None], str] = field(default_factory=dict)
    """Requirement lines for exact builds, by (name, fingerprint)."""

    @classmethod
    def between(cls, good: Snapshot, bad: Snapshot) -> ChangeSet:
        envs, notes = env_steps(good, bad)
        if good.interpreter.version.split(".")[:2] != bad.interpreter.version.split(".")[:2]:
            notes.append(f"GOOD ran Python {good.interpreter.version}, BAD "
                         f"{bad.interpreter.version}: every trial uses one interpreter, so "
                         "the Python version itself is not part of the search")
        conda = {(p.name, p.version, p.build) for p in good.conda} ^ {
            (p.name, p.version, p.build) for p in bad.conda}
        if conda:
            names = sorted({name for name, _v, _b in conda})
            notes.append(f"{len(names)} conda package(s) differ ({', '.join(names[:5])}"
                         f"{', …' if len(names) > 5 else ''}): trials are uv venvs, so they "
                         "are not part of the search (envguard restore rebuilds a conda "
                         "prefix)")
        return cls(good=good, bad=bad, steps=(*package_steps(good, bad), *envs),
                   notes=tuple(notes))

    @property
    def rebuilds(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind == REBUILD)

    def dists(self, applied: Iterable[int]) -> dict[str, Distribution]:
        """The distributions of the trial that applies steps ``applied`` to GOOD."""
        chosen = {d.name: d for d in self.good.packages}
        bad = {d.name: d for d in self.bad.packages}
        for i in applied:
            step = self.steps[i]
            if step.kind == ENV:
                continue
            if step.id in bad:
                chosen[step.id] = bad[step.id]
            else:
                chosen.pop(step.id, None)
        return chosen

    def with_needs(self, applied: Iterable[int]) -> frozenset[int]:
        """``applied`` and every step its packages need: a package BAD installed or changed
        that an applied step's BAD version requires, where the trial's version of it does
        not satisfy the requirement (pydantic 2 needs the pydantic-core the same install
        added). Applied alone, such a step makes a set uv cannot build, a skipped trial:
        with its needs, bisect finds the step itself, not it and its dependencies."""
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.utils import canonicalize_name

        from envguard.doctor.packages import marker_environment

        env = marker_environment(self.bad)
        index = {step.id: i for i, step in enumerate(self.steps) if step.kind != ENV}
        chosen = set(applied)
        while True:
            dists = self.dists(chosen)
            added = set()
            for i in sorted(chosen):
                dist = dists.get(self.steps[i].id)
                for text in dist.requires if dist is not None else ():
                    try:
                        req = Requirement(text)
                    except InvalidRequirement:
                        continue
                    if req.marker is not None and not req.marker.evaluate(env):
                        continue
                    need = index.get(canonicalize_name(req.name))
                    have = dists.get(canonicalize_name(req.name))
                    if need is None or need in chosen or (
                            have is not None and have.version is not None
                            and req.specifier.contains(have.version, prereleases=True)):
                        continue
                    added.add(need)
            if not added:
                return frozenset(chosen)
            chosen |= added

    def requirements(self, applied: Iterable[int]) -> tuple[list[str], list[str]]:
        """(requirements lines, names left out because they cannot be pinned)."""
        lines: list[str] = []
        missing: list[str] = []
        for name, dist in sorted(self.dists(applied).items()):
            exact = self.exact.get((name, dist.fingerprint))
            line = exact or requirement_for(dist)[0]
            if line is None:
                missing.append(name)
            else:
                lines.append(line)
        return lines, missing

    def environment(self, applied: Iterable[int], base: Mapping[str, str] = os.environ
                    ) -> dict[str, str]:
        """``base`` with GOOD's value of each changed variable, BAD's where applied."""
        env = dict(base)
        chosen = set(applied)
        for i, step in enumerate(self.steps):
            if step.kind != ENV:
                continue
            value = step.bad if i in chosen else step.good
            name = step.id.removeprefix("env:")
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env
