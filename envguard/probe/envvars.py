"""Relevant environment variables, with secret values masked but their changes detectable.

Only allowlisted families are recorded. What is secret is decided by
:mod:`envguard.redact`: a variable whose *name* looks secret (TOKEN, KEY, SECRET,
PASSWORD, PAT, PASSPHRASE, CREDENTIAL, AUTH, COOKIE, SESSION, ...) keeps no value, and a
value that holds a credential (``https://user:pass@host``, ``ghp_…``, ``hf_…``, an AWS key,
a JWT, a signed query string, a PEM private key) keeps the rest of the value with the
credential masked. Either way the snapshot keeps a keyed HMAC of the raw value, so a
changed token shows up in a diff without the token ever leaving the machine.

The HMAC key lives in ``~/.config/envguard/mask.key`` (created 0600 on first use)
or comes from ``$ENVGUARD_MASK_KEY``; set the same key on every node of a cluster
to compare their snapshots. The snapshot names the key by a short id only.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from envguard.globs import matches_any
from envguard.model import Environment, ProbeIssue
from envguard.redact import redact_env, secret_name

FAMILIES = (
    "CUDA_*", "NCCL_*", "TORCH*", "TORCHINDUCTOR_*", "TORCHDYNAMO_*", "TRITON_*", "PYTORCH_*",
    "NVIDIA_*", "LD_LIBRARY_PATH", "LD_PRELOAD", "PATH", "PYTHON*", "VIRTUAL_ENV", "CONDA_PREFIX",
    "UV_*", "PIP_*", "HF_*", "HUGGING_FACE_*", "TRANSFORMERS_*", "OMP_*", "MKL_*",
    "CUBLAS_*", "CUDNN_*", "NVSHMEM_*", "TMPDIR", "XDG_CACHE_HOME", "ENVGUARD_*",
)
MASK_KEY_ENV = "ENVGUARD_MASK_KEY"


def looks_secret(name: str) -> bool:
    """``HF_TOKEN``, ``WANDB_API_KEY``, ``PIP_PASSWORD``: yes. ``PATH``, ``KEYBOARD``: no."""
    return secret_name(name)


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
        existing = _read_key(path)
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

    The key is written whole to a temporary file first and then hard-linked to its name,
    which fails where the name exists: no process ever reads a key file half written.
    When another process created it first, its key wins; an empty key file (an
    interrupted first run of an older envguard) is replaced, and whichever replacement
    lands last is the key every process returns.
    """
    import secrets
    import tempfile

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_hex(32).encode()
    fd, tmp = tempfile.mkstemp(prefix=".mask.key.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(key + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
            return key
        except FileExistsError:
            existing = _read_key(path)  # a symlink there: OSError, a one-off key
            if existing:
                return existing
            os.replace(tmp, path)
            return _read_key(path) or key
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _read_key(path: Path) -> bytes:
    """The key file's key; OSError where it is a symlink (never followed) or not a file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return fh.read(4096).strip()


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"envguard-mask-key-id:" + key).hexdigest()[:12]


def _digest(key: bytes, name: str, value: str) -> str:
    mac = hmac.new(key, f"{name}\0{value}".encode("utf-8", "surrogateescape"), hashlib.sha256)
    return "hmac-sha256:" + mac.hexdigest()[:32]


def selected(name: str, patterns: Iterable[str]) -> bool:
    return matches_any(name, patterns)


def collect(
    env: Mapping[str, str], extra_patterns: Iterable[str], issues: list[ProbeIssue]
) -> Environment:
    patterns = (*FAMILIES, *extra_patterns)
    names = sorted(n for n in env if selected(n, patterns) and n != MASK_KEY_ENV)
    key: bytes | None = None

    def digest(var: str, value: str) -> str:
        nonlocal key
        key = key or load_mask_key(issues, env)
        return _digest(key, var, value)

    out = {name: redact_env(name, env[name], digest) for name in names}
    return Environment(variables=out, mask_key_id=key_id(key) if key else None)
