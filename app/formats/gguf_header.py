"""How many leading bytes of a GGUF file its header needs, from a prefix of the file alone.

A GGUF starts with the magic, the version, the tensor and key counts, then every metadata key/value and
every tensor's name, shape, type and offset; the tensor data follows, aligned. `header_end(prefix)` walks
that structure without reading any tensor data, so a header can be fetched from a remote file with HTTP
Range requests: it answers the end of the tensor table, or `NeedMore(n)` when the prefix stops before it
(n: the least length that could get further). A prefix that cannot be a GGUF is a `GGUFProblem`.

The bytes up to `header_end` are all `gguf.GGUFReader` parses besides tensor data, so a file made of them
followed by zeros (a sparse file of the real size) reads exactly like the real file for its facts and layout.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from app.formats.gguf_meta import MAGIC, GGUFProblem

# GGUF value types -> fixed size in bytes; 8 (string) and 9 (array) are variable
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8  # llama.cpp's GGML_MAX_DIMS is 4; more is a corrupt header


@dataclass(frozen=True)
class NeedMore:
    at_least: int


class _Short(Exception):
    def __init__(self, need: int) -> None:
        self.need = need


class _Cursor:
    def __init__(self, buf: bytes, order: str) -> None:
        self.buf = buf
        self.pos = 0
        self.order = order

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _Short(end)
        chunk = self.buf[self.pos : end]
        self.pos = end
        return chunk

    def skip(self, n: int) -> None:
        end = self.pos + n
        if end > len(self.buf):
            raise _Short(end)
        self.pos = end

    def u32(self) -> int:
        return int(struct.unpack(self.order + "I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(self.order + "Q", self.take(8))[0])


def _skip_value(c: _Cursor, vtype: int, *, where: str) -> None:
    if vtype in _FIXED:
        c.skip(_FIXED[vtype])
    elif vtype == _STRING:
        c.skip(c.u64())
    elif vtype == _ARRAY:
        etype, count = c.u32(), c.u64()
        if etype in _FIXED:
            c.skip(_FIXED[etype] * count)
        elif etype == _STRING:
            for _ in range(count):
                c.skip(c.u64())
        else:
            raise ValueError(f"{where} is an array of type {etype}, which GGUF does not define")
    else:
        raise ValueError(f"{where} has value type {vtype}, which GGUF does not define")


def header_end(prefix: bytes) -> int | NeedMore | GGUFProblem:
    """The end of the tensor table (the bytes a header read needs), or NeedMore, or a problem."""
    if len(prefix) < 24:
        return NeedMore(24)
    if prefix[:4] != MAGIC:
        return GGUFProblem(f"not a GGUF file (it starts with {prefix[:4]!r}, a GGUF starts with b'GGUF')")
    order = "<"
    version = struct.unpack("<I", prefix[4:8])[0]
    if version & 0xFFFF == 0:  # a big-endian file reads as a huge little-endian number
        order = ">"
        version = struct.unpack(">I", prefix[4:8])[0]
    if version not in (2, 3):
        return GGUFProblem(f"GGUF version {version} is not supported (2 and 3 are)")
    c = _Cursor(prefix, order)
    c.skip(8)
    try:
        n_tensors, n_kv = c.u64(), c.u64()
        for i in range(n_kv):
            key = c.take(c.u64())
            _skip_value(c, c.u32(), where=f"metadata key {i} ({key[:64]!r})")
        for i in range(n_tensors):
            c.skip(c.u64())  # name
            dims = c.u32()
            if dims > _MAX_DIMS:
                raise ValueError(f"tensor {i} claims {dims} dimensions")
            c.skip(8 * dims + 4 + 8)  # shape, type, offset
    except _Short as short:
        return NeedMore(short.need)
    except ValueError as exc:
        return GGUFProblem(f"the GGUF header is corrupt: {exc}; the file cannot be read")
    return c.pos
