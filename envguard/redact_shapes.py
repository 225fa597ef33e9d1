"""Credentials recognised by their shape wherever they appear (:data:`SECRET_VALUES`: URL
userinfo, tokens with a known prefix, AWS keys, JWTs, signed query strings, PEM private
keys), and the quick test that most strings fail (:func:`may_hold_shape`). Used by
:mod:`envguard.redact`, the one redactor.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

Need = Callable[[str, str], bool]
"""``need(text, lower)``: whether a pattern can match ``text`` (an ASCII string; ``lower``
is it lower-cased), found without a regular expression. Never false where the pattern
matches; true for many strings where it does not."""


def _any(*needles: str) -> Need:
    return lambda text, lower: any(n in text for n in needles)


def _lower(*needles: str) -> Need:
    return lambda text, lower: any(n in lower for n in needles)


def _long_run(text: str, lower: str) -> bool:
    return LONG_RUN.search(text) is not None


LONG_RUN = re.compile(r"[A-Za-z0-9/+]{40}")

# One pattern per credential shape, as (need, source, flags). Each is compiled the first
# time a string meets its need (:func:`secret_value`): in a passing gate most are never
# compiled (a snapshot holds ``hf_xet``, ``file:///…`` and ``sphinx-design``, which pass
# the quick filter, but no credential). The named group ``s`` is the part masked; what the
# match holds around it (a scheme, ``?sig=``) is kept.
_URL_SCHEME = r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://"
SECRET_VALUES: tuple[tuple[Need, str, int], ...] = (
    # PEM private key material (a key in a CERT or KEY variable, a pasted ssh key).
    (_any("-----BEGIN"), r"(?P<s>-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
     r"(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z))", re.DOTALL),
    # URL userinfo: ``scheme://user:password@host``. Without a colon it may not hold a
    # slash (``git+https://host/repo@v1`` has none); with one, it runs to the last "@"
    # before white space or the next "://", so a "/" or "@" inside the password does not
    # leak the rest (and no character is scanned twice: linear time on any input).
    (_any("@"), _URL_SCHEME + r"(?P<s>[^\s/?#@:]*:(?:[^\s:]|:(?!//))*|[^\s/?#@]+)@", 0),
    # A password with "://" inside (``https://u:pa://ss@h``): the pattern above stops
    # there and masks only the part after it; this takes what it left (256 characters at
    # most, so each scheme costs bounded time).
    (_any("@"), _URL_SCHEME + r"(?P<s>[^\s/?#@:]*:[^\s/?#@,]{0,256}?://\*\*\*)@", 0),
    # The same without a scheme, as a bare index value: ``user:pw@host/simple``. The
    # password runs to the last "@" before white space or the start of another
    # ``user:`` (linear time again).
    (_any("@"), r"(?<![^\s=,;'\"(\[])(?P<s>[^\s:/@=,;'\"]+:(?!//)"
     r"(?:(?![\s=,;'\"(\[][^\s:/@=,;'\"]+:)\S)*)@"
     r"(?=[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]+)?(?:[/?#\s=,;'\"()\[\]]|\Z))", 0),
    # Tokens with a published prefix, at realistic lengths (hf_transfer is a package).
    (_any("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
     r"(?<![A-Za-z0-9])(?P<s>gh[pousr]_[A-Za-z0-9]{30,})", 0),
    (_any("github_pat_"), r"(?<![A-Za-z0-9])(?P<s>github_pat_[A-Za-z0-9_]{30,})", 0),
    (_any("glpat-"), r"(?<![A-Za-z0-9])(?P<s>glpat-[A-Za-z0-9_-]{20,})", 0),
    (_any("hf_"), r"(?<![A-Za-z0-9])(?P<s>hf_[A-Za-z0-9]{30,})", 0),
    (_any("sk-"), r"(?<![A-Za-z0-9_-])(?P<s>sk-(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Z])"
     r"[A-Za-z0-9_-]{20,})", 0),
    (_any("k_live_", "k_test_"),
     r"(?<![A-Za-z0-9])(?P<s>(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,})", 0),
    (_any("xox"), r"(?<![A-Za-z0-9])(?P<s>xox[abprse]-[A-Za-z0-9-]{10,})", 0),
    (_any("xapp-"), r"(?<![A-Za-z0-9])(?P<s>xapp-[0-9]+-[A-Za-z0-9-]{10,})", 0),
    (_any("pypi-"), r"(?<![A-Za-z0-9])(?P<s>pypi-[A-Za-z0-9_-]{50,})", 0),
    (_any("npm_"), r"(?<![A-Za-z0-9])(?P<s>npm_[A-Za-z0-9]{36,})", 0),
    (_any("AIza"), r"(?<![A-Za-z0-9])(?P<s>AIza[0-9A-Za-z_-]{35})", 0),
    # Keys of the services an ML run talks to: NVIDIA's API catalog and NGC (``nvapi-``),
    # Replicate (``r8_``), Groq (``gsk_``), LangSmith (``lsv2_pt_``, ``lsv2_sk_``), Pinecone
    # (``pcsk_``), xAI (``xai-``), Perplexity (``pplx-``), Databricks personal access tokens
    # (``dapi`` and 32 hex digits, MLflow's tracking server there), DeepSeek (``sk-`` and 32
    # hex digits: no capital letter, which the ``sk-`` rule above asks for).
    (_any("nvapi-"), r"(?<![A-Za-z0-9])(?P<s>nvapi-[A-Za-z0-9_-]{30,})", 0),
    (_any("r8_"), r"(?<![A-Za-z0-9])(?P<s>r8_[A-Za-z0-9]{30,})", 0),
    (_any("gsk_"), r"(?<![A-Za-z0-9])(?P<s>gsk_[A-Za-z0-9]{40,})", 0),
    (_any("lsv2_"), r"(?<![A-Za-z0-9])(?P<s>lsv2_(?:pt|sk)_[A-Za-z0-9_]{30,})", 0),
    (_any("pcsk_"), r"(?<![A-Za-z0-9])(?P<s>pcsk_[A-Za-z0-9_]{40,})", 0),
    (_any("xai-"), r"(?<![A-Za-z0-9])(?P<s>xai-[A-Za-z0-9]{40,})", 0),
    (_any("pplx-"), r"(?<![A-Za-z0-9])(?P<s>pplx-[A-Za-z0-9]{40,})", 0),
    (_any("dapi"), r"(?<![A-Za-z0-9])(?P<s>dapi[0-9a-f]{32}(?:-[0-9]+)?)(?![A-Za-z0-9])", 0),
    (_any("sk-"), r"(?<![A-Za-z0-9_-])(?P<s>sk-[0-9a-f]{32})(?![A-Za-z0-9])", 0),
    # Google OAuth access tokens (``ya29.…``) and refresh tokens (``1//0…``).
    (_any("ya29."), r"(?<![A-Za-z0-9])(?P<s>ya29\.[0-9A-Za-z_-]{20,})", 0),
    (_any("1//0"), r"(?<![A-Za-z0-9/])(?P<s>1//0[0-9A-Za-z_-]{20,})", 0),
    # anaconda.org channel tokens: ``https://conda.anaconda.org/t/<token>/channel`` (and a
    # conda record's channel, ``t/<token>/channel``).
    (_any("t/"), r"(?<![^/])t/(?P<s>[A-Za-z0-9_-]{16,})(?=/)", 0),
    # ... of any length on an anaconda host (``…anaconda.org/t/ab-12cd/channel``).
    (_lower("anaconda."),
     r"anaconda\.(?:org|com|cloud)(?::[0-9]+)?/t/(?P<s>[^/\s?#]+)", re.IGNORECASE),
    (_any("hooks.slack.com/services/"), r"hooks\.slack\.com/services/(?P<s>[A-Za-z0-9/]{20,})", 0),
    # AWS: access key ids, and a bare 40-character secret access key (mixed case, a
    # digit; hex digests and paths do not qualify).
    (_any("AKIA", "ASIA"), r"(?<![A-Z0-9])(?P<s>(?:AKIA|ASIA)[A-Z0-9]{16})(?![A-Z0-9])", 0),
    (_long_run, r"(?<![A-Za-z0-9/+=_.-])(?P<s>(?!/)(?=[A-Za-z0-9/+]*[a-z])(?=[A-Za-z0-9/+]*[A-Z])"
     r"(?=[A-Za-z0-9/+]*[0-9])[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=_.-])", 0),
    # JSON Web Tokens: base64url JSON header ("eyJ"), payload, signature.
    (_any("eyJ"),
     r"(?<![A-Za-z0-9_-])(?P<s>eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}(?:\.[A-Za-z0-9_-]*)?)",
     0),
    # Signed or authenticated query strings and connection strings.
    (_lower("?", "&", ";"),
     r"[?&;](?:access_token|id_token|refresh_token|token|auth|api_?key|key|password|passwd|"
     r"secret|client_secret|sig|signature|x-amz-signature|x-amz-credential|"
     r"x-amz-security-token|x-goog-signature|x-goog-credential|code)=(?P<s>[^&#\s]+)",
     re.IGNORECASE),
    (_lower("accountkey", "sharedaccess"),
     r"(?:AccountKey|SharedAccessKey|SharedAccessSignature)=(?P<s>[^;\s]+)", re.IGNORECASE),
    (_lower("bearer", "basic"),
     r"\b(?:bearer|basic)\s+(?P<s>[A-Za-z0-9._~+/=-]{12,})", re.IGNORECASE),
)


@functools.cache
def secret_value(index: int) -> re.Pattern[str]:
    """The pattern of ``SECRET_VALUES[index]``, compiled (once, when first needed)."""
    _, source, flags = SECRET_VALUES[index]
    return re.compile(source, flags)


Mask = Callable[[re.Match[str]], str]


def substitute_needed(text: str, rules: Iterable[tuple[Need, Mask]],
                      pattern: Callable[[int], re.Pattern[str]]) -> str:
    """``text`` with rule ``i``'s matches (``pattern(i)``, compiled on first use) replaced by
    its mask, each rule tried only where its need holds: the one loop of the shapes and
    of :mod:`envguard.redact_forms`. Text beyond ASCII (where case folding is wider) meets
    every rule."""
    plain = text.isascii()
    lower = text.lower()
    for index, (need, mask) in enumerate(rules):
        if plain and not need(text, lower):
            continue
        new = pattern(index).sub(mask, text)
        if new != text:
            text, lower = new, new.lower()
    return text


def redact_shapes(text: str, mask: Mask) -> str:
    """``text`` with every match of :data:`SECRET_VALUES` replaced by ``mask(match)``."""
    return substitute_needed(text, ((need, mask) for need, _, _ in SECRET_VALUES),
                             secret_value)


SHAPES = (
    r"://|@|-----BEGIN|gh[pousr]_|github_pat_|glpat-|hf_|sk-|[sr]k_|xox|xapp-|pypi-|npm_|AIza"
    r"|nvapi-|r8_|gsk_|lsv2_|pcsk_|xai-|pplx-|dapi"
    r"|ya29\.|1//0|hooks\.slack|AKIA|ASIA|eyJ|(?<![^/])t/|[?&;][\w-]+=|[\w-]=(?!=)"
    r"|(?i:bearer|basic|accountkey|sharedaccess)"
    r"|(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{40})(?![0-9a-f]{40})")
"""The source of a necessary condition for any of :data:`SECRET_VALUES` and
:data:`envguard.redact._ASSIGNMENT` (compiled: :func:`shapes`)."""


@functools.cache
def shapes() -> re.Pattern[str]:
    return re.compile(SHAPES)

LITERALS = ("://", "@", "xox", "AIza", "AKIA", "ASIA", "eyJ", "hooks.slack", "/t/", "-----BEGIN",
             "glpat-", "sk-", "xapp-", "pypi-", "github_pat_", "hf_", "k_", "npm_", "ghp_", "gho_",
             "ghu_", "ghs_", "ghr_", "ya29.", "1//0", "nvapi-", "r8_", "gsk_", "lsv2_", "pcsk_",
             "xai-", "pplx-", "dapi")
WORDS = ("bearer", "basic", "accountkey", "sharedaccess")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_LONG_RUN_START = re.compile(r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{40})(?![0-9a-f]{40})")


def has_assignment(text: str) -> bool:
    """The two ``=`` branches of :data:`SHAPES` (``[\\w-]=(?!=)``, ``[?&;][\\w-]+=``) in ASCII
    text, looked for at each ``=`` only: true wherever
    :data:`envguard.redact._ASSIGNMENT` matches."""
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


def may_hold_shape(text: str) -> bool:
    """True wherever :data:`SHAPES` matches ``text`` (and on a few ASCII strings where it
    does not), with no regular expression compiled for ASCII text: ``in`` tests find the
    literal branches, the ``=`` branches are looked for at each ``=``
    (:func:`has_assignment`). Text with characters beyond ASCII (where case folding is
    wider) meets :data:`SHAPES` itself."""
    if not text.isascii():
        return shapes().search(text) is not None
    lower = text.lower()
    return (any(lit in text for lit in LITERALS) or text.startswith("t/")
            or any(word in lower for word in WORDS)
            or has_assignment(text)
            or (LONG_RUN.search(text) is not None
                and _LONG_RUN_START.search(text) is not None))
