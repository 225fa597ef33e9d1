"""``@frozen`` behaves as ``@dataclass(frozen=True, kw_only=True, slots=True)``.

Each test defines one class twice, once with each decorator, and compares what a caller
can see: construction and its errors, ``repr``, equality, hash, assignment, the
``dataclasses`` functions, ``inspect.signature``, pickling and copying.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envguard.frozen import frozen


def _pair(kw_only: bool = True, slots: bool = True) -> tuple[type[Any], type[Any]]:
    def body() -> dict[str, Any]:
        return {
            "__annotations__": {"name": "str", "version": "str | None",
                                "tags": "tuple[str, ...]", "count": "int"},
            "version": None,
            "tags": field(default_factory=tuple),
            "count": 0,
            "__module__": __name__,
            "__qualname__": "Dist",
        }
    ours = frozen(kw_only=kw_only, slots=slots)(type("Dist", (), body()))
    theirs = dataclass(frozen=True, kw_only=kw_only, slots=slots)(type("Dist", (), body()))
    return ours, theirs


_values = st.fixed_dictionaries(
    {"name": st.text(max_size=5)},
    optional={"version": st.none() | st.text(max_size=3),
              "tags": st.tuples(st.text(max_size=2)) | st.just(()),
              "count": st.integers(-3, 3)})


@given(a=_values, b=_values)
def test_repr_eq_hash_match_dataclass(a: dict[str, Any], b: dict[str, Any]) -> None:
    ours, theirs = _pair()
    oa, ob, ta, tb = ours(**a), ours(**b), theirs(**a), theirs(**b)
    assert repr(oa) == repr(ta)
    assert (oa == ob) == (ta == tb)
    assert (oa != ob) == (ta != tb)
    assert dataclasses.asdict(oa) == dataclasses.asdict(ta)
    assert hash(oa) == hash(ta)  # the hash of the fields' tuple, as the dataclass's
    if oa == ob:
        assert hash(oa) == hash(ob)


def test_hash_of_unhashable_field_raises_as_dataclass() -> None:
    ours, theirs = _pair()
    for cls in (ours, theirs):
        with pytest.raises(TypeError, match="unhashable"):
            hash(cls(name="x", tags=["a"]))


def test_other_class_is_not_equal() -> None:
    ours, theirs = _pair()
    assert ours(name="x") != theirs(name="x")
    assert ours(name="x").__eq__(object()) is NotImplemented


def test_construction_errors_match_dataclass() -> None:
    ours, theirs = _pair()
    for cls in (ours, theirs):
        with pytest.raises(TypeError, match="required keyword-only argument: 'name'"):
            cls()
        with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
            cls(name="x", nope=1)
        with pytest.raises(TypeError, match="positional argument"):
            cls("x")


def test_default_factory_gives_each_instance_its_own() -> None:
    @frozen
    class Holder:
        items: list[int] = field(default_factory=list)

    one, two = Holder(), Holder()
    assert one.items == [] and one.items is not two.items


def test_assignment_and_deletion_raise_frozen_instance_error() -> None:
    ours, _ = _pair()
    obj = ours(name="x")
    with pytest.raises(dataclasses.FrozenInstanceError, match="'name'"):
        obj.name = "y"
    with pytest.raises(dataclasses.FrozenInstanceError, match="'name'"):
        del obj.name
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
        obj.other = 1
    assert obj.name == "x"


def test_dataclasses_functions_work() -> None:
    ours, _ = _pair()
    obj = ours(name="x", count=2)
    assert dataclasses.is_dataclass(obj) and dataclasses.is_dataclass(ours)
    assert [f.name for f in dataclasses.fields(obj)] == ["name", "version", "tags", "count"]
    changed = dataclasses.replace(obj, version="1")
    assert changed == ours(name="x", version="1", count=2) and obj.version is None
    assert not hasattr(obj, "__dict__")


def test_signature_and_doc_match_dataclass() -> None:
    ours, theirs = _pair()
    assert str(inspect.signature(ours)) == str(inspect.signature(theirs))
    assert ours.__doc__ == theirs.__doc__
    assert ours.__init__.__qualname__ == "Dist.__init__"


@pytest.mark.parametrize("slots", [True, False])
def test_pickle_and_copy_round_trip(slots: bool) -> None:
    ours, _ = _pair(slots=slots)
    globals()["Dist"] = ours  # pickle finds the class by module and name
    try:
        obj = ours(name="x", tags=["a"], count=3)
        for clone in (pickle.loads(pickle.dumps(obj)),  # noqa: S301 (our own bytes)
                      copy.copy(obj), copy.deepcopy(obj)):
            assert clone == obj and clone is not obj
    finally:
        del globals()["Dist"]


def test_positional_variant() -> None:
    ours, theirs = _pair(kw_only=False)
    assert ours("x", "1") == ours(name="x", version="1")
    assert repr(ours("x", "1")) == repr(theirs("x", "1"))
    assert str(inspect.signature(ours)) == str(inspect.signature(theirs))


def test_non_default_after_default_is_refused() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default"):
        @frozen(kw_only=False)
        class Bad:
            a: int = 0
            b: int


def test_unsupported_field_options_are_refused() -> None:
    with pytest.raises(TypeError, match="only default and default_factory"):
        @frozen
        class Bad:
            a: int = field(default=0, compare=False)


def test_a_method_it_generates_cannot_be_defined() -> None:
    with pytest.raises(TypeError, match="generates __eq__"):
        @frozen
        class Bad:
            a: int

            def __eq__(self, other: object) -> bool:
                return True


def test_field_named_like_the_generated_parameters() -> None:
    """Field names are the ``__init__``'s parameter names; none collides with its own."""

    @frozen
    class Odd:
        self: int
        _set: int = 1
        _FACTORY: list[int] = field(default_factory=list)

    obj = Odd(self=3, _set=2)
    assert (obj.self, obj._set, obj._FACTORY) == (3, 2, [])
