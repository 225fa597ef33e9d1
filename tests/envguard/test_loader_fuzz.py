"""Hostile snapshot files: whatever the bytes, loading gives a Snapshot or an EnvguardError.

Hypothesis feeds ``read_snapshot`` random bytes, random JSON and single mutations of the
real H200 snapshot; snapshots that still load must diff and explain without exceptions.
The real CLI is run once per kind of bad input: exit 2, one line on stderr, no traceback.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envguard.changes import diff
from envguard.errors import EnvguardError, InputError, UnsupportedSchemaError
from envguard.exitcodes import ExitCode
from envguard.explain import explain
from envguard.model import Snapshot
from envguard.snapshot_file import read_snapshot
from tests.incident import DATA, real_h200

REAL = DATA / "h200-snapshot.json"


def fuzz(examples: int) -> settings:
    """No deadline (file I/O), and no example database left behind in the checkout."""
    return settings(max_examples=examples, deadline=None, database=None)

Json = Any

json_scalars = (st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                | st.floats(allow_nan=True, allow_infinity=True))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


@functools.cache
def original() -> Snapshot:
    return real_h200()


@functools.cache
def original_text() -> str:
    return json.dumps(original().to_dict())


def fresh_doc() -> dict[str, Json]:
    """A private copy of the real snapshot's dict form."""
    doc: dict[str, Json] = json.loads(original_text())
    return doc


def load(path: Path) -> Snapshot | None:
    """read_snapshot, with every EnvguardError (and only those) turned into None."""
    try:
        return read_snapshot(path)
    except EnvguardError as exc:
        assert isinstance(exc, (InputError, UnsupportedSchemaError))
        message = str(exc)
        assert message.startswith(f"{path}: ")
        assert "\n" not in message
        return None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "snapshot.json"


# --- (a) arbitrary bytes ------------------------------------------------------------------


@fuzz(150)
@given(raw=st.binary(max_size=300)
       | st.builds(lambda head, tail: head + tail,
                   st.sampled_from([b"{", b'{"schema": "envguard.snapshot/1"', b"\xef\xbb\xbf{",
                                    b"[", b'"', b"1e99999", b"9" * 5000]),
                   st.binary(max_size=50)))
def test_arbitrary_bytes(scratch: Path, raw: bytes) -> None:
    scratch.write_bytes(raw)
    load(scratch)


def test_truncations_of_the_real_file(scratch: Path) -> None:
    raw = REAL.read_bytes()
    for end in range(0, len(raw), max(1, len(raw) // 97)):
        scratch.write_bytes(raw[:end])
        assert load(scratch) is None


# --- (b) arbitrary JSON -------------------------------------------------------------------


@fuzz(100)
@given(value=json_values
       | st.dictionaries(st.sampled_from(["schema", "packages", "torch", "caches", "x"]),
                         json_values, min_size=1).map(
                             lambda d: {**d, "schema": "envguard.snapshot/1"}))
def test_arbitrary_json(scratch: Path, value: Json) -> None:
    scratch.write_text(json.dumps(value))
    assert load(scratch) is None  # no random document is a whole snapshot


def test_deeply_nested_json(scratch: Path) -> None:
    scratch.write_text("[" * 100_000 + "]" * 100_000)
    assert load(scratch) is None
    scratch.write_text('{"schema": "envguard.snapshot/1", "torch": ' + "[" * 100_000
                       + "]" * 100_000 + "}")
    assert load(scratch) is None


def test_huge_integer_is_an_input_error(scratch: Path) -> None:
    doc = fresh_doc()
    scratch.write_text(json.dumps(doc).replace('"duration_s": ', '"duration_s": ' + "9" * 5000
                                               + ", \"was\": ", 1))
    with pytest.raises(InputError, match="not valid JSON"):
        read_snapshot(scratch)


# --- (c) one mutation of a real snapshot --------------------------------------------------


def same_type_value(original_value: Json) -> st.SearchStrategy[Json]:
    """A value that often passes validation, so that diff and explain get exercised."""
    if isinstance(original_value, bool):
        return st.booleans()
    if isinstance(original_value, int):
        return st.integers() | st.sampled_from([0, -1, 2**63])
    if isinstance(original_value, float):
        return st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(original_value, str):
        return st.text(max_size=20) | st.sampled_from(
            ["", "none", "mixed", "2.11.0", "2.11.0+cu128", "1!2.0rc1.post3.dev4+local.7",
             "not a version", "/tmp/", "/dev/shm/x", "tmpfs", "sha256:", "<masked>"])
    if isinstance(original_value, list):
        return st.lists(st.text(max_size=8), max_size=3) | st.just(original_value[:1])
    return json_values


INTERESTING = ("packages", "torch", "caches", "environment", "files", "system", "integrity",
               "interpreter")


@st.composite
def mutations(draw: st.DrawFn) -> tuple[list[str | int], dict[str, Json]]:
    doc = fresh_doc()
    node: Json = doc
    path: list[str | int] = []
    while True:
        keys: list[str | int] = sorted(node) if isinstance(node, dict) else list(range(len(node)))
        if node is doc:  # favour the sections that rules read
            keys += [k for k in INTERESTING if k in doc] * 2
        key = draw(st.sampled_from(keys))
        path.append(key)
        child = node[key]
        if isinstance(child, (dict, list)) and child and draw(st.booleans()):
            node = child
            continue
        action = draw(st.sampled_from(["delete", "replace", "same-type", "same-type"]))
        if action == "delete":
            del node[key]
        elif action == "replace":
            node[key] = draw(json_values)
        else:
            node[key] = draw(same_type_value(child))
        return path, doc


@fuzz(120)
@given(mutation=mutations())
def test_mutated_real_snapshot(scratch: Path, mutation: tuple[list[str | int],
                                                               dict[str, Json]]) -> None:
    _path, doc = mutation
    scratch.write_text(json.dumps(doc))
    mutated = load(scratch)
    if mutated is None:
        return
    base = original()
    for old, new in ((base, mutated), (mutated, base)):
        changes = diff(old, new)
        explain(old, new, changes)
        explain(old, new, changes, symptom="undefined symbol: NCCL WARN torch")
    assert diff(mutated, mutated).changes == ()
    text = mutated.to_json()
    assert Snapshot.from_json(text).to_json() == text


@pytest.mark.parametrize("name", ["numpy", "nvidia-nccl-cu13", "torch", "triton"])
def test_package_that_lost_its_version_still_explains(name: str) -> None:
    """A nullable field at its edge: a distribution whose METADATA has no version."""
    base = original()
    doc = fresh_doc()
    for dist in doc["packages"]:
        if dist["name"] == name:
            dist["version"] = None
    broken = Snapshot.from_dict(doc)
    for old, new in ((base, broken), (broken, base)):
        assert not diff(old, new).equivalent
        rules = [f.rule for f in explain(old, new)]
        if name not in ("torch", "triton"):  # those two are judged by the torch section
            assert rules == ["package-version-changed"]


# --- (d) schema strings -------------------------------------------------------------------


def with_schema(scratch: Path, schema: Json) -> Path:
    doc = fresh_doc()
    doc["schema"] = schema
    scratch.write_text(json.dumps(doc))
    return scratch


@pytest.mark.parametrize("schema", ["envguard.snapshot/2", "envguard.snapshot/2.0",
                                    "envguard.snapshot/10", "envguard.snapshot/" + "9" * 5000])
def test_future_major_schema_is_unsupported(scratch: Path, schema: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match="upgrade envguard"):
        read_snapshot(with_schema(scratch, schema))


@pytest.mark.parametrize("schema", ["envguard.snapshot/1", "envguard.snapshot/1.0",
                                    "envguard.snapshot/1.9", "envguard.snapshot/1.12",
                                    "envguard.snapshot/01"])
def test_same_major_schema_is_read(scratch: Path, schema: str) -> None:
    assert read_snapshot(with_schema(scratch, schema)).packages == original().packages


@pytest.mark.parametrize("schema", [None, 1, 1.0, ["envguard.snapshot/1"], "", "envguard",
                                    "envguard.snapshot/0", "envguard.snapshot/1.x",
                                    "envguard.snapshot/1\n", "envguard.snapshot/\u0661",
                                    "pip.inspect/1", " envguard.snapshot/1"])
def test_bad_schema_is_an_input_error(scratch: Path, schema: Json) -> None:
    with pytest.raises(InputError) as info:
        read_snapshot(with_schema(scratch, schema))
    assert not isinstance(info.value, UnsupportedSchemaError)


@fuzz(100)
@given(schema=st.from_regex(r"\Aenvguard\.snapshot/[0-9]{1,12}(\.[0-9]{1,12})?\Z")
       | st.text(max_size=30).map(lambda t: "envguard.snapshot/" + t))
def test_schema_strings(scratch: Path, schema: str) -> None:
    try:
        read_snapshot(with_schema(scratch, schema))
    except UnsupportedSchemaError:
        major = schema.split("/", 1)[1].split(".")[0]
        assert major.isascii() and int(major) > 1
    except InputError:
        pass
    else:
        assert int(schema.split("/", 1)[1].split(".")[0]) == 1


# --- the real CLI -------------------------------------------------------------------------


def _write(kind: str, folder: Path) -> Path:
    path = folder / f"bad-{kind}.json"
    if kind == "not-json":
        path.write_text("torch==2.11.0+cu128\nnumpy==2.5.2\n")
    elif kind == "truncated":
        raw = REAL.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
    elif kind == "pip-inspect":
        path.write_text(json.dumps({"version": "1", "pip_version": "24", "installed": []}))
    elif kind == "future-schema":
        doc = fresh_doc()
        doc["schema"] = "envguard.snapshot/2"
        path.write_text(json.dumps(doc))
    elif kind == "folder":
        path.mkdir()
    elif kind == "empty":
        path.write_text("")
    elif kind == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    elif kind != "missing":
        raise AssertionError(kind)
    return path


@pytest.mark.parametrize("position", ["old", "new"])
@pytest.mark.parametrize("kind", ["not-json", "truncated", "pip-inspect", "future-schema",
                                  "folder", "missing", "empty", "binary"])
def test_cli_rejects_bad_input_in_one_line(tmp_path: Path, kind: str, position: str) -> None:
    bad = _write(kind, tmp_path)
    args = [str(REAL), str(bad)] if position == "new" else [str(bad), str(REAL)]
    env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_DEBUG"}
    proc = subprocess.run([sys.executable, "-m", "envguard", "diff", *args],
                          capture_output=True, text=True, timeout=60, check=False, env=env,
                          cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert int(ExitCode.USAGE) == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(bad) in lines[0]
    assert "Traceback" not in proc.stderr
    assert "internal error" not in proc.stderr
