"""One codec for every control message: frozen dataclasses <-> plain data.

``to_plain(message)`` turns a dataclass into JSON-shaped values (dicts with string keys, lists,
strings, numbers, booleans, None); ``from_plain(cls, data)`` rebuilds it from the class's field
types, so no message needs a hand-written ``to_dict``/``from_dict``. Supported field types:
dataclasses, ``X | None``, unions of dataclasses with distinct field names, ``tuple[T, ...]``,
``list[T]``, ``dict[str, T]``, ``enum.Enum`` subclasses, ``Literal[...]`` and the scalars
``int``, ``float``, ``str``, ``bool``. A value of the
wrong shape raises :class:`~core.errors.MessageError` naming the field path — a message from a
peer of another version fails loudly, never half-decoded. Rebuilding runs each class's own
``__post_init__``, so a decoded ``SamplingParams`` is validated like a constructed one.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from core.errors import MessageError

T = TypeVar("T")

_SCALARS: tuple[type, ...] = (int, float, str, bool)


def to_plain(value: Any) -> Any:
    """``value`` as plain data (dataclasses become dicts, tuples lists, enums their values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: to_plain(getattr(value, name)) for name in _field_names(type(value))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        # NOTE: token-id lists are long; a list of scalars is copied in one go.
        if not value or type(value[0]) in _SCALARS:
            return list(value)
        return [to_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: to_plain(item) for key, item in value.items()}
    return value


def from_plain(cls: type[T], data: Any) -> T:
    """Rebuild a ``cls`` dataclass from :func:`to_plain` output."""
    return typing.cast(T, _decode(cls, data, cls.__name__))


def _decode(kind: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        return _decode_union(kind, data, path)
    if origin is typing.Literal:
        if data not in typing.get_args(kind):
            raise MessageError(f"{path}: {data!r} is not one of {typing.get_args(kind)}")
        return data
    if origin in (list, tuple):
        return _decode_sequence(kind, origin, data, path)
    if origin is dict:
        _, value_kind = typing.get_args(kind)
        if not isinstance(data, Mapping):
            raise MessageError(f"{path}: expected a mapping, got {type(data).__name__}")
        return {key: _decode(value_kind, item, f"{path}[{key!r}]") for key, item in data.items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _decode_dataclass(kind, data, path)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(data)
        except ValueError as e:
            raise MessageError(f"{path}: {data!r} is not a {kind.__name__}") from e
    return _decode_scalar(kind, data, path)


def _decode_union(kind: Any, data: Any, path: str) -> Any:
    """``X | None``, or a union of dataclasses told apart by their field names."""
    members = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    if data is None and len(members) < len(typing.get_args(kind)):
        return None
    if len(members) == 1:
        return _decode(members[0], data, path)
    if not all(dataclasses.is_dataclass(m) for m in members) or not isinstance(data, Mapping):
        raise MessageError(f"{path}: cannot decode {data!r} as {kind}")
    matches = [m for m in members if set(_field_types(m)) == set(data)]
    if len(matches) != 1:
        raise MessageError(f"{path}: fields {sorted(data)} match no single member of {kind}")
    return _decode_dataclass(matches[0], data, path)


def _decode_sequence(kind: Any, origin: type, data: Any, path: str) -> Any:
    if not isinstance(data, list | tuple):
        raise MessageError(f"{path}: expected a list, got {type(data).__name__}")
    args = typing.get_args(kind)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(args) != len(data):
            raise MessageError(f"{path}: expected {len(args)} items, got {len(data)}")
        pairs = enumerate(zip(args, data, strict=True))
        return tuple(_decode(a, item, f"{path}[{i}]") for i, (a, item) in pairs)
    item_kind = args[0] if args else Any
    if item_kind in _SCALARS:
        if not all(_is_scalar(item_kind, item) for item in data):
            raise MessageError(f"{path}: every item must be a {item_kind.__name__}")
        items = data
    else:
        items = [_decode(item_kind, item, f"{path}[{i}]") for i, item in enumerate(data)]
    return origin(items)


def _decode_dataclass(kind: type, data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise MessageError(f"{path}: expected a {kind.__name__} mapping, got {type(data).__name__}")
    hints = _field_types(kind)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise MessageError(f"{path}: unknown field(s) {', '.join(map(str, unknown))}")
    values = {name: _decode(hints[name], item, f"{path}.{name}") for name, item in data.items()}
    try:
        return kind(**values)
    except TypeError as e:  # a required field is missing
        raise MessageError(f"{path}: {e}") from e


def _decode_scalar(kind: Any, data: Any, path: str) -> Any:
    if kind is Any or kind is object:
        raise MessageError(f"{path}: untyped fields cannot be decoded")
    if not _is_scalar(kind, data):
        raise MessageError(f"{path}: expected {getattr(kind, '__name__', kind)}, got {data!r}")
    return float(data) if kind is float else data


def _is_scalar(kind: type, value: Any) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)
