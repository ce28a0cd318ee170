"""Argument checks shared by the allocators: a bad argument raises ValueError with the numbers."""
from __future__ import annotations

import numbers


def require_int(name: str, value, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum`` (numpy integers accepted), else ValueError naming it."""
    if type(value) is not int and (isinstance(value, bool)
                                   or not isinstance(value, numbers.Integral)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def require_new_seq_id(seq_id, live: dict):
    """``seq_id`` if it is a hashable id that is not live yet: an int >= 0 (the simulator's ids,
    checked first and cheaply; numpy integers become ints) or any other hashable such as vLLM's
    string request ids."""
    if type(seq_id) is int:
        if seq_id < 0:
            raise ValueError(f"seq_id must be an integer >= 0 or another hashable, got {seq_id}")
    elif seq_id is None or isinstance(seq_id, (bool, float)):
        raise ValueError(f"seq_id must be an integer >= 0 or another hashable (a string, a "
                         f"tuple), got {seq_id!r}")
    elif isinstance(seq_id, numbers.Integral):
        seq_id = require_int("seq_id", seq_id)
    else:
        try:
            hash(seq_id)
        except TypeError:
            raise ValueError(f"seq_id must be hashable, got {type(seq_id).__name__} "
                             f"{seq_id!r}") from None
    if seq_id in live:
        raise ValueError(f"seq_id {seq_id!r} is already allocated")
    return seq_id


def snapshot_order(seq_ids) -> list:
    """Live ids in the order snapshots list them: int ids ascending, then other ids in
    allocation order (strings and tuples of different types do not compare)."""
    ints = sorted(i for i in seq_ids if type(i) is int)
    if len(ints) == len(seq_ids):
        return ints
    return ints + [i for i in seq_ids if type(i) is not int]


def owner_codes(ordered_ids: list) -> tuple[dict, tuple | None]:
    """The int each id writes into a snapshot's ``owner`` array, and ``owner_ids``: None when
    every id is an int >= 0 (the code is the id itself), else the tuple of ids indexed by code."""
    if all(type(i) is int for i in ordered_ids):
        return {i: i for i in ordered_ids}, None
    return {seq_id: code for code, seq_id in enumerate(ordered_ids)}, tuple(ordered_ids)


def require_live(seq_id, live: dict):
    """The state of live sequence ``seq_id``."""
    state = live.get(seq_id)
    if state is None:
        raise ValueError(f"unknown seq_id {seq_id!r} ({len(live)} live sequences)")
    return state
