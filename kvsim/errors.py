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
