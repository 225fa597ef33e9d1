"""The snapshot document: round trip, deterministic JSON, validation with context paths."""

from __future__ import annotations

import json

import pytest

from envguard.errors import SnapshotValidationError, UnsupportedSchemaError
from envguard.model import SCHEMA, Snapshot, check_schema
from envguard.probe import SnapshotOptions, collect


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    return collect(SnapshotOptions(use_project_config=False))


def test_round_trip_is_identity(snapshot: Snapshot) -> None:
    again = Snapshot.from_json(snapshot.to_json())
    assert again == snapshot
    assert again.to_json() == snapshot.to_json()
    assert snapshot.validate() == snapshot


def test_json_is_deterministic_and_sorted(snapshot: Snapshot) -> None:
    text = snapshot.to_json()
    data = json.loads(text)
    assert data["schema"] == SCHEMA == "envguard.snapshot/1"
    assert list(data) == sorted(data)
    assert json.dumps(data, sort_keys=True, indent=2) + "\n" == text
    names = [p["name"] for p in data["packages"]]
    assert names == sorted(names)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["packages"][0].__setitem__("version", 12),
         "expected str or null, got int in 'packages[0].version'"),
        (lambda d: d["interpreter"].pop("executable"),
         "missing required field in 'interpreter.executable'"),
        (lambda d: d.__setitem__("packages", {}), "expected a list, got dict in 'packages'"),
        (lambda d: d["integrity"].__setitem__("checked_files", True),
         "expected int, got bool in 'integrity.checked_files'"),
        (lambda d: d["environment"]["variables"].__setitem__("PATH", "x"),
         "expected an object, got str in 'environment.variables['PATH']'"),
    ],
)
def test_validation_names_the_field(snapshot: Snapshot, mutate: object, message: str) -> None:
    data = json.loads(snapshot.to_json())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(SnapshotValidationError) as info:
        Snapshot.from_dict(data)
    assert str(info.value) == message


@pytest.mark.parametrize("schema", ["envguard.snapshot/2", "envguard.snapshot/10.1"])
def test_future_major_schema_is_refused(schema: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match="newer than this envguard"):
        check_schema(schema)


def test_newer_minor_schema_with_unknown_fields_is_read(snapshot: Snapshot) -> None:
    data = json.loads(snapshot.to_json())
    data["schema"] = "envguard.snapshot/1.7"
    data["a_future_section"] = {"x": 1}
    data["torch"]["a_future_field"] = [1, 2]
    assert Snapshot.from_dict(data).packages == snapshot.packages


@pytest.mark.parametrize(
    "text", ["", "{", "[1, 2]", '"just a string"', '{"schema": "pip.freeze/1"}', "{\"a\": 1}"]
)
def test_malformed_documents_are_one_line_errors(text: str) -> None:
    with pytest.raises(SnapshotValidationError) as info:
        Snapshot.from_json(text)
    assert "\n" not in str(info.value)
