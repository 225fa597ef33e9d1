"""Credentials recognised by the *form* around them rather than by their shape: a secret
name, then its value, as command lines, HTTP headers, JSON, YAML, INI and netrc write it.

* a flag and the word after it: ``--password X``, ``--hf-token "X Y"``;
* a header: ``Authorization: token X``, ``Proxy-Authorization: Basic X``,
  ``Cookie: a=1; b=2`` (the whole rest of the header), ``X-Api-Key: X``;
* a key and its value: ``"password": "X"``, ``password: X``, ``secret = X``,
  ``{'api_key': 'X'}``, ``\\"token\\": \\"X\\"`` (JSON inside a JSON string);
* a flag and its value as items of a list: ``["--token", "X"]``;
* a netrc entry: ``machine h login u password X``;
* credentials of ``curl -u`` and ``docker --user``: ``--user=u:X``, ``-u u:X``;
* the key of a ``login`` command: ``wandb login KEY``.

A name is secret by :func:`envguard.redact_names.secret_name`; a flag or key that names
where a secret is kept (``--password-file PATH``) is not (:func:`secret_flag`). What is
masked becomes ``***``; a value already masked (``***``, ``<masked>``) is left as it is.

:func:`may_hold_form` is the quick test: every form starts with a credential word of a
name followed by its separator (``token:``, ``password "``, ``key =``, ``password X``),
with ``-u``/``--user`` or with ``login``; text without one (nearly every version, path and
package name, ``tokenizers``, ``hf_transfer``, ``keyring/``) skips the patterns.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator

from envguard.redact_names import secret_flag
from envguard.redact_shapes import substitute_needed

MASK = "***"

STEMS = ("token", "secret", "pass", "pwd", "key", "cred", "cookie", "sign", "auth",
         "bearer", "jwt", "private", "sess", "sas", "sig", "dsn", "webhook", "pat")
"""Lower-case pieces, one of which is in every secret name (``password`` has ``pass``,
``x-api-key`` has ``key``, ``authorization`` has ``auth``)."""
STEM_TAIL = re.compile(r"[A-Za-z0-9_.-]*\\{0,3}[\"']?[ \t]*[:=\s,]")
"""What follows a stem in a form: the rest of the name, a closing quote, the separator."""
USER_FLAG = re.compile(r"(?<![A-Za-z0-9_-])(?:--user|-u)(?:=|\s)")
LOGIN_WORD = re.compile(r"(?i:login)[ \t]")
"""``login`` and a blank: where :data:`LOGIN` can begin (``wandb login KEY``)."""
MAYBE = (r"(?i:" + "|".join(STEMS) + r")" + STEM_TAIL.pattern + "|" + USER_FLAG.pattern
         + "|" + LOGIN_WORD.pattern)
"""The source of a necessary condition for every pattern of :data:`FORMS` (compiled only
for text beyond ASCII, by :func:`may_hold_form`)."""

_VALUE = (r"(?P<s>\\{0,3}\"[^\"\r\n]*\"|'[^'\r\n]*'"
          r"|[^\s\"',;}\]&](?:[^\r\n\"',;}\]&]*[^\s\"',;}\]&])?)")
"""A value: a quoted string (also one whose quotes are escaped), else the rest of the line
up to a quote or a delimiter of JSON, a cookie or a query (``password: two words``)."""
_HEADER_REST = r"(?P<s>[^\s\"'](?:[^\r\n\"']*[^\s\"'])?)"
"""The rest of a header line, up to a quote."""

FLAG = (r"(?<![A-Za-z0-9_.-])(?:--|-(?=[A-Za-z]{2}))"
        r"(?P<name>[A-Za-z][A-Za-z0-9_.-]{0,63})[ \t]+"
        r"(?P<s>\"[^\"\r\n]*\"|'[^'\r\n]*'|(?![-\"'])\S+)")
"""``--password X``, also a single-dash long flag (``-token X``, Go and openssl style):
masked when the flag is secret."""
HEADER = (r"(?i)(?:(?:proxy-)?authorization[ \t]*:[ \t]*(?:(?:bearer|basic|token|"
          r"digest|negotiate|ntlm|bot|apikey|aws4-hmac-sha256)[ \t]+)?"
          r"|(?:set-)?cookie[ \t]*:[ \t]*)" + _HEADER_REST)
"""``Authorization: token X``, ``Cookie: …``: the whole value after the scheme word (every
cookie), also inside one argv word (``-HAuthorization: Bearer X``)."""
KEY_VALUE = (r"(?<![A-Za-z0-9_.\\-])(?P<q>\\{0,3}[\"']|)"
             r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]{0,63})(?P=q)[ \t]*(?::(?!//)|=(?!=))"
             r"[ \t]*" + _VALUE)
"""``"password": "X"``, ``password: X``, ``secret = X``, ``X-Api-Key: X``: masked when
the key is secret (``name=value`` without spaces is :data:`envguard.redact._ASSIGNMENT`)."""
FLAG_IN_LIST = (r"(?P<q>\\{0,3}[\"'])--?(?P<name>[A-Za-z][A-Za-z0-9_.-]{0,63})(?P=q)"
                r"[ \t]*,[ \t]*(?P<s>\\{0,3}\"[^\"\r\n]*\"|'[^'\r\n]*')")
"""A secret flag and its value as items of a JSON or Python list of arguments
(``["--token", "X"]``, ``['-password', 'X']``, an argv logged as a list)."""
NETRC = (r"(?<![A-Za-z0-9_-])(?:machine|default|login)\s+(?:\S+\s+)??"
         r"(?:(?:login|account|port)\s+\S+\s+){0,3}(?:password|passwd)\s+(?P<s>\S+)")
"""``machine h login u password X`` (one line or several), ``default login u password X``."""
USER = USER_FLAG.pattern + r"[ \t]*(?P<u>[^\s:\"']+):(?P<s>[^\s\"']+)"
"""``--user=alice:X``, ``-u alice:X``: the password after the colon (a ``uid:gid`` pair of
numbers is left alone)."""
LOGIN_KEY = r"(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{32,}"
"""A key given as a word of its own: 32 or more letters, digits, ``_`` or ``-``, a digit
among them (a W&B API key is 40 hex digits; a registry host, an e-mail or a user name is
not one word of these)."""
LOGIN = (r"(?<![A-Za-z0-9_.-])(?i:login)(?:[ \t]+-[^\s]*(?:[ \t]+[^\s-][^\s]*)?)*?"
         r"[ \t]+(?P<s>" + LOGIN_KEY + r")(?![^\s\"';&|)])")
"""The key of a ``login`` command given as an argument: ``wandb login KEY``, also after
its options (``wandb login --relogin --host https://h KEY``)."""

_MASKED_ALREADY = (MASK, "<masked")


def _done(value: str) -> bool:
    return value.strip("\"'\\").startswith(_MASKED_ALREADY)


_QUOTED = r"(\\{0,3}[\"'])(.*)\1"


def _mask(match: re.Match[str]) -> str:
    start, end = match.span("s")
    whole = match.string
    value = whole[start:end]
    if _done(value):
        return match.group()
    quoted = re.fullmatch(_QUOTED, value, re.DOTALL)
    masked = quoted.group(1) + MASK + quoted.group(1) if quoted else MASK
    return whole[match.start():start] + masked + whole[end:match.end()]


def _mask_named(match: re.Match[str]) -> str:
    return _mask(match) if secret_flag(match.group("name")) else match.group()


_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})


def _mask_key(match: re.Match[str]) -> str:
    """A key's value; the headers of :data:`HEADER` are masked there (after their scheme
    word), not here."""
    header = not match.group("q") and match.group("name").lower() in _HEADERS
    return match.group() if header else _mask_named(match)


def _mask_user(match: re.Match[str]) -> str:
    if match.group("u").isdigit() and match.group("s").isdigit():
        return match.group()
    return _mask(match)


_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_KEY_TAIL = re.compile(r"[a-z0-9_.-]*\\{0,3}[\"']?[ \t]*[:=]")
"""What follows a stem in :data:`KEY_VALUE`: the rest of the key, a closing quote, the
separator (matched in lower-cased text)."""


def _dash_word(text: str, lower: str) -> bool:
    """A ``-`` that starts a word (what :data:`FLAG` needs): ``--``, or a ``-`` at the start
    or after a character that is not in a name."""
    i = text.find("-")
    while i != -1:
        if i == 0 or text[i - 1] not in _WORD_CHARS or text[i + 1:i + 2] == "-":
            return True
        i = text.find("-", i + 1)
    return False


def _stem_then(lower: str, tail: re.Pattern[str]) -> bool:
    """Whether a stem of :data:`STEMS` in ``lower`` is followed by a match of ``tail`` (each
    stem found with ``str.find``, the tail matched there)."""
    for stem in STEMS:
        i = lower.find(stem)
        while i != -1:
            if tail.match(lower, i + len(stem)):
                return True
            i = lower.find(stem, i + 1)
    return False


def _key_then_separator(text: str, lower: str) -> bool:
    """A stem, the rest of a key and ``:`` or ``=`` (what :data:`KEY_VALUE` needs)."""
    return _stem_then(lower, _KEY_TAIL)


def _words(*words: str) -> Callable[[str, str], bool]:
    return lambda text, lower: any(w in lower for w in words)


def _listed(text: str, lower: str) -> bool:
    return "," in text and ('"' in text or "'" in text)


def _user_flag(text: str, lower: str) -> bool:
    return "-u" in text and USER_FLAG.search(text) is not None


def _logins(lower: str) -> Iterator[int]:
    """Where :data:`LOGIN_WORD` matches the lower-cased ASCII text ``lower``, found with
    ``str.find`` (the regular expression took 15 times as long over a snapshot's strings)."""
    i = lower.find("login")
    while i != -1:
        if lower[i + 5:i + 6] in (" ", "\t"):
            yield i
        i = lower.find("login", i + 5)


def _login(text: str, lower: str) -> bool:
    return next(_logins(lower), None) is not None


FORMS = ((_words("authorization", "cookie"), HEADER, _mask), (_dash_word, FLAG, _mask_named),
         (_listed, FLAG_IN_LIST, _mask_named), (_key_then_separator, KEY_VALUE, _mask_key),
         (_words("password", "passwd"), NETRC, _mask), (_user_flag, USER, _mask_user),
         (_login, LOGIN, _mask))
"""Each form as (need, pattern source, what masks its match), in the order applied. The
need (``need(text, lower)``, for ASCII text) is true wherever the pattern can match: a
pattern is compiled only when some text meets its need (a passing gate meets few)."""


@functools.cache
def _form(index: int) -> re.Pattern[str]:
    return re.compile(FORMS[index][1])


@functools.cache
def maybe() -> re.Pattern[str]:
    """:data:`MAYBE` compiled."""
    return re.compile(MAYBE)


def may_hold_form(text: str) -> bool:
    """Exactly whether :data:`MAYBE` matches ``text`` (ASCII text: each stem found with
    ``str.find`` and its tail matched there)."""
    if not text.isascii():
        return maybe().search(text) is not None
    lower = text.lower()
    return _user_flag(text, "") or _login(text, lower) or _stem_then(lower, STEM_TAIL)


def form_hits(joined: str, lower: str) -> list[int]:
    """Offsets in ``joined`` (many strings joined by a character no pattern matches;
    ``lower`` is it lower-cased) where :data:`MAYBE` matches."""
    hits = []
    i = joined.find("-u")
    while i != -1:  # "-u" or the "-u" of "--user"
        if USER_FLAG.match(joined, i) or (i and USER_FLAG.match(joined, i - 1)):
            hits.append(i)
        i = joined.find("-u", i + 1)
    for stem in STEMS:
        i = lower.find(stem)
        while i != -1:
            if STEM_TAIL.match(lower, i + len(stem)):
                hits.append(i)
            i = lower.find(stem, i + 1)
    hits.extend(_logins(lower))
    return hits


def redact_forms(text: str) -> str:
    """``text`` with the value of every form above masked, each form tried where its need
    holds (:func:`envguard.redact_shapes.substitute_needed`)."""
    return substitute_needed(text, ((need, mask) for need, _, mask in FORMS), _form)


SHORT_PASSWORD_FLAGS = frozenset({"-p"})
"""Short flags whose next argument is a password (mysql, sshpass, docker login), also
glued to it (``-pX``, mysql's own form)."""
USER_FLAGS = frozenset({"-u", "--user"})
"""Flags whose next argument may be ``user:password`` (curl, docker)."""


def redact_argv_word(word: str, previous: str) -> str | None:
    """The masked form of one argv ``word`` that only its place in the command line shows
    to be secret (after ``--token``, after ``-p``, ``-pX``, ``-uuser:X``, ``-H<header>``),
    or None when its place says nothing."""
    flag = previous.split("=", 1)[0]
    if (flag.startswith("-") and "=" not in previous and not word.startswith("--")
            and (flag in SHORT_PASSWORD_FLAGS or secret_flag(flag.lstrip("-")))):
        return MASK
    if previous in USER_FLAGS and ":" in word:
        return word.split(":", 1)[0] + ":" + MASK
    if word.startswith("-p") and len(word) > 2 and not word.startswith("--"):
        return "-p" + MASK
    if word.startswith("-u") and ":" in word and not word.startswith("--"):
        return word.split(":", 1)[0] + ":" + MASK
    return None

