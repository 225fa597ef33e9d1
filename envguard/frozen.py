"""``@frozen``: envguard's frozen dataclasses, generated with one ``exec`` a class.

Every record of envguard (the snapshot model, lock entries, findings, changes) is a
frozen, slotted, keyword-only dataclass. ``@dataclass(frozen=True)`` compiles each
method it generates with its own ``exec`` (``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, ``__setattr__``, ``__delattr__``: six a class on Python 3.11 and 3.12,
about 1 ms a class), and the gate imports some forty such classes before every guarded
launch. ``@frozen`` lets :func:`dataclasses.dataclass` do the field processing (so
``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` keep working, and
type checkers see a dataclass through :func:`typing.dataclass_transform`), compiles
``__init__`` alone, and builds the other methods from one :func:`operator.attrgetter`
of the fields. Their behaviour is the dataclass's: equality and hash over the fields'
tuple between instances of the same class, the same ``repr``, and
:class:`dataclasses.FrozenInstanceError` on assignment. Field options other than
``default`` and ``default_factory`` are refused when the class is defined.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from inspect import formatannotation
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["frozen"]

_T = TypeVar("_T")

class _Factory:
    """The default of a parameter whose field has a ``default_factory``."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


@overload
def frozen(cls: type[_T], /) -> type[_T]: ...


@overload
def frozen(*, kw_only: bool = True, slots: bool = True) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(frozen_default=True, kw_only_default=True,
                     field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: type[_T] | None = None, /, *, kw_only: bool = True,
           slots: bool = True) -> type[_T] | Callable[[type[_T]], type[_T]]:
    """Make ``cls`` a frozen dataclass (keyword-only and slotted unless told otherwise)."""

    def wrap(klass: type[_T]) -> type[_T]:
        return _build(klass, kw_only=kw_only, slots=slots)

    return wrap if cls is None else wrap(cls)


def _build(cls: type[_T], *, kw_only: bool, slots: bool) -> type[_T]:
    for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__",
                 "__delattr__"):
        if name in cls.__dict__:
            raise TypeError(f"@frozen generates {name}; {cls.__qualname__} defines it")
    generated_doc = not cls.__dict__.get("__doc__")
    if generated_doc:
        cls.__doc__ = cls.__name__  # spares dataclass its inspect.signature()
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=False,
                                kw_only=kw_only, slots=slots)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    for f in fields:
        if not (f.init and f.repr and f.compare and f.hash is None and not f.metadata):
            raise TypeError(f"@frozen supports only default and default_factory "
                            f"(field {cls.__qualname__}.{f.name})")
    names = tuple(f.name for f in fields)
    values: Callable[[Any], tuple[Any, ...]]
    if len(names) > 1:
        values = attrgetter(*names)
    elif names:
        one = attrgetter(names[0])

        def values(obj: Any) -> tuple[Any, ...]:
            return (one(obj),)
    else:
        def values(obj: Any) -> tuple[Any, ...]:
            return ()

    init, signature = _init(cls, fields)
    if generated_doc:
        cls.__doc__ = f"{cls.__name__}({signature})"

    def __hash__(self: Any) -> int:
        return hash(values(self))

    methods: dict[str, Any] = {
        "__init__": init, "__repr__": _repr(names), "__eq__": _eq(values),
        "__hash__": __hash__,
    }
    if slots:
        def __getstate__(self: Any) -> tuple[Any, ...]:
            return values(self)

        methods["__getstate__"] = __getstate__
        methods["__setstate__"] = _setstate(names)
    for name, method in methods.items():
        method.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, method)
    cls.__setattr__ = _refuse_set  # type: ignore[method-assign]
    cls.__delattr__ = _refuse_del  # type: ignore[method-assign]
    return cls


def _init(cls: type, fields: tuple[dataclasses.Field[Any], ...]
          ) -> tuple[Callable[..., None], str]:
    """``__init__`` compiled from source, as the dataclass's: one ``exec``."""
    scope: dict[str, Any] = {"__frozen_set__": object.__setattr__,
                            "__frozen_factory__": _FACTORY}
    positional: list[tuple[str, str]] = []
    keyword: list[tuple[str, str]] = []
    body: list[str] = []
    seen_default = False
    for f in fields:
        if f.default_factory is not dataclasses.MISSING:
            scope[f"__frozen_make_{f.name}__"] = f.default_factory
            param, shown = f"{f.name}=__frozen_factory__", f"{f.name}{_note(f)} = <factory>"
            body.append(f"  if {f.name} is __frozen_factory__: "
                        f"{f.name} = __frozen_make_{f.name}__()")
        elif f.default is not dataclasses.MISSING:
            scope[f"__frozen_default_{f.name}__"] = f.default
            param = f"{f.name}=__frozen_default_{f.name}__"
            shown = f"{f.name}{_note(f)} = {f.default!r}"
        else:
            param, shown = f.name, f"{f.name}{_note(f)}"
        in_keywords = bool(f.kw_only)  # dataclass() has set every field's kw_only
        if not in_keywords:
            if param != f.name:
                seen_default = True
            elif seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
        (keyword if in_keywords else positional).append((param, shown))
        body.append(f"  __frozen_set__(__frozen_self__, {f.name!r}, {f.name})")
    star = [("*", "*")] if keyword else []
    params = [*positional, *star, *keyword]
    head = ", ".join(["__frozen_self__", *(param for param, _ in params)])
    source = f"def __init__({head}):\n" + "\n".join(body or ["  pass"]) + "\n"
    exec(compile(source, f"<@frozen {cls.__qualname__}>", "exec"), scope)  # noqa: S102 (our own source, as dataclasses does)
    init: Callable[..., None] = scope["__init__"]
    init.__annotations__ = {**{f.name: f.type for f in fields}, "return": None}
    return init, ", ".join(shown for _, shown in params)


def _note(f: dataclasses.Field[Any]) -> str:
    """``: 'str'``, as ``inspect.signature`` shows a parameter's annotation."""
    return f": {formatannotation(f.type)}"


def _repr(names: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__qualname__}({inner})"
    return __repr__


def _eq(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, object], Any]:
    def __eq__(self: Any, other: object) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented
    return __eq__


def _refuse_set(self: Any, name: str, value: object) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _refuse_del(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _setstate(names: tuple[str, ...]) -> Callable[[Any, tuple[Any, ...]], None]:
    def __setstate__(self: Any, state: tuple[Any, ...]) -> None:
        for name, value in zip(names, state, strict=True):
            object.__setattr__(self, name, value)
    return __setstate__
