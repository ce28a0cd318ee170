"""Outputs of the writing commands: checked before the work, written after the result is shown.

The contract of every ``kvsim`` command that writes files (replay, compare, plan, reproduce,
validate, profile, cache-curve):

1. every path it will write is checked before any work starts (``simulator.result``'s
   ``prepare_output`` / ``prepare_output_dir``: a directory where a file should be, a parent that
   cannot be created, a read-only directory or file), so that minutes of simulation are never
   lost to a typo;
2. its result (table, summary) is printed before any file is written;
3. the files are written by ``write_files``: a write that still fails (a full disk, a file made
   read-only meanwhile) does not stop the others, and is reported afterwards on one line naming
   each path and why (exit code 2). What was printed and what was written stays.
"""
from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Callable, Sequence

from kvsim.errors import InputError


def write_files(writes: Sequence[tuple[str | os.PathLike, Callable[[], object]]]) -> list[str]:
    """Run each ``(path, write)`` in order; the ones that fail do not stop the others.

    Returns:
        The paths written.
    Raises:
        InputError: after every write was tried, naming each path that failed and why.
    """
    written, failed = [], []
    for path, write in writes:
        try:
            write()
        except OSError as err:
            failed.append(f"{os.fspath(path)} ({err.strerror or err})")
        else:
            written.append(os.fspath(path))
    if failed:
        kept = f"; written: {', '.join(written)}" if written else ""
        raise InputError(f"could not write {'; '.join(failed)}; the results were printed above{kept}")
    return written


def check_output(path: str) -> None:
    """InputError unless ``path`` can be written (checked before any work: a file is created and
    removed in its folder, since os.access answers yes to root on a read-only file system)."""
    from kvsim.simulator.result import prepare_output

    out = Path(path)
    if out.is_dir():
        raise InputError("is a directory", file=path)
    if not out.parent.exists():
        raise InputError(f"directory {out.parent} does not exist", file=path)
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise InputError("not writable", file=path)
    prepare_output(path)
