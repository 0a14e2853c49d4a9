"""A GGUF file's identity (testbed/tools/gguf.py) from files written here byte by byte."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import pytest

from testbed.tools.gguf import GGUFError, gguf_identity, read_header


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path: Path, kv: list[tuple[str, int, Any]]) -> Path:
    """A GGUF v3 header with ``kv`` (key, value type, value) and no tensors."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    for key, vtype, value in kv:
        out += _string(key) + struct.pack("<I", vtype)
        if vtype == 8:
            out += _string(value)
        elif vtype == 9:  # an array of strings
            out += struct.pack("<IQ", 8, len(value)) + b"".join(_string(v) for v in value)
        elif vtype == 4:
            out += struct.pack("<I", value)
        elif vtype == 6:
            out += struct.pack("<f", value)
    path.write_bytes(out + b"\0" * 64)
    return path


def test_the_identity_names_the_digest_the_file_type_and_the_general_names(
        tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny-Q8_0.gguf", [
        ("general.architecture", 8, "llama"), ("general.name", 8, "Tiny"),
        ("tokenizer.ggml.tokens", 9, ["a", "b", "c"]), ("llama.rope.freq_base", 6, 1.5),
        ("general.file_type", 4, 3)])
    found = gguf_identity(path)
    assert found["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert found["quantization"] == "Q4_1"  # the header's file type wins over the name
    assert found["file_type"] == 3
    assert found["general"] == {"architecture": "llama", "name": "Tiny", "file_type": 3}
    assert read_header(path)["tokenizer.ggml.tokens"] == {"array_items": 3}


def test_without_a_file_type_the_name_says_the_quantization(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "SmolLM2-135M-Instruct.Q4_K_M.gguf",
                      [("general.name", 8, "x")])
    assert gguf_identity(path)["quantization"] == "Q4_K_M"
    other = write_gguf(tmp_path / "model.gguf", [])
    assert gguf_identity(other)["quantization"] == "unknown"


@pytest.mark.parametrize(("data", "reason"), [
    (b"PK\x03\x04zip", "not a GGUF file"),
    (b"GGUF" + struct.pack("<I", 3), "header ends early"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string("k") + struct.pack("<I", 99),
     "unknown header value type 99"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40), "header string"),
])
def test_a_file_that_is_not_gguf_is_an_error_naming_it(tmp_path: Path, data: bytes,
                                                        reason: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match=reason) as info:
        read_header(path)
    assert str(path) in str(info.value)
