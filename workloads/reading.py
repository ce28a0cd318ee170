"""Streaming text input with located errors: the part every trace loader shares.

Tolerances (documented and tested): a UTF-8 byte-order mark, CRLF line ends, blank or
whitespace-only lines anywhere (they hold no request, so skipping them drops nothing), a gzip-
compressed file (detected by its magic bytes). Errors: a missing file, a directory, an empty
file, a binary file (a NUL byte in the first 64 KiB), bytes that are not UTF-8, a compressed
stream that is corrupt or truncated, each an ``InputError`` naming the file (and line where
there is one: for a corrupt stream, the first line that could not be decompressed).

Files are read line by line, never whole: memory does not grow with the file.
"""
from __future__ import annotations

import gzip
import math
import os
import zlib
from collections.abc import Iterator

from kvsim.errors import InputError

_SNIFF_BYTES = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
# what a corrupt or truncated compressed stream raises: gzip.BadGzipFile (an OSError) for a bad
# header or CRC, EOFError when cut short, zlib.error for corrupt deflate data
_DECOMPRESSION_ERRORS = (OSError, EOFError, zlib.error)


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
    lines: list[bytes] = []
    size = 0
    try:
        with _open_binary(name) as f:
            # line by line, so that a corrupt stream is reported at the line it breaks
            while size < _SNIFF_BYTES:
                line = f.readline(_SNIFF_BYTES - size)
                if not line:
                    break
                lines.append(line)
                size += len(line)
    except _DECOMPRESSION_ERRORS as err:
        raise InputError(_read_error(err), file=name, line=len(lines) + 1) from None
    head = b"".join(lines)
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
    lineno = 0
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
        except _DECOMPRESSION_ERRORS as err:  # truncated or corrupt compressed stream
            raise InputError(_read_error(err), file=path, line=lineno + 1) from None


def _read_error(err: Exception) -> str:
    """One line for a read or decompression failure (the line number is the caller's)."""
    if isinstance(err, (zlib.error, gzip.BadGzipFile)):
        return f"corrupt compressed data ({err})"
    if isinstance(err, EOFError):
        return "compressed stream ends early (truncated file)"
    return f"cannot read: {err.strerror or err}" if isinstance(err, OSError) else str(err)


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
