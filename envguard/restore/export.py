"""A restore plan written out: a pinned requirements.txt, or a PEP 751 pylock.toml."""

from __future__ import annotations

import re

from envguard.model import Distribution, Snapshot
from envguard.redact import redact_text
from envguard.restore.plan import (
    PYTORCH_INDEX,
    SKIP,
    TORCH_LABEL,
    PlanRow,
    RestorePlan,
    file_url_path,
    minor,
)
from envguard.toml_write import toml_string


def requirements_text(plan: RestorePlan) -> str:
    """A pinned requirements.txt: exactly GOOD's package set, for ``uv pip sync``."""
    lines = [f"# envguard restore: the package set of {_comment(plan.good_name)}",
             f"# Python {_comment(plan.good_python)}; install with: uv pip sync <this file>"]
    if plan.hints_applied:
        lines += [f"--extra-index-url {url}" for url in plan.index_hints]
    lines += list(plan.requirements)
    skipped = [r for r in plan.rows if r.action == SKIP]
    lines += [f"# not reproducible: {_comment(r.name)}: {_comment(r.reason)}" for r in skipped]
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    """A value safe inside a ``#`` comment line: no line breaks or control characters, and
    UTF-8 (:func:`utf8_text`)."""
    return utf8_text(re.sub(r"[\x00-\x1f\x7f-\x9f]", "?", text))


def utf8_text(text: str) -> str:
    """``text`` as UTF-8 can hold it: bytes that were not UTF-8 (a file name given on the
    command line, kept by Python as surrogate escapes) are written as ``\\udcff``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def pylock_text(plan: RestorePlan, good: Snapshot) -> str:
    """A PEP 751 ``pylock.toml`` of GOOD's package set (see docs/RESTORE.md for its limits)."""
    out = ['lock-version = "1.0"', 'created-by = "envguard"',
           f"requires-python = {toml_string('==' + minor(plan.good_python) + '.*')}", ""]
    goods = {d.name: d for d in good.packages}
    for row in plan.rows:
        dist = goods.get(row.name)
        if dist is None or row.action == SKIP:
            continue
        out += ["[[packages]]", f"name = {toml_string(row.name)}"]
        if row.source != "directory" and row.source != "editable" and dist.version:
            out.append(f"version = {toml_string(dist.version)}")
        out += _pylock_source(row, dist, plan)
        if dist.fingerprint:
            out += ["[packages.tool.envguard]",
                    f"record-fingerprint = {toml_string(dist.fingerprint)}"]
        out.append("")
    out += ["[tool.envguard]", f"snapshot = {toml_string(utf8_text(plan.good_name))}",
            f"python = {toml_string(plan.good_python)}", ""]
    return "\n".join(out)


def _pylock_source(row: PlanRow, dist: Distribution, plan: RestorePlan) -> list[str]:
    direct = dist.direct_url
    if row.source == "index":
        index = _index_for(dist.version or "", plan)
        return [f"index = {toml_string(index)}"] if index else []
    if direct is None:
        return []
    sub = ([f"subdirectory = {toml_string(direct.subdirectory)}"] if direct.subdirectory
           else [])
    if row.source == "vcs" and direct.vcs and direct.commit_id:
        url = direct.url.removeprefix(f"{direct.vcs}+")
        lines = ["[packages.vcs]", f"type = {toml_string(direct.vcs)}", f"url = {toml_string(url)}",
                 f"commit-id = {toml_string(direct.commit_id)}"]
        if direct.requested_revision:
            lines.append(f"requested-revision = {toml_string(direct.requested_revision)}")
        return lines + sub
    path = file_url_path(direct.url)
    if row.source in ("directory", "editable") and path is not None:
        return ["[packages.directory]", f"path = {toml_string(path)}",
                f"editable = {'true' if row.source == 'editable' else 'false'}", *sub]
    if direct.archive_hash and "=" in direct.archive_hash:
        algo, _, digest = direct.archive_hash.partition("=")
        where = (f"path = {toml_string(path)}" if path is not None
                 else f"url = {toml_string(direct.url)}")
        return ["[packages.archive]", where, f"hashes = {{ {_toml_key(algo)} = "
                f"{toml_string(digest)} }}", *sub]
    return []


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_string(key)


def _index_for(version: str, plan: RestorePlan) -> str | None:
    label = version.split("+", 1)[1] if "+" in version else ""
    if TORCH_LABEL.match(label) and plan.hints_applied:
        return PYTORCH_INDEX + label
    return redact_text(plan.index.index_url) if plan.index.index_url else None
