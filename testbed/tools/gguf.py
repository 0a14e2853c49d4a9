"""A GGUF model file's identity: its digest, its quantization and the header's names.

Rules this module obeys:

1. The identity is read from the file alone (no model library): the SHA-256 of its
   bytes, the header's ``general.*`` strings and ``general.file_type``, and the
   quantization named by the file type (or, where the header has none, by the file
   name's ``Q4_1``-style suffix).
2. Only the header's key-value section is parsed, with bounds on every length; a file
   that is not GGUF is a :class:`GGUFError` naming the file.
"""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
MAX_STRING_BYTES = 1 << 24
MAX_ARRAY_ITEMS = 1 << 24
MAX_KV = 1 << 16
# llama.cpp's enum llama_ftype (the values a converter writes to general.file_type).
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
              10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
              15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS",
              20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
              30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0"}
_NAME_QUANT = re.compile(r"[._-]((?:I?Q\d(?:_[A-Z0-9]+)*)|F16|F32|BF16)$", re.IGNORECASE)
# value types: id -> struct format of a scalar (8 string, 9 array handled apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


class GGUFError(ValueError):
    """The file is not a GGUF model file this reader understands."""


def gguf_identity(path: Path) -> dict[str, Any]:
    """What names this model file (rule 1): file, bytes, sha256, quantization, header."""
    header = read_header(path)
    file_type = header.get("general.file_type")
    quant = FILE_TYPES.get(file_type) if isinstance(file_type, int) else None
    if quant is None:
        found = _NAME_QUANT.search(path.stem)
        quant = found.group(1).upper() if found else "unknown"
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_of(path),
            "quantization": quant, "file_type": file_type,
            "general": {k.removeprefix("general."): v for k, v in sorted(header.items())
                        if k.startswith("general.") and isinstance(v, str | int | float)}}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_header(path: Path) -> dict[str, Any]:
    """The key-value section of a GGUF file (rule 2); arrays are kept as their length."""
    try:
        with path.open("rb") as f:
            if f.read(4) != MAGIC:
                raise GGUFError(f"{path}: not a GGUF file (no GGUF magic)")
            version, = _unpack(f, "<I", path)
            if version < 2:
                raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or later)")
            _tensors, count = _unpack(f, "<QQ", path)
            if count > MAX_KV:
                raise GGUFError(f"{path}: {count} header keys (at most {MAX_KV})")
            out: dict[str, Any] = {}
            for _ in range(count):
                key = _string(f, path)
                vtype, = _unpack(f, "<I", path)
                out[key] = _value(f, vtype, path)
            return out
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read ({exc.strerror})") from None


def _unpack(f: BinaryIO, fmt: str, path: Path) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError(f"{path}: header ends early")
    return struct.unpack(fmt, data)


def _string(f: BinaryIO, path: Path) -> str:
    n, = _unpack(f, "<Q", path)
    if n > MAX_STRING_BYTES:
        raise GGUFError(f"{path}: a header string of {n} bytes")
    data = f.read(n)
    if len(data) != n:
        raise GGUFError(f"{path}: header ends early")
    return data.decode("utf-8", "replace")


def _value(f: BinaryIO, vtype: int, path: Path) -> Any:
    if vtype in _SCALARS:
        return _unpack(f, _SCALARS[vtype], path)[0]
    if vtype == 8:
        return _string(f, path)
    if vtype == 9:
        itype, n = _unpack(f, "<IQ", path)
        if n > MAX_ARRAY_ITEMS or itype == 9:
            raise GGUFError(f"{path}: a header array of {n} items of type {itype}")
        if itype in _SCALARS:
            f.seek(n * struct.calcsize(_SCALARS[itype]), 1)
        else:
            for _ in range(n):
                _value(f, itype, path)
        return {"array_items": n}
    raise GGUFError(f"{path}: unknown header value type {vtype}")
