"""Which names are secret: a variable, a ``--flag``, the ``NAME`` of ``NAME=value``, a JSON
or YAML key, an HTTP header. Data (:data:`SECRET_NAME_WORDS`, :data:`NOT_SECRET_NAMES`)
and two questions about it (:func:`secret_name`, :func:`secret_flag`); the rest of the
redaction rules are in :mod:`envguard.redact` and :mod:`envguard.redact_forms`.
"""

from __future__ import annotations

import functools
import re

SECRET_NAME_WORDS: tuple[str, ...] = (
    # A word that is, or ends in, a credential noun: HF_TOKEN, GITHUBTOKEN, CLIENTSECRET,
    # WANDB_API_KEY, SIGNINGKEY, DB_PASSWORD, GPG_PASSPHRASE, AWS_SHARED_CREDENTIALS.
    r"[A-Z0-9]*(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|KEY|CREDENTIAL|COOKIE|SIGNATURE)S?",
    # Words that are credentials on their own.
    r"PASS|PWD|PAT|PATS|CRED|CREDS|AUTH|AUTHORIZATION|AUTHTOKEN|OAUTH|BEARER|JWT|PRIVATE",
    r"SESSION|SESSIONID|SESSID|SAS|SIG|DSN|WEBHOOK|WEBHOOKS|APIKEY|ACCESSKEY|PRIVKEY",
)
"""Patterns over the words of an upper-cased name (split at anything but A-Z and 0-9,
trailing digits dropped: ``HF_TOKEN2`` has the word ``TOKEN``), each matched whole;
compiled into one (:func:`_secret_word`) the first time a name has a piece of one."""

NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD", "PATH", "TORCH_COMPILE_CACHE_KEY_TAG",
                              "HF_HUB_DISABLE_IMPLICIT_TOKEN"})
"""Whole (upper-cased) names that match a secret word but hold no secret."""

TOKEN_COUNT_WORDS = frozenset({"MAX", "MIN", "NUM", "N", "TOTAL", "COUNT", "LIMIT", "BUDGET",
                               "PER"})
"""Words that make ``TOKEN(S)`` a count of text tokens, not a credential: ``--max-tokens``,
``max_new_tokens``, ``NUM_TOKENS``, ``tokens_per_batch``. Only in a name whose one secret
word is a plain ``TOKEN``/``TOKENS`` and that has no ``HF`` word (``MAX_HF_TOKEN`` stays
secret)."""

FLAG_NAMES_A_PLACE = frozenset({"FILE", "FILES", "PATH", "DIR", "FD", "ENV"})
"""A flag whose last word is one of these names where a secret is kept, not the secret:
``--password-file /run/secrets/pw``, ``--token-path …``, ``--password-fd 3``. Its value
is searched by shape only."""

_WORD_SPLIT = re.compile(r"[^A-Z0-9]+")
_ANY_WORD = ("TOKEN", "SECRET", "PASS", "PWD", "KEY", "CRED", "COOKIE", "AUTH", "BEARER", "JWT",
             "PRIVATE", "SESS", "SAS", "SIG", "DSN", "WEBHOOK", "PAT")
"""A piece of every word of :data:`SECRET_NAME_WORDS`: most names (``TORCH_CUDA_ARCH_LIST``)
have none, and skip the words."""


@functools.cache
def _secret_word() -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in SECRET_NAME_WORDS))


@functools.lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """``HF_TOKEN``, ``WANDB_API_KEY``, ``GH_PAT``, ``hf-token``: yes. ``PATH``,
    ``KEYBOARD_LAYOUT``, ``TOKENIZERS_PARALLELISM``: no."""
    upper = name.upper()
    if not any(piece in upper for piece in _ANY_WORD) or upper in NOT_SECRET_NAMES:
        return False
    words = [w.rstrip("0123456789") for w in _WORD_SPLIT.split(upper)]
    word = _secret_word()
    hits = [w for w in words if w and word.fullmatch(w)]
    if hits and all(w in ("TOKEN", "TOKENS") for w in hits) \
            and not TOKEN_COUNT_WORDS.isdisjoint(words) and "HF" not in words:
        return False  # a count of text tokens
    return bool(hits)


@functools.lru_cache(maxsize=4096)
def secret_flag(name: str) -> bool:
    """A secret name (``password``, ``x-api-key``, ``hf_token``) that does not name where a
    secret is kept (``password-file``: :data:`FLAG_NAMES_A_PLACE`)."""
    words = [w for w in _WORD_SPLIT.split(name.upper()) if w]
    return bool(words) and words[-1] not in FLAG_NAMES_A_PLACE and secret_name(name)
