"""RECORD rows as the records memo keeps them (envguard.probe.fastpath.rows.RecordRows):
checksummed chunks in a layout (rows to stat, then header rows by folder), unpacked by
whichever process checks them, parsed from RECORD again when a chunk is corrupt. The
dist-info folders the memo keeps (envguard.probe.fastpath.records): every field of a
distribution round-trips, and a file written for other fields is ignored. Real venvs, a
real memo file, real forked workers."""

from __future__ import annotations

import dataclasses
import marshal
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from envguard.model import Snapshot
from envguard.probe import SnapshotOptions, collect
from envguard.probe.fastpath import records, statahead
from envguard.probe.fastpath.records import RecordMemo
from envguard.probe.fastpath.rows import (
    RecordRows,
    layout,
    pack_chunk,
    py_material,
    unpack_chunk,
)
from tests.wheelfactory import Venv

if TYPE_CHECKING:
    from envguard.model import Distribution

ROWS = [(f"pkg/m{n}.py", f"sha256=d{n}", str(n)) for n in range(1100)]
HEADERS = [(f"pkg/include/{d}/h{n}.h", f"sha256=h{d}{n}", "7") for d in "abc" for n in range(300)]
MIXED = [r for pair in zip(ROWS[:900], HEADERS, strict=True) for r in pair] + ROWS[900:]


def test_rows_pack_into_chunks_and_back() -> None:
    packed = RecordRows.of(ROWS).packed()
    count, size, chunks, counts, summaries, material = packed
    assert (count, size, len(chunks)) == (1100, 512, 3) and material == py_material(ROWS)
    assert counts == [512, 512, 76] and summaries == [None, None, None]
    back = RecordRows.unpacked(packed)
    assert back.chunk_sizes() == [512, 512, 76]
    assert back.chunk_rows(2) == ROWS[1024:]
    assert back.rows() == ROWS and back == RecordRows.of(ROWS) and len(back) == 1100


def test_header_rows_are_laid_out_by_folder_after_the_rows_to_stat() -> None:
    odd = [("pkg/include/a/loader.py", "sha256=p", "1"),  # loaded by Python: stat'ed
           ("pkg/include/a/nohash.h", "", ""),  # tolerated: neither hash nor size
           ("../../../include/site/x.h", "sha256=s", "1"),  # leaves site-packages
           ("/usr/include/y.h", "sha256=t", "1")]  # absolute
    ordered, counts, summaries = layout(MIXED + odd, 512)
    assert ordered[:1104] == ROWS + odd and sorted(ordered[1104:]) == sorted(HEADERS)
    assert counts == [512, 512, 512, 468] and sum(counts) == len(MIXED) + 4
    assert summaries[:3] == [None, None, None]  # chunk 2: rows to stat and headers: stat'ed
    assert summaries[3] == (("pkg/include/b", 168), ("pkg/include/c", 300))
    back = RecordRows.unpacked(RecordRows.of(MIXED + odd).packed())
    assert back == RecordRows.of(MIXED + odd)
    assert [back.chunk_summary(n) for n in range(4)] == summaries
    assert [back.chunk_rows(n) for n in range(4)] == [
        ordered[a:a + 512] for a in range(0, len(ordered), 512)]


@pytest.mark.parametrize("value", [
    (1100, 512, [b"x"], [1100], [None], b""),  # a chunk of more rows than its size
    (1, 0, [b"x"], [1], [None], b""),
    (1, 512, ["not bytes"], [1], [None], b""),
    (1, 512, [b"x"], [1], [None], "not bytes"),
    (2, 512, [b"x"], [1], [None], b""),  # counts that do not add up
    (1, 512, [b"x"], [1], [(("inc", 2),)], b""),  # a summary of other rows
    (1, 512, [b"x"], [1], [((3, 1),)], b""),
    ([1], 512, [b"x"], [1], [None], b""),
    (1, 512, [b"x"], b""),  # the shape of an older memo
])
def test_a_packed_value_of_another_shape_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="not packed RECORD rows"):
        RecordRows.unpacked(value)


def _checked(payload: bytes) -> bytes:
    """A chunk with a valid checksum around any payload (what only a forger writes)."""
    return zlib.crc32(payload).to_bytes(4, "little") + payload


@pytest.mark.parametrize("chunk", [
    b"", b"garbage", marshal.dumps([("a", "b", "c")]),  # no checksum
    pack_chunk([("a", "b", "c")])[:-1] + b"x",  # one byte damaged
    _checked(b"\xffnot marshal"), _checked(marshal.dumps([("a", "b")])),
    _checked(marshal.dumps({"a": 1})), _checked(marshal.dumps([["a", "b", "c"]])),
])
def test_a_corrupt_chunk_is_refused_and_the_rows_are_read_again(chunk: bytes) -> None:
    with pytest.raises(ValueError, match="corrupt RECORD chunk"):
        unpack_chunk(chunk)
    assert unpack_chunk(pack_chunk(ROWS[:2])) == ROWS[:2]
    packed = (2, 512, [chunk], [2], [None], b"")
    rows = RecordRows.unpacked(packed, reread=lambda: ROWS[:2])
    assert rows.chunk_rows(0) == ROWS[:2] and rows.rows() == ROWS[:2]
    with pytest.raises(ValueError):
        RecordRows.unpacked(packed).rows()


@pytest.fixture
def env(torch_and_tiny: Venv) -> Venv:
    return torch_and_tiny


def _snapshot(env: Venv, memo_root: Path) -> Snapshot:
    return collect(SnapshotOptions(python=str(env.python), memo_root=memo_root, git=False,
                                   use_project_config=False, remember_caches=False))


def _corrupt_chunks(memo_file: Path) -> int:
    """Replace every chunk of every folder entry with garbage of the right type."""
    tag, entries = marshal.loads(memo_file.read_bytes())  # noqa: S302 - a test memo
    spoiled = 0
    for name, (key, value) in entries.items():
        if name.startswith("folder:") and value[0] is not None:  # value[0]: the packed rows
            count, size, chunks, counts, summaries, material = value[0]
            value = ((count, size, [b"garbage"] * len(chunks), counts, summaries, material),
                     *value[1:])
            entries[name] = (key, value)
            spoiled += 1
    memo_file.write_bytes(marshal.dumps((tag, entries)))
    return spoiled


@pytest.mark.usefixtures("fork_always")
@pytest.mark.parametrize("ahead", [True, False])
def test_a_memo_with_corrupt_chunks_still_checks_every_file(env: Venv, tmp_path: Path,
                                                           ahead: bool) -> None:
    memo = tmp_path / "memo"
    clean = _snapshot(env, memo)
    memo_file = RecordMemo.for_prefix_path(str(env.path), memo)
    assert _corrupt_chunks(memo_file) >= 2
    (env.site_packages() / "tiny" / "data.txt").write_text("changed, and longer\n")
    if ahead:
        statahead.start(str(env.path), memo)  # the workers meet the corrupt chunks first
    now = _snapshot(env, memo)
    assert ("tiny", "tiny/data.txt", "size") in {
        (i.package, i.path, i.problem) for i in now.integrity.issues}
    assert now.integrity.checked_files == clean.integrity.checked_files
    assert now.torch.compat_key == clean.torch.compat_key


def test_a_memo_packed_with_another_chunk_size_is_read_as_written() -> None:
    packed = RecordRows(len(ROWS), rows=ROWS, size=100).packed()
    assert packed[1] == 100 and len(packed[2]) == 11
    back = RecordRows.unpacked(packed)
    assert back.chunk_sizes() == [100] * 11 and back.chunk_rows(10) == ROWS[1000:]


def test_the_scan_marks_what_it_read_from_the_memo_the_stat_work_started_on(
        env: Venv, tmp_path: Path) -> None:
    """Every unchanged folder comes back marked ``from_memo``, with the RECORD time and
    rows stat-ahead started on; a changed one does not, and is not claimed."""
    from envguard.probe import distributions

    memo_root = tmp_path / "memo"
    _snapshot(env, memo_root)
    memo = RecordMemo.for_prefix(str(env.path), memo_root)
    early = {meta_dir: (rows, mtime) for meta_dir, rows, mtime in memo.folder_records()}
    found, _ = distributions.scan([str(env.site_packages())], memo)
    for item in found:
        meta_dir = f"{item.site_dir}/{item.dist.metadata_dir}"
        assert item.from_memo and early[meta_dir] == (item.record, item.record_mtime_ns)
    assert records.RecordMemo.TAG == ("envguard-records", 6)
    (next(env.site_packages().glob("tiny-*.dist-info")) / "REQUESTED").write_text("")
    found, _ = distributions.scan([str(env.site_packages())],
                                  RecordMemo.for_prefix(str(env.path), memo_root))
    assert {i.dist.name for i in found if not i.from_memo} == {"tiny"}


# -- dist-info folders: a distribution's fields, laid out by the model ----------------------

def _value(name: str, hint: str) -> Any:
    """A value for a field annotated ``hint`` that differs from any default."""
    from envguard.model import DirectUrl

    base = hint.removesuffix(" | None")
    if base == "str":
        return f"{name}-value"
    if base == "bool":
        return True
    if base == "int":
        return 7
    if base == "list[str]":
        return [f"{name}-1", f"{name}-2"]
    if base == "dict[str, str]":
        return {f"{name}-key": f"{name}-value"}
    if base == "DirectUrl":
        return DirectUrl(**{f.name: _value(f.name, str(f.type))
                            for f in dataclasses.fields(DirectUrl)})
    raise AssertionError(f"field {name}: {hint}: teach records.Codec and this test the type")


def _every_field_set() -> Distribution:
    from envguard.model import Distribution

    return Distribution(**{f.name: _value(f.name, str(f.type))
                           for f in dataclasses.fields(Distribution)
                           if f.name not in records.NOT_STORED},
                        location="/site", metadata_dir="every-1.0.dist-info")


def test_every_field_of_a_distribution_round_trips_through_the_memo(tmp_path: Path) -> None:
    from envguard.model import ProbeIssue

    dist = _every_field_set()
    issues = [ProbeIssue(section="packages", message="odd", path="/site/x"),
              ProbeIssue(section="packages", message="odd")]
    rows = RecordRows.of(ROWS[:3])
    key = ((1, 2, 3, 4), None, None, None, None, None)
    memo = RecordMemo(tmp_path / "records.marshal")
    memo.put_folder("/site/every-1.0.dist-info", key,
                    records.folder_entry(dist, rows, 5, 123, issues))
    assert memo.save() is None
    value = RecordMemo(tmp_path / "records.marshal").get_folder(
        "/site/every-1.0.dist-info", key)
    assert value is not None
    back, back_rows, total, mtime_ns, back_issues = records.folder_parts(
        value, "/site", "every-1.0.dist-info")
    assert back == dist and back_rows == rows and (total, mtime_ns) == (5, 123)
    assert back_issues == issues
    assert back.wheel_tags is not value[4][records.layout().dist.names.index("wheel_tags")]


def _written_for(path: Path, digest: str) -> None:
    """The memo file at ``path`` as if written when the model had other fields."""
    tag, entries = marshal.loads(path.read_bytes())  # noqa: S302 - the test's own memo
    assert tag == (*RecordMemo.TAG, records.fields_digest(), marshal.version)
    path.write_bytes(marshal.dumps(((*RecordMemo.TAG, digest, marshal.version), entries)))


def test_a_memo_written_for_other_fields_is_ignored_not_misread(env: Venv,
                                                                tmp_path: Path) -> None:
    from envguard.probe import distributions

    memo_root = tmp_path / "memo"
    _snapshot(env, memo_root)
    path = RecordMemo.for_prefix_path(str(env.path), memo_root)
    site = [str(env.site_packages())]
    fresh, _ = distributions.scan(site)
    for digest in ("0" * 12, ""):
        _written_for(path, digest)
        memo = RecordMemo(path)
        found, _ = distributions.scan(site, memo)
        assert not any(i.from_memo for i in found)  # every folder read again
        assert [i.dist for i in found] == [i.dist for i in fresh]
        assert memo.save() is None and RecordMemo(path)._fields == (records.fields_digest(),)
    _, entries = marshal.loads(path.read_bytes())  # noqa: S302 - the test's own memo
    path.write_bytes(marshal.dumps((("envguard-records", 5, marshal.version), entries)))
    assert not RecordMemo(path)._live()  # the format before this layout: ignored


def test_the_field_digest_follows_the_field_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """A field more or less in an entry, or one renamed, changes the file's tag."""
    digest = records.layout().digest
    assert records.fields_digest() == digest and len(digest) == 12
    monkeypatch.setattr(records, "NOT_STORED", (*records.NOT_STORED, "requires"))
    assert records.Layout().digest != digest
    monkeypatch.setattr(records, "NOT_STORED", ("location", "metadata_dir"))
    assert records.Layout().digest != digest


def test_an_entry_of_another_length_under_the_current_tag_is_a_miss() -> None:
    """Even a forged file with the right tag is not misread: a tuple of other fields fails
    the check, and the scan reads that folder instead."""
    value = records.folder_entry(_every_field_set(), None, 0, None, [])
    for fields in (value[4][:-1], (*value[4], "one more"), (None, *value[4][1:])):
        with pytest.raises(TypeError):
            records.folder_parts((*value[:4], fields), "/site", "every-1.0.dist-info")
