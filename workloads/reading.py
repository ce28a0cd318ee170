"""Streaming text input with located errors: the part every trace loader shares.

Tolerances (documented and tested): a UTF-8 byte-order mark, CRLF line ends, blank or
whitespace-only lines anywhere (they hold no request, so skipping them drops nothing), a gzip-
compressed file (detected by its magic bytes). Errors: a missing file, a directory, an empty
file, a binary file (a NUL byte in the first 64 KiB), bytes that are not UTF-8, each an
``InputError`` naming the file (and line where there is one).

Files are read line by line, never whole: memory does not grow with the file.
"""
from __future__ import annotations

import gzip
import math
import os
from collections.abc import Iterator

from kvsim.errors import InputError

_SNIFF_BYTES = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


def _open_binary(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")


def check_text_file(path: str | os.PathLike) -> str:
    """Validate that ``path`` is a readable, non-empty text file.

    Args:
        path: the file.
    Returns:
        ``str(path)``, the name errors use.
    Raises:
        InputError: missing, a directory, empty, binary (NUL bytes) or corrupt gzip.
    """
    name = os.fspath(path)
    if not os.path.exists(name):
        raise InputError("no such file", file=name)
    if os.path.isdir(name):
        raise InputError("is a directory, expected a trace file", file=name)
    try:
        with _open_binary(name) as f:
            head = f.read(_SNIFF_BYTES)
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise InputError(f"cannot read: {err}", file=name) from None
    if not head.strip(b" \t\r\n" + _BOM):
        raise InputError("empty file: no requests", file=name)
    nul = head.find(b"\x00")
    if nul >= 0:
        raise InputError(f"binary file (NUL byte at offset {nul}); expected a text trace "
                         "(JSONL or CSV)", file=name)
    return name


def iter_lines(path: str) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for every line, 1-based, line end kept, BOM removed.

    Each line is decoded on its own so that a decoding error names the right line.
    """
    try:
        f = _open_binary(path)
    except OSError as err:
        raise InputError(f"cannot read: {err}", file=path) from None
    with f:
        try:
            for lineno, raw in enumerate(f, 1):
                if lineno == 1 and raw.startswith(_BOM):
                    raw = raw[len(_BOM):]
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise InputError(f"not UTF-8 text (byte {raw[err.start]:#04x} at column "
                                     f"{err.start + 1})", file=path, line=lineno) from None
        except (OSError, EOFError) as err:  # truncated or corrupt gzip stream
            raise InputError(f"cannot read: {err}", file=path) from None


def first_data_line(path: str) -> tuple[int, str]:
    """``(line_number, text)`` of the first non-blank line (for format sniffing)."""
    for lineno, line in iter_lines(path):
        if line.strip():
            return lineno, line
    raise InputError("empty file: no requests", file=path)


def parse_count(value: object, *, minimum: int, file: str, line: int, field: str) -> int:
    """A token count from a CSV string or a JSON number.

    Integer-valued floats (``"12.0"``, as pandas writes them) are accepted; fractions, NaN,
    infinities, booleans and values below ``minimum`` are errors.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"expected an integer, got {value!r}", file=file, line=line, field=field)
    if isinstance(value, int):
        num = value
    else:
        if isinstance(value, float):
            as_float = value
        else:
            try:
                num = int(value)
                as_float = None
            except ValueError:
                try:
                    as_float = float(value)
                except ValueError:
                    raise InputError(f"not a number: {value!r}", file=file, line=line,
                                     field=field) from None
        if as_float is not None:
            if not math.isfinite(as_float):
                raise InputError(f"not a finite number: {value!r}", file=file, line=line,
                                 field=field)
            if not as_float.is_integer():
                raise InputError(f"expected an integer, got {value!r}", file=file, line=line,
                                 field=field)
            num = int(as_float)
    if num < minimum:
        what = "zero-length" if num == 0 else "negative" if num < 0 else "too small"
        raise InputError(f"{what} value {num}: must be >= {minimum}", file=file, line=line,
                         field=field)
    return num


def parse_number(value: object, *, file: str, line: int, field: str) -> float:
    """A finite float from a CSV string or a JSON number (NaN and infinities are errors)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"expected a number, got {value!r}", file=file, line=line, field=field)
    try:
        num = float(value)
    except (ValueError, OverflowError):  # OverflowError: a JSON integer beyond float range
        raise InputError(f"not a number: {value!r}", file=file, line=line, field=field) from None
    if not math.isfinite(num):
        raise InputError(f"not a finite number: {value!r}", file=file, line=line, field=field)
    return num
