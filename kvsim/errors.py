"""The one error type for a user's bad input (trace files, specs, configs).

The CLI prints ``str(err)`` on one line and exits 2; the dashboard shows it with ``st.error``.
"""
from __future__ import annotations


class InputError(ValueError):
    """Bad user input, located as precisely as we can: file, line (1-based) and field."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = str(self.file)
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        if self.field is not None:
            where += f"field '{self.field}': "
        return where + self.message


# Python's json messages end where their position would follow ("Invalid control character at:
# line 1 column 36"); said whole, with what to do where it is not obvious
_JSON_HINTS = {
    "Invalid control character": "a raw control character (a tab or line break) inside a string; "
                                 "write it as \\t or \\n",
    "Unterminated string": "a string that is never closed",
}


def json_problem(err) -> str:
    """A ``json.JSONDecodeError`` as one whole sentence with its column (the file and line are the
    InputError's): ``invalid control character at column 36: a raw control character ...``."""
    msg = err.msg.removesuffix(" starting at").removesuffix(" at")
    hint = next((h for start, h in _JSON_HINTS.items() if msg.startswith(start)), None)
    text = f"{msg[:1].lower()}{msg[1:]} at column {err.colno}"
    return f"{text}: {hint}" if hint else text
