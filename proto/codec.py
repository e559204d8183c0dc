"""msgpack codec (ormsgpack) with typed decoding and out-of-band array frames.

Wire layout of one message: frame 0 is msgpack; a numpy array (or a CPU torch tensor)
of at least `inline_threshold` bytes is replaced in it by an extension that names a later
frame, and its memory goes out as that frame without a copy. Smaller arrays travel inline.
Decoding rebuilds the target type's dataclasses, enums and containers from the msgpack
maps; out-of-band arrays come back as read-only views of the received frames.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import ormsgpack

T = TypeVar("T")
Buffer = bytes | bytearray | memoryview

INLINE_ARRAY_EXT = 1
OOB_ARRAY_EXT = 2
DEFAULT_INLINE_THRESHOLD = 256


def _as_ndarray(obj: Any) -> np.ndarray | None:
    if isinstance(obj, np.ndarray):
        return obj
    # NOTE: duck-typed so that proto never imports torch.
    if type(obj).__name__ == "Tensor" and hasattr(obj, "numpy"):
        array: np.ndarray = obj.detach().cpu().numpy()
        return array
    return None


class MsgpackEncoder:
    """Encodes messages into frames; big arrays become extra frames, not copies."""

    def __init__(self, inline_threshold: int = DEFAULT_INLINE_THRESHOLD) -> None:
        self.inline_threshold = inline_threshold
        self._aux_buffers: list[Buffer] = []

    def encode(self, obj: Any) -> list[Buffer]:
        return self.encode_into(obj, bytearray())

    def encode_into(self, obj: Any, buf: bytearray) -> list[Buffer]:
        """Encodes `obj` into the caller's reusable `buf`; returns `[buf, *aux_frames]`."""
        aux: list[Buffer] = [buf]
        self._aux_buffers = aux
        try:
            packed = ormsgpack.packb(obj, default=self._default)
            buf[:] = packed
            return aux
        finally:
            self._aux_buffers = []

    def _default(self, obj: Any) -> Any:
        arr = _as_ndarray(obj)
        if arr is None:
            raise TypeError(f"cannot encode {type(obj).__name__} on the wire")
        if arr.dtype.hasobject:
            raise TypeError("object arrays cannot be encoded on the wire")
        arr = np.ascontiguousarray(arr)
        header = (arr.dtype.str, list(arr.shape))
        if arr.nbytes < self.inline_threshold:
            return ormsgpack.Ext(INLINE_ARRAY_EXT, ormsgpack.packb((*header, arr.tobytes())))
        index = len(self._aux_buffers)
        self._aux_buffers.append(arr.data.cast("B"))
        return ormsgpack.Ext(OOB_ARRAY_EXT, ormsgpack.packb((*header, index)))


class MsgpackDecoder(Generic[T]):
    """Decodes frames into one fixed message type (one decoder per socket and type)."""

    def __init__(self, target: type[T] | Any) -> None:
        self.target = target
        self._convert = _converter(target)

    def decode(self, frames: Buffer | Sequence[Any]) -> T:
        if isinstance(frames, (bytes, bytearray, memoryview)):
            frames = [frames]
        buffers = [_buffer_of(f) for f in frames]

        def ext_hook(code: int, data: bytes) -> np.ndarray:
            dtype, shape, payload = ormsgpack.unpackb(data)
            if code == INLINE_ARRAY_EXT:
                return np.frombuffer(payload, dtype=dtype).reshape(shape)
            if code == OOB_ARRAY_EXT:
                return np.frombuffer(buffers[payload], dtype=dtype).reshape(shape)
            raise ValueError(f"unknown msgpack extension {code}")

        raw = ormsgpack.unpackb(buffers[0], ext_hook=ext_hook)
        return self.convert(raw)

    def convert(self, raw: Any) -> T:
        """A target rebuilt from data msgpack already decoded: a utility call's result, which
        travels in an untyped field (`UtilityResult.result`)."""
        message: T = self._convert(raw)
        return message


def _buffer_of(frame: Any) -> Buffer:
    # zmq.Frame (received with copy=False) exposes its memory as `.buffer`.
    buffer: Buffer | None = getattr(frame, "buffer", None)
    if buffer is None:
        buffer = frame
    return buffer


def _identity(value: Any) -> Any:
    return value


_PLAIN = (int, float, str, bytes, bool, type(None), np.ndarray)


def _converter(tp: Any) -> Callable[[Any], Any]:
    """Builds a function turning decoded msgpack data into an instance of `tp`; data of another
    shape is a TypeError (a peer's garbage never reaches the code that trusts the type)."""
    if tp is Any:
        return _identity
    if tp in _PLAIN:
        return _checker((tp,))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass_converter(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _union_converter(tp, args)
    if origin in (list, tuple, Sequence) or origin is typing.Sequence:
        return _sequence_converter(origin, args)
    if origin is dict:
        inner = _converter(args[1]) if len(args) > 1 else _identity
        if inner is _identity:
            return _checker((dict,))
        return lambda v: {k: inner(x) for k, x in _checker((dict,))(v).items()}
    raise TypeError(f"no wire conversion for {tp!r}")


def _union_converter(tp: Any, args: tuple[Any, ...]) -> Callable[[Any], Any]:
    members = [a for a in args if a is not type(None)]
    if Any in members:
        return _identity
    if all(a in _PLAIN for a in members):
        return _checker(tuple(members) + ((type(None),) if len(members) < len(args) else ()))
    if len(members) != 1:
        raise TypeError(f"ambiguous union on the wire: {tp}")
    inner = _converter(members[0])
    return lambda v: None if v is None else inner(v)


def _sequence_converter(origin: Any, args: tuple[Any, ...]) -> Callable[[Any], Any]:
    """Lists, homogeneous tuples (`tuple[int, ...]`) and fixed ones (`tuple[int, float]`): msgpack
    arrays all."""
    if origin is tuple and len(args) > 1 and args[1] is not Ellipsis:
        items = [_converter(a) for a in args]

        def convert_items(v: Any) -> tuple[Any, ...]:
            if not isinstance(v, list) or len(v) != len(items):
                raise TypeError(f"expected {len(items)} items on the wire")
            return tuple(convert(x) for convert, x in zip(items, v, strict=True))

        return convert_items
    element = args[0] if args else Any
    is_list = _checker((list,))
    if element is Any:
        return is_list if origin is not tuple else lambda v: tuple(is_list(v))
    if element in _PLAIN:
        return _list_checker(element, as_tuple=origin is tuple)
    inner = _converter(element)
    return lambda v: [inner(x) for x in is_list(v)]


def _checker(allowed: tuple[type, ...]) -> Callable[[Any], Any]:
    """The value itself where it is one of `allowed` (an int passes for a float), else a TypeError."""
    if float in allowed:
        allowed = (*allowed, int)

    def check(value: Any) -> Any:
        if not isinstance(value, allowed):
            raise TypeError(f"expected {' or '.join(t.__name__ for t in allowed)} on the wire, got {type(value).__name__}")
        return value

    check.allowed = allowed  # type: ignore[attr-defined]  # NOTE: dataclass converters inline the check
    return check


def _list_checker(element: type, as_tuple: bool) -> Callable[[Any], Any]:
    """A list (a tuple where asked) whose every item is an `element`, else a TypeError."""
    allowed: tuple[type, ...] = (element, int) if element is float else (element,)

    def check(value: Any) -> Any:
        if type(value) is not list:
            raise TypeError(f"expected a list of {element.__name__} on the wire")
        for item in value:
            if not isinstance(item, allowed):
                raise TypeError(f"expected a list of {element.__name__} on the wire")
        return tuple(value) if as_tuple else value

    return check


def _dataclass_converter(cls: type) -> Callable[[Any], Any]:
    """A function built for `cls` (as attrs and msgspec build theirs): one `get` per field, a
    conversion only for present, non-None values of fields that need one, then one call."""
    hints = typing.get_type_hints(cls)
    namespace: dict[str, Any] = {"cls": cls, "MISSING": dataclasses.MISSING}
    lines = [
        "def convert(value):",
        "    if type(value) is not dict:",
        f"        raise TypeError('expected a map for {cls.__name__} on the wire')",
        "    get = value.get",
    ]
    arguments: list[str] = []
    keywords: list[str] = []
    # NOTE: unknown keys are ignored and missing ones take defaults: peers may differ by a
    # field within one protocol version. A missing field without a default is a KeyError.
    for index, f in enumerate(field for field in dataclasses.fields(cls) if field.init):
        name, conv = f"v{index}", _converter(_without_none(hints[f.name]))
        namespace[f"conv{index}"], namespace[f"default{index}"] = conv, f.default
        namespace[f"factory{index}"] = f.default_factory
        if f.default is not dataclasses.MISSING:
            missing = f"default{index}"
        elif f.default_factory is not dataclasses.MISSING:
            missing = f"factory{index}()"
        else:
            missing = None
        if conv is _identity and missing is None:
            lines.append(f"    {name} = value[{f.name!r}]")
        elif conv is _identity and f.default_factory is dataclasses.MISSING:
            lines.append(f"    {name} = get({f.name!r}, {missing})")
        else:
            lines.append(f"    {name} = get({f.name!r}, MISSING)")
            lines.append(f"    if {name} is MISSING:")
            lines.append(f"        {name} = {missing}" if missing else f"        raise KeyError({f.name!r})")
            allowed = getattr(conv, "allowed", None)
            if allowed is not None:
                namespace[f"allowed{index}"] = allowed
                lines.append(f"    elif {name} is not None and not isinstance({name}, allowed{index}):")
                lines.append(f"        {name} = conv{index}({name})")
            elif conv is not _identity:
                lines.append(f"    elif {name} is not None:")
                lines.append(f"        {name} = conv{index}({name})")
        (keywords if f.kw_only else arguments).append(f"{f.name}={name}" if f.kw_only else name)
    lines.append(f"    return cls({', '.join(arguments + keywords)})")
    exec("\n".join(lines), namespace)  # noqa: S102 - code built from the dataclass's own field names
    convert: Callable[[Any], Any] = namespace["convert"]
    return convert


def _without_none(tp: Any) -> Any:
    """`X` for `X | None` (the caller keeps None as it is); any other type unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1 and len(members) < len(typing.get_args(tp)):
            return members[0]
    return tp
