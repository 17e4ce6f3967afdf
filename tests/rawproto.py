"""A hand-written protobuf wire codec for tests: an independent peer of the generated code.

Encodes and decodes the proto3 wire format (varint and length-delimited fields) without
using the protobuf library, so a test can prove the generated code speaks the same bytes.
"""

from __future__ import annotations

from collections import defaultdict

Field = int | bytes | list["Field"]


def varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num: int, value: int) -> bytes:
    return varint(num << 3) + varint(value)


def field_bytes(num: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return varint((num << 3) | 2) + varint(len(data)) + data


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def decode(buf: bytes) -> dict[int, list[int | bytes]]:
    """Field number -> list of raw values (ints for varints, bytes for length-delimited)."""
    out: dict[int, list[int | bytes]] = defaultdict(list)
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, pos = _read_varint(buf, pos)
            out[num].append(val)
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            out[num].append(buf[pos : pos + length])
            pos += length
        else:
            raise ValueError(f"unexpected wire type {wire} for field {num}")
    return dict(out)
