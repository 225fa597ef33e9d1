"""Relevant environment variables, with secret values masked but their changes detectable.

Only allowlisted families are recorded. A variable whose *name* looks secret
(TOKEN, KEY, SECRET, PASSWORD, CREDENTIAL, AUTH, ...) is never written: the
snapshot keeps a keyed HMAC of its value, so a changed token shows up in a diff
without the token ever leaving the machine. Credentials embedded in URLs
(``https://user:pass@host``) are redacted from any value the same way.

The HMAC key lives in ``~/.config/envguard/mask.key`` (created 0600 on first use)
or comes from ``$ENVGUARD_MASK_KEY``; set the same key on every node of a cluster
to compare their snapshots. The snapshot names the key by a short id only.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from envguard.model import Environment, EnvValue, ProbeIssue

FAMILIES = (
    "CUDA_*", "NCCL_*", "TORCH*", "TORCHINDUCTOR_*", "TORCHDYNAMO_*", "TRITON_*", "PYTORCH_*",
    "NVIDIA_*", "LD_LIBRARY_PATH", "LD_PRELOAD", "PATH", "PYTHON*", "VIRTUAL_ENV", "CONDA_PREFIX",
    "UV_*", "PIP_*", "HF_*", "HUGGING_FACE_*", "TRANSFORMERS_*", "OMP_*", "MKL_*",
    "CUBLAS_*", "CUDNN_*", "NVSHMEM_*", "TMPDIR", "XDG_CACHE_HOME", "ENVGUARD_*",
)
_SECRET_WORDS = frozenset(
    {"TOKEN", "TOKENS", "KEY", "KEYS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASS", "PWD",
     "CREDENTIAL", "CREDENTIALS", "CRED", "CREDS", "AUTH", "AUTHORIZATION", "PRIVATE", "SESSION",
     "COOKIE", "SIGNATURE", "APIKEY", "ACCESSKEY", "SAS", "BEARER", "JWT", "OAUTH"}
)
_SECRET_SUFFIXES = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD")
_NOT_SECRET = frozenset({"PWD", "OLDPWD", "PATH", "TORCH_COMPILE_CACHE_KEY_TAG"})
# userinfo runs to the *last* "@" before the host: a raw "@" in a password must not leak
# the rest of the password as if it were the host.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]+)@")
MASK_KEY_ENV = "ENVGUARD_MASK_KEY"


def looks_secret(name: str) -> bool:
    """``HF_TOKEN``, ``WANDB_API_KEY``, ``PIP_PASSWORD``: yes. ``PATH``, ``KEYBOARD``: no."""
    upper = name.upper()
    if upper in _NOT_SECRET:
        return False
    # Trailing digits do not make a word harmless: HF_TOKEN2, GITHUB_TOKEN_1.
    words = [w.rstrip("0123456789") for w in re.split(r"[^A-Z0-9]+", upper)]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) for w in words if w)


def mask_key_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "envguard" / "mask.key"


def load_mask_key(issues: list[ProbeIssue], env: Mapping[str, str] | None = None) -> bytes:
    """The HMAC key: from ``$ENVGUARD_MASK_KEY``, else a per-user key file made on first use.

    ``env`` is the environment being snapshotted (``os.environ`` by default).
    """
    explicit = (os.environ if env is None else env).get(MASK_KEY_ENV)
    if explicit:
        return explicit.encode("utf-8")
    path = mask_key_path()
    with contextlib.suppress(OSError):
        existing = path.read_bytes().strip()
        if existing:
            return existing
    try:
        return _create_key(path)
    except OSError as exc:
        issues.append(ProbeIssue(section="environment", message="no persistent mask key "
                                 f"({exc.strerror}); masked digests use a one-off key and will "
                                 "not compare with other snapshots", path=str(path)))
        import secrets

        return secrets.token_hex(32).encode()


def _create_key(path: Path) -> bytes:
    """Create the key file (0600) and return the key it holds afterwards.

    When another process created it first, its key wins; an empty key file (an
    interrupted first run) is replaced instead of blocking every later snapshot.
    """
    import secrets
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        existing = path.read_bytes().strip()
        if existing:
            return existing
        fd, tmp = tempfile.mkstemp(prefix=".mask.key.", dir=path.parent)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(key + b"\n")
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return key
    with os.fdopen(fd, "wb") as fh:
        fh.write(key + b"\n")
    return key


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"envguard-mask-key-id:" + key).hexdigest()[:12]


def _digest(key: bytes, name: str, value: str) -> str:
    mac = hmac.new(key, f"{name}\0{value}".encode("utf-8", "surrogateescape"), hashlib.sha256)
    return "hmac-sha256:" + mac.hexdigest()[:32]


def selected(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def collect(
    env: Mapping[str, str], extra_patterns: Iterable[str], issues: list[ProbeIssue]
) -> Environment:
    patterns = (*FAMILIES, *extra_patterns)
    names = sorted(n for n in env if selected(n, patterns) and n != MASK_KEY_ENV)
    key: bytes | None = None
    out: dict[str, EnvValue] = {}
    for name in names:
        value = env[name]
        if looks_secret(name):
            key = key or load_mask_key(issues, env)
            out[name] = EnvValue(value=None, masked=True, digest=_digest(key, name, value))
        elif _URL_CREDENTIALS.search(value):
            key = key or load_mask_key(issues, env)
            redacted = _URL_CREDENTIALS.sub(r"\g<scheme>***@", value)
            out[name] = EnvValue(value=redacted, masked=True, digest=_digest(key, name, value))
        else:
            out[name] = EnvValue(value=value)
    return Environment(variables=out, mask_key_id=key_id(key) if key else None)
