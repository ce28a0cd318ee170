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


def require_new_seq_id(seq_id, live: dict) -> None:
    """``seq_id`` is an int >= 0 that is not live yet."""
    require_int("seq_id", seq_id)
    if seq_id in live:
        raise ValueError(f"seq_id {seq_id} is already allocated")


def require_live(seq_id, live: dict):
    """The state of live sequence ``seq_id``."""
    state = live.get(seq_id)
    if state is None:
        raise ValueError(f"unknown seq_id {seq_id!r} ({len(live)} live sequences)")
    return state
