"""Every `kvsim` command in the ```bash blocks of the documents listed here runs as written
(in a scratch folder, so the files they write land there)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from kvsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["docs/BENCH.md"]


def commands(doc: str) -> list[str]:
    text = (ROOT / doc).read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        out += [line for line in block.splitlines() if line.startswith("kvsim ")]
    return out


CASES = [(doc, cmd) for doc in DOCUMENTS for cmd in commands(doc)]


def test_the_documents_have_commands():
    assert all(commands(doc) for doc in DOCUMENTS)


@pytest.mark.parametrize("doc, command", CASES, ids=[f"{d}:{i}" for i, (d, _) in enumerate(CASES)])
def test_a_documented_command_runs_as_written(doc, command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[1:]
    assert main(argv) == 0, capsys.readouterr().err
