"""The distributions a requirements file names, for ``envguard lock NAME -r FILE``.

Only names (with their extras and markers) are kept: the lock pins what is installed, so a
version specifier, a URL or a hash says nothing more. Comments, blank lines, ``\\``
continuations and option lines (``--index-url``, ``-c``, ``-e``, a trailing ``--hash``)
are skipped; ``-r OTHER`` is read too, relative to the file that names it. A line that
is none of these is an InputError naming ``file:line`` (exit 2).

Imported by ``envguard lock`` only: the gate in front of a launch never reads one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from envguard.errors import InputError
from envguard.frozen import frozen

_COMMENT = re.compile(r"(?:^|\s)#.*$")
"""pip's comment: ``#`` at the start or after a space (``#egg=`` in a URL is not one)."""
_OPTION_TAIL = re.compile(r"\s--?[A-Za-z]")
"""Where a requirement's own options (``--hash=...``) begin."""
_INCLUDE = re.compile(r"(?:-r|--requirement)(?:\s*=\s*|\s+|(?=[^\s=-]))(?P<path>\S.*)")
MAX_DEPTH = 16
"""``-r`` inside ``-r`` this deep is refused (a cycle is refused sooner)."""


@frozen
class Wanted:
    """One requirement line: the distribution, its extras and its marker, and where."""

    name: str
    extras: tuple[str, ...] = ()
    marker: str | None = None
    where: str = ""
    """``requirements.txt:3``"""

    @property
    def root(self) -> str:
        """``name[extra,...]``: a root of the lock's closure."""
        return f"{self.name}[{','.join(self.extras)}]" if self.extras else self.name


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, line) with comments dropped and ``\\`` continuations joined."""
    held: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = _COMMENT.sub("", raw).rstrip()
        if not held:
            start = number
        if line.endswith("\\"):
            held.append(line[:-1])
            continue
        held.append(line)
        joined = " ".join(part.strip() for part in held).strip()
        held = []
        if joined:
            yield start, joined
    if held and (joined := " ".join(part.strip() for part in held).strip()):
        yield start, joined


def read_requirements(path: Path, *, _seen: tuple[Path, ...] = ()) -> tuple[Wanted, ...]:
    """Every requirement ``path`` (and the files it includes with ``-r``) names."""
    from packaging.requirements import InvalidRequirement, Requirement

    from envguard.input_file import read_input_text

    real = path.resolve()
    if real in _seen or len(_seen) >= MAX_DEPTH:
        raise InputError(f"{path}: included again by -r (a cycle)" if real in _seen
                         else f"{path}: -r nested more than {MAX_DEPTH} deep")
    text = read_input_text(path, what="requirements file")
    found: list[Wanted] = []
    for number, line in _logical_lines(text):
        where = f"{path}:{number}"
        if line.startswith("-"):
            include = _INCLUDE.fullmatch(line)
            if include is not None:
                found += read_requirements(path.parent / include.group("path").strip(),
                                           _seen=(*_seen, real))
            continue  # any other option line: an index, a constraint file, an editable
        spec = _OPTION_TAIL.split(line, maxsplit=1)[0].strip()
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            why = str(exc).splitlines()[0][:200]
            raise InputError(f"{where}: not a requirement envguard can name ({why}); write "
                             "it as NAME, NAME==VERSION or NAME @ URL") from None
        found.append(Wanted(name=req.name, extras=tuple(sorted(req.extras)),
                            marker=str(req.marker) if req.marker is not None else None,
                            where=where))
    return tuple(found)


def applicable(wanted: tuple[Wanted, ...], environment: dict[str, str]) -> tuple[Wanted, ...]:
    """The requirements whose marker holds for ``environment`` (the locked interpreter's
    :func:`~envguard.gate.closure.marker_environment`)."""
    from packaging.markers import InvalidMarker, Marker, UndefinedComparison

    kept = []
    for w in wanted:
        if w.marker is not None:
            try:
                if not Marker(w.marker).evaluate({**environment, "extra": ""}):
                    continue
            except (InvalidMarker, UndefinedComparison, ValueError, KeyError) as exc:
                raise InputError(f"{w.where}: cannot evaluate the marker {w.marker!r}: "
                                 f"{exc}") from None
        kept.append(w)
    return tuple(kept)
