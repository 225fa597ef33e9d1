"""Redaction: the one place that decides what is a secret and masks it.

Everything envguard writes or prints that came from the user's environment passes
through here at the model boundary: environment variables (:func:`redact_env`), free
text such as URLs, paths and error messages (:func:`redact_text`), the argv of
``envguard run`` (:func:`redact_argv`), and every string of a snapshot
(:func:`redact_snapshot`, applied by the probe and by the snapshot reader). Writers and
renderers never see the raw values.

What counts as a secret is data, below: :data:`SECRET_NAME_WORDS` (a variable, flag or
``NAME=value`` name any of whose words matches is secret, whatever its value),
:data:`NOT_SECRET_NAMES`, and :data:`SECRET_VALUES` (credentials recognised by their
shape wherever they appear: URL userinfo, tokens with a known prefix, AWS keys, JWTs,
signed query strings, PEM private keys). A masked span becomes :data:`MASK`; a variable
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

from envguard.model import EnvValue, Snapshot
from envguard.validation import field_names

MASK = "***"
MAX_TEXT = 1 << 20
"""A string longer than this (1 MiB) that may hold a credential is masked whole: no
value envguard records is that long, and the search stays fast on hostile input."""

SECRET_NAME_WORDS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    # A word that is, or ends in, a credential noun: HF_TOKEN, GITHUBTOKEN, CLIENTSECRET,
    # WANDB_API_KEY, SIGNINGKEY, DB_PASSWORD, GPG_PASSPHRASE, AWS_SHARED_CREDENTIALS.
    r"[A-Z0-9]*(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|KEY|CREDENTIAL|COOKIE|SIGNATURE)S?",
    # Words that are credentials on their own.
    r"PASS|PWD|PAT|PATS|CRED|CREDS|AUTH|AUTHORIZATION|AUTHTOKEN|OAUTH|BEARER|JWT|PRIVATE",
    r"SESSION|SESSIONID|SESSID|SAS|SIG|DSN|WEBHOOK|WEBHOOKS|APIKEY|ACCESSKEY|PRIVKEY",
))
"""Patterns over the words of an upper-cased name (split at anything but A-Z and 0-9,
trailing digits dropped: ``HF_TOKEN2`` has the word ``TOKEN``)."""

NOT_SECRET_NAMES: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"PWD|OLDPWD|PATH",
    r"TORCH_COMPILE_CACHE_KEY_TAG",
    r"HF_HUB_DISABLE_IMPLICIT_TOKEN",
))
"""Whole (upper-cased) names that match a secret word but hold no secret."""

# One compiled pattern per credential shape. The named group ``s`` is the part masked;
# what the match holds around it (a scheme, ``?sig=``) is kept.
_URL_SCHEME = r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://"
SECRET_VALUES: tuple[re.Pattern[str], ...] = tuple(re.compile(p, flags) for p, flags in (
    # PEM private key material (a key in a CERT or KEY variable, a pasted ssh key).
    (r"(?P<s>-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
     r"(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z))", re.DOTALL),
    # URL userinfo: ``scheme://user:password@host``. Without a colon it may not hold a
    # slash (``git+https://host/repo@v1`` has none); with one, it runs to the last "@"
    # before white space or the next "://", so a "/" or "@" inside the password does not
    # leak the rest (and no character is scanned twice: linear time on any input).
    (_URL_SCHEME + r"(?P<s>[^\s/?#@:]*:(?:[^\s:]|:(?!//))*|[^\s/?#@]+)@", 0),
    # The same without a scheme, as a bare index value: ``user:pw@host/simple``. The
    # password runs to the last "@" before white space or the start of another
    # ``user:`` (linear time again).
    (r"(?<![^\s=,;'\"(\[])(?P<s>[^\s:/@=,;'\"]+:(?!//)"
     r"(?:(?![\s=,;'\"(\[][^\s:/@=,;'\"]+:)\S)*)@"
     r"(?=[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]+)?(?:[/?#\s]|\Z))", 0),
    # Tokens with a published prefix, at realistic lengths (hf_transfer is a package).
    (r"(?<![A-Za-z0-9])(?P<s>gh[pousr]_[A-Za-z0-9]{30,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>github_pat_[A-Za-z0-9_]{30,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>glpat-[A-Za-z0-9_-]{20,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>hf_[A-Za-z0-9]{30,})", 0),
    (r"(?<![A-Za-z0-9_-])(?P<s>sk-(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Z])"
     r"[A-Za-z0-9_-]{20,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>xox[abprse]-[A-Za-z0-9-]{10,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>xapp-[0-9]+-[A-Za-z0-9-]{10,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>pypi-[A-Za-z0-9_-]{50,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>npm_[A-Za-z0-9]{36,})", 0),
    (r"(?<![A-Za-z0-9])(?P<s>AIza[0-9A-Za-z_-]{35})", 0),
    # anaconda.org channel tokens: ``https://conda.anaconda.org/t/<token>/channel`` (and a
    # conda record's channel, ``t/<token>/channel``).
    (r"(?<![^/])t/(?P<s>[A-Za-z0-9_-]{16,})(?=/)", 0),
    (r"hooks\.slack\.com/services/(?P<s>[A-Za-z0-9/]{20,})", 0),
    # AWS: access key ids, and a bare 40-character secret access key (mixed case, a
    # digit; hex digests and paths do not qualify).
    (r"(?<![A-Z0-9])(?P<s>(?:AKIA|ASIA)[A-Z0-9]{16})(?![A-Z0-9])", 0),
    (r"(?<![A-Za-z0-9/+=_.-])(?P<s>(?!/)(?=[A-Za-z0-9/+]*[a-z])(?=[A-Za-z0-9/+]*[A-Z])"
     r"(?=[A-Za-z0-9/+]*[0-9])[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=_.-])", 0),
    # JSON Web Tokens: base64url JSON header ("eyJ"), payload, signature.
    (r"(?<![A-Za-z0-9_-])(?P<s>eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}(?:\.[A-Za-z0-9_-]*)?)",
     0),
    # Signed or authenticated query strings and connection strings.
    (r"[?&;](?:access_token|id_token|refresh_token|token|auth|api_?key|key|password|passwd|"
     r"secret|client_secret|sig|signature|x-amz-signature|x-amz-credential|"
     r"x-amz-security-token|x-goog-signature|x-goog-credential|code)=(?P<s>[^&#\s]+)",
     re.IGNORECASE),
    (r"(?:AccountKey|SharedAccessKey|SharedAccessSignature)=(?P<s>[^;\s]+)", re.IGNORECASE),
    (r"\b(?:bearer|basic)\s+(?P<s>[A-Za-z0-9._~+/=-]{12,})", re.IGNORECASE),
))

_MAYBE = re.compile(
    r"://|@|-----BEGIN|gh[pousr]_|github_pat_|glpat-|hf_|sk-|[sr]k_|xox|xapp-|pypi-|npm_|AIza"
    r"|hooks\.slack|AKIA|ASIA|eyJ|(?<![^/])t/|[?&;][\w-]+=|[\w-]=(?!=)"
    r"|(?i:bearer|basic|accountkey|sharedaccess)"
    r"|(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{40})(?![0-9a-f]{40})")
"""A necessary condition for any of the patterns: most strings (versions, names, hashes,
paths) fail it, and skip the full set."""
_LITERALS = ("://", "@", "xox", "AIza", "AKIA", "ASIA", "eyJ", "hooks.slack", "/t/", "-----BEGIN",
             "glpat-", "sk-", "xapp-", "pypi-", "github_pat_", "hf_", "k_", "npm_", "ghp_", "gho_",
             "ghu_", "ghs_", "ghr_")
_WORDS = ("bearer", "basic", "accountkey", "sharedaccess")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_LONG_RUN = re.compile(r"[A-Za-z0-9/+]{40}")
_LONG_RUN_START = re.compile(r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{40})(?![0-9a-f]{40})")


def _assignment(text: str) -> bool:
    """The two ``=`` branches of :data:`_MAYBE` (``[\\w-]=(?!=)``, ``[?&;][\\w-]+=``) in ASCII
    text, looked for at each ``=`` only."""
    i = text.find("=")
    while i != -1:
        if i and text[i - 1] in _NAME_CHARS:
            if text[i + 1:i + 2] != "=":
                return True
            j = i - 1
            while j >= 0 and text[j] in _NAME_CHARS:
                j -= 1
            if j >= 0 and text[j] in "?&;":
                return True
        i = text.find("=", i + 1)
    return False


def _may_hold_secret(text: str) -> bool:
    """Exactly whether :data:`_MAYBE` matches ``text``, at a third of its cost on a
    snapshot's strings: Python's ``re`` tries every branch at every position, while ``in``
    tests find the literal branches and the ``=`` branches are looked for at each ``=``.
    Text with characters beyond ASCII (where case folding is wider) meets :data:`_MAYBE`
    itself, and so does text that passes a cheap check."""
    if not text.isascii():
        return _MAYBE.search(text) is not None
    lower = text.lower()
    cheap = (any(lit in text for lit in _LITERALS) or text.startswith("t/")
             or any(word in lower for word in _WORDS)
             or ("=" in text and _assignment(text))
             or (_LONG_RUN.search(text) is not None
                 and _LONG_RUN_START.search(text) is not None))
    return cheap and _MAYBE.search(text) is not None
_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.-])-{0,2}(?P<name>[A-Za-z_][A-Za-z0-9_-]{0,127})=(?!=)"
    r"(?P<s>\"[^\"]*\"|'[^']*'|[^\s\"'&;,]+)")
"""``NAME=value`` inside text or argv (``password=…``, ``--hf-token=…``): masked when
NAME is a secret name."""
_WORD_SPLIT = re.compile(r"[^A-Z0-9]+")
_SHORT_SECRET_FLAGS = frozenset({"-p"})
"""Short flags whose next argument is a password (mysql, sshpass, docker login)."""
_USER_FLAGS = frozenset({"-u", "--user"})
"""Flags whose next argument may be ``user:password`` (curl)."""


@functools.lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """``HF_TOKEN``, ``WANDB_API_KEY``, ``GH_PAT``, ``hf-token``: yes. ``PATH``,
    ``KEYBOARD_LAYOUT``, ``TOKENIZERS_PARALLELISM``: no."""
    upper = name.upper()
    if any(p.fullmatch(upper) for p in NOT_SECRET_NAMES):
        return False
    words = (w.rstrip("0123456789") for w in _WORD_SPLIT.split(upper))
    return any(p.fullmatch(w) for w in words if w for p in SECRET_NAME_WORDS)


def _mask_group(match: re.Match[str]) -> str:
    start, end = match.span("s")
    whole = match.string
    return whole[match.start():start] + MASK + whole[end:match.end()]


def _mask_assignment(match: re.Match[str]) -> str:
    if not secret_name(match.group("name")) or match.group("s") == MASK:
        return match.group()
    return _mask_group(match)


def redact_text(text: str) -> str:
    """``text`` with every credential :data:`SECRET_VALUES` recognises, and the value of
    every secret-named ``NAME=value``, replaced by :data:`MASK`. Idempotent."""
    if not text or not _may_hold_secret(text):
        return text
    if len(text) > MAX_TEXT:
        return MASK
    for pattern in SECRET_VALUES:
        text = pattern.sub(_mask_group, text)
    return _ASSIGNMENT.sub(_mask_assignment, text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line safe to record: :func:`redact_text` on every word, and the word
    after a secret-named flag (``--token X``, ``--hf-password X``, ``-p X``) masked."""
    out: list[str] = []
    previous = ""
    for word in argv:
        flag = previous.split("=", 1)[0]
        if (flag.startswith("-") and "=" not in previous and not word.startswith("--")
                and (flag in _SHORT_SECRET_FLAGS or secret_name(flag.lstrip("-")))):
            out.append(MASK)
        elif previous in _USER_FLAGS and ":" in word:
            out.append(word.split(":", 1)[0] + ":" + MASK)
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
    """Every string inside ``value`` (the walk :func:`_scrub` makes), appended to ``out``."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name in field_names(type(value)):
            old = getattr(value, name)
            if old is not None and not isinstance(old, (bool, int, float)):
                _strings(old, out)


_NAME_THEN_EQUALS = re.compile(r"[A-Za-z0-9_-]=")
"""An ``=`` after a name character (:data:`_NAME_CHARS`): what :func:`_assignment` needs."""
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
            if _MAYBE.search(text) is not None:
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

    for literal in (*_LITERALS, "t/"):
        mark_all(joined, literal)
    lower = joined.lower()
    for word in _WORDS:
        mark_all(lower, word)
    for pattern in (_NAME_THEN_EQUALS, _LONG_RUN):  # _assignment's "=", a long run
        for match in pattern.finditer(joined):
            hit.add(bisect.bisect_right(starts, match.start()) - 1)
    found.update(plain[k] for k in hit if _may_hold_secret(plain[k]))
    return found


def _scrub(value: T, masked: dict[str, str]) -> T:
    """``value`` with every string that is a key of ``masked`` replaced by its value; the
    same object when nothing changed."""
    out: Any = value
    if isinstance(value, str):
        out = masked.get(value, value)
    elif isinstance(value, list):
        scrubbed = [_scrub(v, masked) for v in value]
        out = scrubbed if any(a is not b for a, b in zip(scrubbed, value, strict=True)) \
            else value
    elif isinstance(value, dict):
        mapped = {k: _scrub(v, masked) for k, v in value.items()}
        out = mapped if any(mapped[k] is not v for k, v in value.items()) else value
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


def redact_snapshot(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with every credential in any of its strings masked (URLs in
    ``direct_url.json``, paths, error messages, values in old snapshot files)."""
    return redact_data(snapshot)
