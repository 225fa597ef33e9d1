"""Redaction: the one place that decides what is a secret and masks it.

Everything envguard writes or prints that came from the user's environment passes
through here at the model boundary: environment variables (:func:`redact_env`), free
text such as URLs, paths and error messages (:func:`redact_text`), the argv of
``envguard run`` (:func:`redact_argv`), and every string of a snapshot
(:func:`redact_snapshot`, applied by the probe and by the snapshot reader). Writers and
renderers never see the raw values.

What counts as a secret is data, in three modules this one re-exports:
:mod:`envguard.redact_names` (:data:`SECRET_NAME_WORDS`: a variable, flag or
``NAME=value`` name any of whose words matches is secret, whatever its value;
:data:`NOT_SECRET_NAMES`), :mod:`envguard.redact_shapes` (:data:`SECRET_VALUES`:
credentials recognised by their shape wherever they appear: URL userinfo, tokens with a
known prefix, AWS keys, JWTs, signed query strings, PEM private keys) and
:mod:`envguard.redact_forms` (credentials recognised by the form around them: flags,
headers, JSON/YAML/INI keys, netrc entries). Dict keys are strings like any other. A file
read back is masked again (:func:`remask_environment`, used by
:func:`envguard.snapshot_file.remask`). A masked span becomes :data:`MASK`; a variable
whose value was masked keeps a keyed HMAC of the raw value (see
:mod:`envguard.probe.envvars`), so a change stays visible in a diff. docs/SECURITY.md
describes the rules for users.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from envguard.model import Environment, EnvValue, Snapshot
from envguard.redact_forms import (
    LOGIN_KEY,
    MASK,
    may_hold_form,
    redact_argv_word,
    redact_forms,
)
from envguard.redact_forms import MAYBE as _FORM_MAYBE
from envguard.redact_forms import form_hits as _form_hits
from envguard.redact_names import (
    NOT_SECRET_NAMES,
    SECRET_NAME_WORDS,
    secret_flag,
    secret_name,
)
from envguard.redact_shapes import (
    LITERALS,
    LONG_RUN,
    SECRET_VALUES,
    SHAPES,
    WORDS,
    has_assignment,
    redact_shapes,
)
from envguard.redact_shapes import may_hold_shape as _may_hold_shape
from envguard.validation import field_names

__all__ = ["MASK", "MAX_TEXT", "NOT_SECRET_NAMES", "SECRET_NAME_WORDS", "SECRET_VALUES",
           "redact_argv", "redact_data", "redact_env", "redact_snapshot", "redact_text",
           "redact_usage", "remask_environment", "secret_flag", "secret_name", "suspects"]
MAX_TEXT = 1 << 20
"""A string longer than this (1 MiB) that may hold a credential is masked whole: no
value envguard records is that long, and the search stays fast on hostile input."""



@functools.cache
def _maybe() -> re.Pattern[str]:
    """A necessary condition for any rule at all (the shapes, or a form of
    :mod:`envguard.redact_forms`): most strings (versions, names, hashes, paths) fail it,
    and skip the full set. Compiled on first use, for text beyond ASCII only: ASCII text
    meets the same condition in the cheap tests of :func:`suspects`."""
    return re.compile(SHAPES + "|" + _FORM_MAYBE)


def _may_hold_secret(text: str) -> bool:
    """Exactly whether :func:`_maybe` matches ``text``."""
    return _may_hold_shape(text) or may_hold_form(text)


_ASSIGNMENT = (r"(?<![A-Za-z0-9_.-])-{0,2}"
               r"(?P<name>[A-Za-z_](?:[A-Za-z0-9_.-]{0,126}[A-Za-z0-9_-])?)=(?!=)"
               r"(?P<s>\"[^\"]*\"|'[^']*'|[^\s\"'&;,]+)")
"""``NAME=value`` inside text or argv (``password=…``, ``--hf-token=…``, a dotted property
glued to Java's ``-D``: ``-Dfs.s3a.secret.key=…``): masked when NAME is a secret name that
does not name a place (:func:`secret_flag`: ``password-file=`` is kept)."""


def _mask_group(match: re.Match[str]) -> str:
    start, end = match.span("s")
    whole = match.string
    return whole[match.start():start] + MASK + whole[end:match.end()]


def _mask_assignment(match: re.Match[str]) -> str:
    if not secret_flag(match.group("name")) or match.group("s") == MASK:
        return match.group()
    return _mask_group(match)


MAX_PASSES = 8
"""How many times :func:`redact_text` masks a string before it gives up and masks it whole
(:data:`MASK`): each pass can open the next (in ``AKIA…npm_…`` the npm token follows a
letter, in ``***npm_…`` it does not), and a real string settles after two."""


def redact_text(text: str) -> str:
    """``text`` with every credential :data:`SECRET_VALUES` recognises, the value of every
    secret-named ``NAME=value`` and every form of :mod:`envguard.redact_forms` (a flag, a
    header, a JSON/YAML/INI key, a netrc entry) replaced by :data:`MASK`. A mask can open
    another credential beside it, so the masking is repeated until nothing more is found
    (:data:`MAX_PASSES`): idempotent, and nothing a second pass would mask is left."""
    for _ in range(MAX_PASSES):
        masked = _mask_once(text)
        if masked == text:
            return text
        text = masked
    return MASK


def _mask_once(text: str) -> str:
    """One pass of :func:`redact_text`: the shapes, the assignments, then the forms."""
    if not text:
        return text
    shape, form = _may_hold_shape(text), may_hold_form(text)
    if not (shape or form):
        return text
    if len(text) > MAX_TEXT:
        return MASK
    if shape:
        text = redact_shapes(text, _mask_group)
        if not text.isascii() or has_assignment(text):
            text = re.sub(_ASSIGNMENT, _mask_assignment, text)
    # A form the shapes' masks opened ("AKIA…-u=x:y" -> "***-u=x:y") is the next pass's.
    return redact_forms(text) if form else text


_COMMAND_ENDS = frozenset({"&&", "||", ";", "|", "&"})
"""Words that end one command of a shell line in argv (``sh -c`` split by a wrapper)."""


@functools.cache
def _login_key() -> re.Pattern[str]:
    return re.compile(LOGIN_KEY)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line safe to record: :func:`redact_text` on every word, the word after a
    secret-named flag (``--token X``, ``--hf-password X``, ``-p X``) masked, a password glued
    to ``-p`` or ``-u user:`` masked, a header glued to ``-H`` redacted as text, and a
    key-shaped word after ``login`` (``wandb login --relogin KEY``) masked."""
    out: list[str] = []
    previous = ""
    login = False  # after a ``login`` word: its key may follow its options (wandb login KEY)
    for word in argv:
        placed = redact_argv_word(word, previous)
        if placed is None and login and _login_key().fullmatch(word):
            placed = MASK
        login = word.lower() == "login" or (login and word not in _COMMAND_ENDS)
        if placed is not None:
            out.append(placed)
        elif word.startswith("-H") and len(word) > 2:
            out.append("-H" + redact_text(word[2:]))
        else:
            out.append(redact_text(word))
        previous = word
    return out


def redact_env(name: str, value: str, digest: Callable[[str, str], str]) -> EnvValue:
    """One environment variable as a snapshot records it.

    A secret name keeps no value, only ``digest(name, value)`` (a keyed HMAC); a value
    with a credential inside keeps the rest of the value with the credential masked, and
    the digest of the whole raw value; anything else is kept as it is.
    """
    if secret_name(name):
        return EnvValue(value=None, masked=True, digest=digest(name, value))
    redacted = redact_text(value)
    if redacted != value:
        return EnvValue(value=redacted, masked=True, digest=digest(name, value))
    return EnvValue(value=value)


T = TypeVar("T")


def _strings(value: object, out: list[str]) -> None:
    """Every string inside ``value``, dict keys too (the walk :func:`_scrub` makes),
    appended to ``out``."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _strings(v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _strings(k, out)
            _strings(v, out)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name in field_names(type(value)):
            old = getattr(value, name)
            if old is not None and not isinstance(old, (bool, int, float)):
                _strings(old, out)


_NAME_THEN_EQUALS = re.compile(r"[A-Za-z0-9_-]=")
"""An ``=`` after a name character: what :func:`has_assignment` needs."""
_SEP = "\x00"
"""Joins the strings :func:`suspects` looks through at once: in no literal of the filter,
not a name character, not in a long run's class, so no hit spans two strings."""


def suspects(strings: Sequence[str]) -> set[str]:
    """Exactly the strings of ``strings`` for which :func:`_may_hold_secret` is true, found
    with a few passes over all of them joined (a snapshot holds thousands of strings,
    nearly all innocent: one ``in`` test of each literal on each string cost 4 µs a
    string). A string with a hit of any cheap branch is then checked by itself."""
    plain: list[str] = []
    found: set[str] = set()
    for text in dict.fromkeys(strings):
        if not text:
            continue
        if not text.isascii():
            if _maybe().search(text) is not None:
                found.add(text)
        else:
            plain.append(text)
    if not plain:
        return found
    joined = _SEP.join(plain)
    starts = list(itertools.accumulate((len(t) + 1 for t in plain[:-1]), initial=0))
    hit: set[int] = set()

    def mark_all(haystack: str, needle: str) -> None:
        i = haystack.find(needle)
        while i != -1:
            hit.add(bisect.bisect_right(starts, i) - 1)
            i = haystack.find(needle, i + 1)

    for literal in (*LITERALS, "t/"):
        mark_all(joined, literal)
    lower = joined.lower()
    for word in WORDS:
        mark_all(lower, word)
    for pattern in (_NAME_THEN_EQUALS, LONG_RUN):  # _assignment's "=", a long run
        for match in pattern.finditer(joined):
            hit.add(bisect.bisect_right(starts, match.start()) - 1)
    found.update(plain[k] for k in hit if _may_hold_shape(plain[k]))
    forms = {bisect.bisect_right(starts, i) - 1 for i in _form_hits(joined, lower)}
    found.update(t for t in (plain[k] for k in forms) if t not in found and may_hold_form(t))
    return found


def _scrub(value: T, masked: dict[str, str]) -> T:
    """``value`` with every string that is a key of ``masked`` replaced by its value; the
    same object when nothing changed."""
    out: Any = value
    if isinstance(value, str):
        out = masked.get(value, value)
    elif isinstance(value, (list, tuple)):
        scrubbed = [_scrub(v, masked) for v in value]
        if any(a is not b for a, b in zip(scrubbed, value, strict=True)):
            out = scrubbed if isinstance(value, list) else tuple(scrubbed)
    elif isinstance(value, dict):
        mapped = {_scrub(k, masked): _scrub(v, masked) for k, v in value.items()}
        if len(mapped) < len(value):  # two keys masked alike: each keeps its entry
            mapped = _numbered(value, masked)
        out = mapped if any(k not in value or value[k] is not v for k, v in mapped.items()) \
            else value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for name in field_names(type(value)):
            old = getattr(value, name)
            if old is None or isinstance(old, (bool, int, float)):
                continue
            new = _scrub(old, masked)
            if new is not old:
                changed[name] = new
        out = dataclasses.replace(value, **changed) if changed else value
    return out  # type: ignore[no-any-return]


def _numbered(value: dict[Any, Any], masked: dict[str, str]) -> dict[Any, Any]:
    """``value`` scrubbed, a key that would repeat another one numbered (``***#2``)."""
    out: dict[Any, Any] = {}
    for k, v in value.items():
        key = _scrub(k, masked)
        n = 1
        while key in out:
            n += 1
            key = f"{_scrub(k, masked)}#{n}"
        out[key] = _scrub(v, masked)
    return out


def redact_data(value: T) -> T:
    """Any plain data (a section of a snapshot, a list of its records) with every
    credential in its strings masked, as :func:`redact_snapshot` masks a whole one: every
    string inside is gathered, the few that may hold a secret are found at once
    (:func:`suspects`) and :func:`redact_text` rewrites those; when none changes, the
    value itself comes back."""
    strings: list[str] = []
    _strings(value, strings)
    masked = {}
    for text in suspects(strings):
        new = redact_text(text)
        if new != text:
            masked[text] = new
    return _scrub(value, masked) if masked else value


def redact_usage(message: str, argv: Sequence[str]) -> str:
    """A usage error of the command line ``argv`` (argparse quotes the words it could not
    use): :func:`redact_text`, and every word that :func:`redact_argv` masks by its place
    (``-pX``, the value after ``--token``) replaced by its masked form."""
    for word, safe in zip(argv, redact_argv(argv), strict=True):
        if word != safe and len(word) > 2:
            message = message.replace(word, safe)
    return redact_text(message)


Digester = Callable[[str, str], "str | None"]
"""``(name, raw value) -> digest`` of a variable masked while a file is read (None: no
digest can be made that compares with the file's own)."""


def remask_environment(env: Environment, digest: Digester | None = None) -> Environment:
    """``env`` as :func:`redact_env` would have recorded it: a variable that arrives with a
    value although its name is secret, or with a credential in its value, is masked now
    (a file written by an older envguard or by hand). A digest it already has is kept (it
    is of the raw value, under the file's key); else ``digest`` makes one, when given."""
    changed: dict[str, EnvValue] = {}
    found = suspects([v.value for v in env.variables.values() if v.value is not None])
    for name, v in env.variables.items():
        if v.value is None:
            continue
        by_name = secret_name(name)
        if not (by_name or v.value in found):
            continue
        redacted = None if by_name else redact_text(v.value)
        if redacted == v.value:
            continue
        kept = v.digest if v.masked and v.digest else None
        changed[name] = EnvValue(value=redacted, masked=True,
                                 digest=kept or (digest(name, v.value) if digest else None))
    if not changed:
        return env
    return dataclasses.replace(env, variables={**env.variables, **changed})


def redact_snapshot(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with every credential in any of its strings masked (URLs in
    ``direct_url.json``, paths, error messages, dict keys, values in old snapshot files).
    A snapshot read from a file also needs its variables masked by name
    (:func:`envguard.snapshot_file.remask`, with :func:`remask_environment`)."""
    return redact_data(snapshot)
