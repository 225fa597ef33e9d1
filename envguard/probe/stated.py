"""Constants a package states about itself in its own version file, read with ``ast``
(nothing is imported): torch's build identity (``torch/version.py``,
:mod:`envguard.probe.torch_identity`), torchvision's and torchaudio's CUDA variant, the
oldest jaxlib that jax accepts (``jax/version.py``'s ``_minimum_jaxlib_version``).

:data:`STATED` says which file and which names, per distribution; the snapshot keeps them
in ``Distribution.stated`` for the doctor's rules (a companion built for another CUDA than
torch's, a jaxlib older than jax accepts).
"""

from __future__ import annotations

import os

from envguard.input_file import SMALL_FILE_BYTES, NotReadable, read_bounded

STATED: dict[str, tuple[str, tuple[str, ...]]] = {
    # distribution: (file under its site-packages folder, the names kept)
    "torchvision": ("torchvision/version.py", ("cuda", "git_version")),
    "torchaudio": ("torchaudio/version.py", ("cuda", "git_version")),
    "jax": ("jax/version.py", ("_minimum_jaxlib_version",)),
}


def parse_version_py(text: str) -> dict[str, str | bool | None]:
    """Every ``NAME = literal`` (or ``NAME: T = literal``) at module level.

    No fixed field set is assumed: CPU wheels lack ``rocm``, newer builds add ``xpu``.
    Text that does not parse raises ``SyntaxError`` (or ``ValueError``, ``RecursionError``).
    """
    import ast

    fields: dict[str, str | bool | None] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if literal is None or isinstance(literal, (str, bool)):
            fields[target.id] = literal
        elif isinstance(literal, (int, float)):
            fields[target.id] = str(literal)
    return fields


def read_stated(site_dir: str, name: str) -> dict[str, str]:
    """What distribution ``name`` (installed in ``site_dir``) states in its version file
    (:data:`STATED`); empty for any other distribution, or a file that is missing,
    unreadable or too large (bounded read: a FIFO planted there never hangs)."""
    where = STATED.get(name)
    if where is None:
        return {}
    path, names = where
    try:
        data = read_bounded(os.path.join(site_dir, path), limit=SMALL_FILE_BYTES,
                            what=os.path.basename(path))
        found = parse_version_py(data.decode("utf-8", "replace"))
    except (OSError, NotReadable, SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    return {k: str(v) for k, v in found.items() if k in names and isinstance(v, str) and v}
