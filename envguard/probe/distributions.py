"""Installed distributions, read from ``*.dist-info`` / ``*.egg-info`` folders on sys.path.

Nothing is imported: METADATA headers, INSTALLER, REQUESTED, WHEEL,
direct_url.json and RECORD are read as files. The build fingerprint is a sha256
over the normalized RECORD (see :func:`~envguard.probe.recordfile.fingerprint_record`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from envguard.input_file import (
    METADATA_BYTES,
    SMALL_FILE_BYTES,
    NotReadable,
    oserror_reason,
    read_bounded_text,
)
from envguard.model import DirectUrl, Distribution, ProbeIssue
from envguard.names import normalize_name
from envguard.probe.fastpath.marshal_file import Key, stat_key
from envguard.probe.fastpath.records import RecordMemo, folder_entry, folder_parts
from envguard.probe.fastpath.rows import RecordRows
from envguard.probe.recordfile import fingerprint_record, read_record, top_level_modules
from envguard.probe.stated import read_stated
from envguard.redact import redact_data


@dataclass(slots=True)
class InstalledDist:
    """A distribution as found on disk, with the RECORD rows that identify its build."""

    dist: Distribution
    site_dir: str
    record: RecordRows | None
    """Fingerprinted rows only (:func:`~envguard.probe.recordfile.is_fingerprinted`); None
    without a RECORD."""
    record_total: int = 0
    """All rows in RECORD, including the ones skipped for the fingerprint."""
    record_mtime_ns: int | None = None
    """When RECORD was written: the end of the install."""
    issues: list[ProbeIssue] = field(default_factory=list)
    from_memo: bool = False
    """Read from the records memo: every file of the dist-info folder kept the stat key
    the memo holds, so ``record`` holds the rows the memo held, those stat-ahead may have
    checked already (:meth:`~envguard.probe.fastpath.statahead.Ahead.units_for`)."""


def parse_headers(text: str) -> dict[str, list[str]]:
    """RFC 822 headers of a METADATA/WHEEL file, up to the first blank line.

    A small replacement for ``email.parser`` (ten times faster on 200 files); folded
    continuation lines are joined.
    """
    headers: dict[str, list[str]] = {}
    last: list[str] | None = None
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if not line:
            break
        if line[0] in " \t" and last is not None:
            last[-1] += " " + line.strip()
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        last = headers.setdefault(key.strip().lower(), [])
        last.append(value.strip())
    return headers


def _first(headers: dict[str, list[str]], key: str) -> str | None:
    values = headers.get(key)
    return values[0] if values else None


def _read_text(path: str, limit: int, issues: list[ProbeIssue]) -> str | None:
    """The text of a dist-info file (:func:`~envguard.input_file.read_bounded`); None when
    it is absent, or not read (a FIFO, a device, too large: then an issue says so)."""
    try:
        return read_bounded_text(path, limit=limit, what=os.path.basename(path))
    except FileNotFoundError:
        return None
    except NotReadable as exc:
        issues.append(ProbeIssue(section="packages", path=path,
                                 message=f"{os.path.basename(path)} unreadable: {exc.reason}"))
        return None


def _parse_direct_url(text: str) -> DirectUrl:
    data: Any = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        raise ValueError("no 'url' string")
    def section(key: str) -> dict[str, Any]:
        value = data.get(key)
        return value if isinstance(value, dict) else {}

    dir_info, vcs_info, archive = section("dir_info"), section("vcs_info"), section("archive_info")
    archive_hash = None
    hashes = archive.get("hashes")
    if isinstance(hashes, dict) and isinstance(hashes.get("sha256"), str):
        archive_hash = "sha256=" + hashes["sha256"]
    elif isinstance(archive.get("hash"), str):
        archive_hash = archive["hash"]

    def text_or_none(obj: dict[str, Any], key: str) -> str | None:
        value = obj.get(key)
        return value if isinstance(value, str) else None

    return DirectUrl(
        url=data["url"],
        editable=bool(dir_info.get("editable", False)),
        vcs=text_or_none(vcs_info, "vcs"),
        commit_id=text_or_none(vcs_info, "commit_id"),
        requested_revision=text_or_none(vcs_info, "requested_revision"),
        archive_hash=archive_hash,
        subdirectory=text_or_none(data, "subdirectory"),
    )


_FOLDER_FILES = ("METADATA", "RECORD", "WHEEL", "INSTALLER", "direct_url.json", "REQUESTED")
"""What :func:`read_distribution` reads of a dist-info folder: the memo key's files."""


def _folder_key(meta_dir: str) -> tuple[Key | None, ...] | None:
    """The stat key of each file a dist-info read depends on (None: the file is absent);
    None when one cannot be stat'ed (then nothing is memoised)."""
    key: list[Key | None] = []
    for name in _FOLDER_FILES:
        try:
            key.append(stat_key(os.stat(os.path.join(meta_dir, name))))
        except FileNotFoundError:
            key.append(None)
        except OSError:
            return None
    return tuple(key)


def read_distribution(
    site_dir: str, meta_name: str, memo: RecordMemo | None = None
) -> InstalledDist:
    """Read one ``*.dist-info`` or ``*.egg-info`` folder; problems become issues, not raises.
    With ``memo``, a dist-info folder whose files all kept their stat keys is not read
    again (:class:`~envguard.probe.fastpath.records.RecordMemo`)."""
    if memo is None or meta_name.endswith(".egg-info"):
        return _read_folder(site_dir, meta_name, memo)
    meta_dir = os.path.join(site_dir, meta_name)
    key = _folder_key(meta_dir)
    if key is not None:
        cached = memo.get_folder(meta_dir, key)
        if cached is not None:
            with contextlib.suppress(ValueError, TypeError, IndexError):
                dist, record, total, mtime_ns, issues = folder_parts(cached, site_dir,
                                                                     meta_name)
                return InstalledDist(dist=dist, site_dir=site_dir, record=record,
                                     record_total=total, record_mtime_ns=mtime_ns,
                                     issues=issues, from_memo=True)
    item = _read_folder(site_dir, meta_name, memo)
    # Kept only if unchanged while it was read, and only if it holds nothing a credential
    # could be in (a direct_url with user:password@): memo files must not carry secrets.
    if key is not None and key == _folder_key(meta_dir) \
            and redact_data(item.dist) is item.dist and redact_data(item.issues) is item.issues:
        memo.put_folder(meta_dir, key, folder_entry(item.dist, item.record, item.record_total,
                                                    item.record_mtime_ns, item.issues))
    return item


def _read_folder(site_dir: str, meta_name: str, memo: RecordMemo | None) -> InstalledDist:
    meta_dir = os.path.join(site_dir, meta_name)
    issues: list[ProbeIssue] = []
    stem = meta_name.rsplit(".", 1)[0]
    guess_name, _, guess_version = stem.partition("-")
    name, version, requires = guess_name, guess_version.split("-")[0] or None, []

    is_egg = meta_name.endswith(".egg-info")
    egg_file = is_egg and os.path.isfile(meta_dir)
    metadata_path = meta_dir if egg_file else os.path.join(
        meta_dir, "PKG-INFO" if is_egg else "METADATA")
    refused = len(issues)
    metadata_text = _read_text(metadata_path, METADATA_BYTES, issues)
    if metadata_text is None:
        if len(issues) == refused:  # absent, rather than refused (that has its issue)
            issues.append(ProbeIssue(section="packages", message="METADATA missing",
                                     path=meta_dir))
    else:
        headers = parse_headers(metadata_text)
        meta_name_value = _first(headers, "name")
        meta_version = _first(headers, "version")
        if not meta_name_value or not meta_version:
            issues.append(
                ProbeIssue(
                    section="packages",
                    message="corrupt METADATA: no Name or Version header",
                    path=meta_dir,
                )
            )
        else:
            name, version = str(meta_name_value).strip(), str(meta_version).strip()
        requires = sorted(headers.get("requires-dist", []))

    def read_opt(fname: str) -> str | None:
        return None if egg_file else _read_text(os.path.join(meta_dir, fname),
                                                SMALL_FILE_BYTES, issues)

    installer_text = read_opt("INSTALLER")
    installer = installer_text.strip() or None if installer_text is not None else None
    requested = os.path.exists(os.path.join(meta_dir, "REQUESTED"))

    direct_url = None
    direct_text = read_opt("direct_url.json")
    if direct_text is not None:
        try:
            direct_url = _parse_direct_url(direct_text)
        except ValueError as exc:
            issues.append(
                ProbeIssue(section="packages", message=f"corrupt direct_url.json: {exc}",
                           path=meta_dir)
            )

    generator, tags, build = None, [], None
    wheel_text = read_opt("WHEEL")
    if wheel_text is not None:
        wheel = parse_headers(wheel_text)
        generator = _first(wheel, "generator")
        tags = sorted(wheel.get("tag", []))
        build = _first(wheel, "build")

    record: RecordRows | None = None
    record_total = 0
    fingerprint = None
    record_mtime_ns = None
    if not is_egg:
        record_path = os.path.join(meta_dir, "RECORD")
        try:
            st = os.stat(record_path)
            record_mtime_ns = st.st_mtime_ns
            key = stat_key(st)
            parsed = memo.get(record_path, key) if memo is not None else None
            if parsed is None:
                total, kept = read_record(record_path)
                parsed = (total, RecordRows.of(kept), fingerprint_record(kept))
                if memo is not None:
                    memo.put(record_path, key, parsed)
            record_total, record, fingerprint = parsed
        except FileNotFoundError:
            issues.append(ProbeIssue(section="packages", message="RECORD missing", path=meta_dir))
        except (NotReadable, OSError) as exc:  # a FIFO, a device, too large, a symlink loop
            reason = exc.reason if isinstance(exc, NotReadable) else oserror_reason(exc)
            issues.append(ProbeIssue(section="packages", message=f"RECORD unreadable: {reason}",
                                     path=record_path))

    dist = Distribution(
        name=normalize_name(name),
        version=version,
        location=site_dir,
        metadata_dir=meta_name,
        installer=installer,
        requested=requested,
        editable=bool(direct_url and direct_url.editable),
        direct_url=direct_url,
        fingerprint=fingerprint,
        record_entries=record_total,
        wheel_generator=str(generator).strip() if generator else None,
        wheel_tags=tags,
        wheel_build=str(build).strip() if build else None,
        requires=requires,
        top_level=top_level_modules([row[0] for row in record.rows()]) if record else [],
        stated=read_stated(site_dir, normalize_name(name)),
    )
    return InstalledDist(dist=dist, site_dir=site_dir, record=record, record_total=record_total,
                         record_mtime_ns=record_mtime_ns, issues=issues)


def scan(
    sys_path: list[str], memo: RecordMemo | None = None
) -> tuple[list[InstalledDist], list[ProbeIssue]]:
    """Every distribution on ``sys_path``, first occurrence of a name winning (as import does).

    Later copies of a name are listed in the winner's ``shadowed``: a classic sign of a
    half-finished install or two site-packages mixed.
    """
    found: dict[str, InstalledDist] = {}
    shadowed: dict[str, list[str]] = {}
    issues: list[ProbeIssue] = []
    seen_dirs: set[str] = set()
    for entry in sys_path:
        site_dir = os.path.abspath(entry or ".")
        if site_dir in seen_dirs:
            continue
        seen_dirs.add(site_dir)
        try:
            names = sorted(os.listdir(site_dir))
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            continue  # a zip or egg file on sys.path
        except OSError as exc:
            issues.append(
                ProbeIssue(section="packages", message=f"cannot list: {exc.strerror}",
                           path=site_dir)
            )
            continue
        for meta_name in names:
            if not meta_name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                installed = read_distribution(site_dir, meta_name, memo)
            except OSError as exc:
                issues.append(
                    ProbeIssue(section="packages", message=f"unreadable: {exc.strerror or exc}",
                               path=os.path.join(site_dir, meta_name))
                )
                continue
            issues.extend(installed.issues)
            key = installed.dist.name
            if key in found:
                shadowed.setdefault(key, []).append(os.path.join(site_dir, meta_name))
                continue
            found[key] = installed
    result = []
    for key in sorted(found):
        installed = found[key]
        if key in shadowed:
            d = installed.dist
            installed.dist = dataclasses.replace(d, shadowed=shadowed[key])
            issues.append(
                ProbeIssue(
                    section="packages",
                    message=f"{key} is installed more than once; the first on sys.path wins",
                    path=", ".join(shadowed[key]),
                )
            )
        result.append(installed)
    return result, issues
