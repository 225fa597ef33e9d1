"""Typed construction of frozen dataclasses from JSON data, naming the failing field.

``build(Snapshot, data)`` checks every field against its type hint (str, int, float,
bool, None, list[X], dict[str, X], nested dataclasses, unions) and raises
:class:`SnapshotValidationError` with a dotted path such as ``packages[3].version``.
Unknown keys are ignored, so a newer minor schema still loads.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from typing import Any, TypeVar, Union

from envguard.errors import SnapshotValidationError

_T = TypeVar("_T")


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


@functools.cache
def _spec(cls: Any) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) of every field; resolving hints once per class is what
    keeps loading a 300-package snapshot in a few milliseconds."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (f.name, hints[f.name],
         f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    )


def build(cls: type[_T], data: object, context: str = "") -> _T:
    if not isinstance(data, dict):
        raise SnapshotValidationError(
            f"expected an object, got {type_name(data)}", context=context
        )
    kwargs: dict[str, Any] = {}
    for name, tp, required in _spec(typing.cast(Any, cls)):
        if name not in data:
            if required:
                where = f"{context}.{name}" if context else name
                raise SnapshotValidationError("missing required field", context=where)
            continue
        kwargs[name] = _convert(tp, data[name], f"{context}.{name}" if context else name)
    # Unknown keys are ignored: a newer minor schema may add fields.
    return cls(**kwargs)


def _convert(tp: Any, value: object, context: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors: list[SnapshotValidationError] = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, context)
            except SnapshotValidationError as exc:
                errors.append(exc)
        if len(errors) == 1 and errors[0].context != context:
            raise errors[0]  # the failure is nested inside the one possible type
        names = " or ".join(_hint_name(o) for o in options)
        raise SnapshotValidationError(
            f"expected {names}, got {type_name(value)}", context=context
        )
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise SnapshotValidationError(
                f"expected a list, got {type_name(value)}", context=context
            )
        return [_convert(item_tp, item, f"{context}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        _key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise SnapshotValidationError(
                f"expected an object, got {type_name(value)}", context=context
            )
        return {str(k): _convert(val_tp, v, f"{context}[{k!r}]") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return build(tp, value, context)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp in (str, bool):
        if type(value) is tp:
            return value
    else:  # pragma: no cover - a schema type this converter does not know
        raise TypeError(f"unsupported schema type {tp!r}")
    raise SnapshotValidationError(
        f"expected {_hint_name(tp)}, got {type_name(value)}", context=context
    )


def _hint_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The field names of dataclass ``cls``, in order; cached, as the walkers here and in
    :mod:`envguard.redact` ask once per value."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def to_plain(value: Any) -> Any:
    """The reverse of :func:`build`: dataclasses as dicts, tuples as lists, the rest as is
    (the snapshot's values are JSON types already, so nothing is copied: ``asdict``
    deep-copies every leaf, and the gate serialises each snapshot it records)."""
    cls = type(value)
    names = _FIELD_NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = field_names(cls)
    if names is not None:
        return {name: to_plain(getattr(value, name)) for name in names}
    if cls is list or cls is tuple:
        return [to_plain(v) for v in value]
    if cls is dict:
        return {k: to_plain(v) for k, v in value.items()}
    return value


def parse_json(text: str) -> object:
    """``json.loads``; SnapshotValidationError with a one-line reason if it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SnapshotValidationError(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except ValueError as exc:  # an integer longer than int() converts (4300 digits)
        raise SnapshotValidationError(
            f"not valid JSON ({str(exc).split(':', 1)[0]})"
        ) from None
