import math
import struct

import pytest

from db.arrays import decode_float32, decode_int32, encode_float32, encode_int32
from db.errors import InvalidValue


def test_int32_round_trip_is_exact_and_little_endian() -> None:
    values = [0, 1, -1, 2**31 - 1, -(2**31), 151_643]
    data = encode_int32(values)
    assert data == struct.pack(f"<{len(values)}i", *values)
    assert decode_int32(data) == values


def test_float32_round_trip_is_exact_for_float32_values() -> None:
    # Every value is a float32 (as torch float32 tensors give), including the awkward ones.
    values = [struct.unpack("<f", struct.pack("<f", v))[0] for v in (-0.1, -12.75, 1e-40, 3e38)]
    values += [0.0, -0.0, -math.inf, math.inf]
    data = encode_float32(values)
    assert data == struct.pack(f"<{len(values)}f", *values)
    decoded = decode_float32(data)
    assert [struct.pack("<f", v) for v in decoded] == [struct.pack("<f", v) for v in values]
    assert math.isnan(decode_float32(encode_float32([math.nan]))[0])


def test_float64_values_are_rounded_to_float32() -> None:
    (stored,) = decode_float32(encode_float32([0.1]))
    assert stored == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert stored != 0.1


def test_empty_arrays() -> None:
    assert encode_int32([]) == b""
    assert decode_int32(b"") == []
    assert decode_float32(encode_float32([])) == []


@pytest.mark.parametrize("values", [[2**31], [-(2**31) - 1], [1.5], ["7"]])
def test_values_that_are_not_int32_are_refused(values: list) -> None:
    with pytest.raises(InvalidValue, match="int32"):
        encode_int32(values)


def test_values_that_are_not_numbers_are_refused_as_float32() -> None:
    with pytest.raises(InvalidValue, match="float32"):
        encode_float32(["-0.5"])
