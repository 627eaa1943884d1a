"""Compact, exact storage of per-token arrays as little-endian binary.

Token ids are stored as int32 and log-probs as float32 (4 bytes per token each), which
round-trips float32 values exactly; a Python float that is not a float32 value is rounded
to the nearest float32 (beyond float32's range: to infinity). Any sequence of numbers is
accepted (a list, a tuple, a NumPy array); values come back as a list.
"""

import sys
from array import array
from collections.abc import Sequence

from sqlalchemy import LargeBinary
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from db.errors import InvalidValue

_BIG_ENDIAN = sys.byteorder == "big"


def _encode(typecode: str, values: Sequence[int] | Sequence[float]) -> bytes:
    try:
        packed = array(typecode, values)
    except (OverflowError, TypeError) as exc:
        kind = "int32" if typecode == "i" else "float32"
        raise InvalidValue(f"not a sequence of {kind} values: {exc}") from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _decode(typecode: str, data: bytes) -> list:
    packed = array(typecode)
    packed.frombytes(data)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tolist()


def encode_int32(values: Sequence[int]) -> bytes:
    return _encode("i", values)


def decode_int32(data: bytes) -> list[int]:
    return _decode("i", data)


def encode_float32(values: Sequence[float]) -> bytes:
    return _encode("f", values)


def decode_float32(data: bytes) -> list[float]:
    return _decode("f", data)


class Int32Array(TypeDecorator[list[int]]):
    """A list of int32 stored as a little-endian blob."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Sequence[int] | None, dialect: Dialect) -> bytes | None:
        return None if value is None else encode_int32(value)

    def process_result_value(self, value: bytes | None, dialect: Dialect) -> list[int] | None:
        return None if value is None else decode_int32(value)


class Float32Array(TypeDecorator[list[float]]):
    """A list of float32 stored as a little-endian blob."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Sequence[float] | None, dialect: Dialect) -> bytes | None:
        return None if value is None else encode_float32(value)

    def process_result_value(self, value: bytes | None, dialect: Dialect) -> list[float] | None:
        return None if value is None else decode_float32(value)
