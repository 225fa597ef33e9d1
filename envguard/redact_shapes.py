"""Credentials recognised by their shape wherever they appear (:data:`SECRET_VALUES`: URL
userinfo, tokens with a known prefix, AWS keys, JWTs, signed query strings, PEM private
keys), and the quick test that most strings fail (:func:`may_hold_shape`). Used by
:mod:`envguard.redact`, the one redactor.
"""

from __future__ import annotations

import re

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
    # A password with "://" inside (``https://u:pa://ss@h``): the pattern above stops
    # there and masks only the part after it; this takes what it left (256 characters at
    # most, so each scheme costs bounded time).
    (_URL_SCHEME + r"(?P<s>[^\s/?#@:]*:[^\s/?#@,]{0,256}?://\*\*\*)@", 0),
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
    # Google OAuth access tokens (``ya29.…``) and refresh tokens (``1//0…``).
    (r"(?<![A-Za-z0-9])(?P<s>ya29\.[0-9A-Za-z_-]{20,})", 0),
    (r"(?<![A-Za-z0-9/])(?P<s>1//0[0-9A-Za-z_-]{20,})", 0),
    # anaconda.org channel tokens: ``https://conda.anaconda.org/t/<token>/channel`` (and a
    # conda record's channel, ``t/<token>/channel``).
    (r"(?<![^/])t/(?P<s>[A-Za-z0-9_-]{16,})(?=/)", 0),
    # ... of any length on an anaconda host (``…anaconda.org/t/ab-12cd/channel``).
    (r"anaconda\.(?:org|com|cloud)(?::[0-9]+)?/t/(?P<s>[^/\s?#]+)", re.IGNORECASE),
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

SHAPES = re.compile(
    r"://|@|-----BEGIN|gh[pousr]_|github_pat_|glpat-|hf_|sk-|[sr]k_|xox|xapp-|pypi-|npm_|AIza"
    r"|ya29\.|1//0|hooks\.slack|AKIA|ASIA|eyJ|(?<![^/])t/|[?&;][\w-]+=|[\w-]=(?!=)"
    r"|(?i:bearer|basic|accountkey|sharedaccess)"
    r"|(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{40})(?![0-9a-f]{40})")
"""A necessary condition for any of :data:`SECRET_VALUES` and :data:`_ASSIGNMENT`."""
LITERALS = ("://", "@", "xox", "AIza", "AKIA", "ASIA", "eyJ", "hooks.slack", "/t/", "-----BEGIN",
             "glpat-", "sk-", "xapp-", "pypi-", "github_pat_", "hf_", "k_", "npm_", "ghp_", "gho_",
             "ghu_", "ghs_", "ghr_", "ya29.", "1//0")
WORDS = ("bearer", "basic", "accountkey", "sharedaccess")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
LONG_RUN = re.compile(r"[A-Za-z0-9/+]{40}")
_LONG_RUN_START = re.compile(r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{40})(?![0-9a-f]{40})")


def _assignment(text: str) -> bool:
    """The two ``=`` branches of :data:`SHAPES` (``[\\w-]=(?!=)``, ``[?&;][\\w-]+=``) in ASCII
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


def may_hold_shape(text: str) -> bool:
    """Exactly whether :data:`SHAPES` matches ``text``, at a third of its cost on a
    snapshot's strings: Python's ``re`` tries every branch at every position, while ``in``
    tests find the literal branches and the ``=`` branches are looked for at each ``=``.
    Text with characters beyond ASCII (where case folding is wider) meets :data:`SHAPES`
    itself, and so does text that passes a cheap check."""
    if not text.isascii():
        return SHAPES.search(text) is not None
    lower = text.lower()
    cheap = (any(lit in text for lit in LITERALS) or text.startswith("t/")
             or any(word in lower for word in WORDS)
             or ("=" in text and _assignment(text))
             or (LONG_RUN.search(text) is not None
                 and _LONG_RUN_START.search(text) is not None))
    return cheap and SHAPES.search(text) is not None
