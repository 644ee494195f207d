"""One codec for every control message: frozen dataclasses <-> plain data.

``to_plain(message)`` turns a dataclass into JSON-shaped values (dicts with string keys, lists,
strings, numbers, booleans, None); ``from_plain(cls, data)`` rebuilds it from the class's field
types, so no message needs a hand-written ``to_dict``/``from_dict``. Supported field types:
dataclasses, ``X | None``, unions of dataclasses with distinct field names, ``tuple[T, ...]``,
``list[T]``, ``dict[str, T]``, ``enum.Enum`` subclasses, ``Literal[...]``, the scalars ``int``,
``float``, ``str``, ``bool``, and config sections (pydantic models: their JSON dump, validated
again on decode). A value of the
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
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from core.errors import MessageError

T = TypeVar("T")

_SCALARS: tuple[type, ...] = (int, float, str, bool)
_ITEM_TYPES: dict[type, frozenset[type]] = {
    int: frozenset({int}),
    float: frozenset({int, float}),
    str: frozenset({str}),
    bool: frozenset({bool}),
}


def to_plain(value: Any) -> Any:
    """``value`` as plain data (dataclasses become dicts, tuples lists, enums their values)."""
    if value is None or type(value) in _SCALARS:  # NOTE: most leaves; skips the checks below
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: to_plain(getattr(value, name)) for name in _field_names(type(value))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
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
    try:
        kind: Any = cls
        return typing.cast(T, _decoder(kind)(data))
    except _Malformed as e:
        where = "".join(reversed(e.path))
        name = getattr(cls, "__name__", str(cls))  # a union (``A | B``) has no name
        raise MessageError(f"{name}{where}: {e.reason}") from None


Decoder = Callable[[Any], Any]


class _Malformed(Exception):
    """A value of the wrong shape; containers add their part of the path on the way out."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


@functools.cache
def _decoder(kind: Any) -> Decoder:
    """The decoder of one field type, built once per type (the hot path stays a few calls)."""
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        return _union_decoder(kind)
    if origin is typing.Literal:
        return _literal_decoder(typing.get_args(kind))
    if origin in (list, tuple):
        return _sequence_decoder(kind, origin)
    if origin is dict:
        return _dict_decoder(_decoder(typing.get_args(kind)[1]))
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass_decoder(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _enum_decoder(kind)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return _model_decoder(kind)
    if kind in _SCALARS:
        return _scalar_decoder(kind)
    raise MessageError(f"fields of type {kind!r} cannot be decoded")


def _union_decoder(kind: Any) -> Decoder:
    """``X | None``, or a union of dataclasses told apart by their field names."""
    members = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    nullable = len(members) < len(typing.get_args(kind))
    if len(members) == 1:
        inner = _decoder(members[0])
        return lambda data: None if data is None and nullable else inner(data)
    if not all(dataclasses.is_dataclass(m) for m in members):
        raise MessageError(f"only 'X | None' or unions of dataclasses can be decoded, not {kind}")
    by_fields = {frozenset(_field_types(m)): _decoder(m) for m in members}

    def decode(data: Any) -> Any:
        if data is None and nullable:
            return None
        chosen = by_fields.get(frozenset(data)) if isinstance(data, Mapping) else None
        if chosen is None:
            raise _Malformed(f"{data!r} matches no single member of {kind}")
        return chosen(data)

    return decode


def _literal_decoder(allowed: tuple[Any, ...]) -> Decoder:
    def decode(data: Any) -> Any:
        if data not in allowed:
            raise _Malformed(f"{data!r} is not one of {allowed}")
        return data

    return decode


def _sequence_decoder(kind: Any, origin: type) -> Decoder:
    args = typing.get_args(kind)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return _fixed_tuple_decoder([_decoder(a) for a in args])
    item_kind = args[0] if args else None
    if item_kind in _SCALARS:
        # NOTE: the hot path (token ids, block hashes): exact type checks, no call per item.
        allowed = _ITEM_TYPES[item_kind]
        reason = f"every item must be a {item_kind.__name__}"

        def decode_scalars(data: Any) -> Any:
            if not isinstance(data, list | tuple) or not allowed.issuperset(map(type, data)):
                raise _Malformed(reason)
            return origin(data)

        return decode_scalars
    item = _decoder(item_kind)

    def decode(data: Any) -> Any:
        if not isinstance(data, list | tuple):
            raise _Malformed(f"expected a list, got {type(data).__name__}")
        return origin(_each(item, enumerate(data), "[{}]"))

    return decode


def _fixed_tuple_decoder(items: list[Decoder]) -> Decoder:
    def decode(data: Any) -> Any:
        if not isinstance(data, list | tuple) or len(data) != len(items):
            raise _Malformed(f"expected {len(items)} items, got {data!r}")
        pairs = enumerate(zip(items, data, strict=True))
        return tuple(_at(f"[{i}]", fn, value) for i, (fn, value) in pairs)

    return decode


def _dict_decoder(value: Decoder) -> Decoder:
    def decode(data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise _Malformed(f"expected a mapping, got {type(data).__name__}")
        return dict(zip(data, _each(value, data.items(), "[{!r}]"), strict=True))

    return decode


def _dataclass_decoder(kind: type) -> Decoder:
    fields = {name: _decoder(hint) for name, hint in _field_types(kind).items()}

    def decode(data: Any) -> Any:
        if type(data) is not dict and not isinstance(data, Mapping):
            raise _Malformed(f"expected a {kind.__name__} mapping, got {type(data).__name__}")
        if not fields.keys() >= data.keys():
            unknown = sorted(map(str, data.keys() - fields.keys()))
            raise _Malformed(f"unknown field(s) {', '.join(unknown)}")
        values = {name: _at(f".{name}", fields[name], item) for name, item in data.items()}
        try:
            return kind(**values)
        except TypeError as e:  # a required field is missing
            raise _Malformed(str(e)) from e

    return decode


def _enum_decoder(kind: type[enum.Enum]) -> Decoder:
    def decode(data: Any) -> Any:
        try:
            return kind(data)
        except ValueError as e:
            raise _Malformed(f"{data!r} is not a {kind.__name__}") from e

    return decode


def _model_decoder(kind: type[BaseModel]) -> Decoder:
    def decode(data: Any) -> Any:
        try:
            return kind.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise _Malformed(f"{kind.__name__} {where}: {first['msg']}") from e

    return decode


def _scalar_decoder(kind: type) -> Decoder:
    allowed = _ITEM_TYPES[kind]

    def decode(data: Any) -> Any:
        if type(data) not in allowed:
            raise _Malformed(f"expected {kind.__name__}, got {data!r}")
        return float(data) if kind is float else data

    return decode


def _at(part: str, decode: Decoder, data: Any) -> Any:
    try:
        return decode(data)
    except _Malformed as e:
        e.path.append(part)
        raise


def _each(decode: Decoder, items: Iterable[tuple[Any, Any]], part: str) -> list[Any]:
    return [_at(part.format(key), decode, value) for key, value in items]


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)
