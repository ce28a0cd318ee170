"""Every shell example in README.md and docs/*.md runs as written (issue 29 item 4).

The documents label their code blocks:

* ```bash: commands run as written. Each ``kvsim`` command runs here (in a scratch folder, so the
  files it writes land there; ``../shared/...`` is the shared folder beside the repository, and the
  command is skipped when that is absent). Each ``python bench/SCRIPT.py`` command: the script
  exists and ``--help`` lists every flag the command gives. ``make TARGET``: the Makefile has it.
* ```console: ``$ COMMAND`` lines, each followed by the output the document shows; the command runs
  as above and every shown line (``...`` skips lines) is in its output, in order.
* ```text: a synopsis or template (placeholders such as WORKLOAD or DIR), not run.

A block that runs only elsewhere (a GPU, the device machine, another checkout) says so on the line
above its fence, ``<!-- not run by tests: WHY -->``; its ``python bench/...`` commands are still
checked against their scripts' ``--help``, and its other lines are reported as skipped with WHY.
A code block without a label that holds a command fails: label it.
"""
from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
DOCUMENTS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?:[ \t]*<!-- not run by tests: (?P<why>[^>]*) -->\n)?[ \t]*```(?P<lang>[\w-]*)\n"
                   r"(?P<body>.*?)^[ \t]*```$", re.M | re.S)
# the first word of a line that is a command (an unlabelled block holding one fails)
COMMAND_WORDS = {"kvsim", "python", "python3", "bash", "make", "git", "cd", "for", "$"}
PYTHON = re.compile(r"^(?:\S*/)?python3?$")


@dataclass
class Example:
    doc: str
    line: int              # 1-based line of the command in the document
    command: str           # continuation lines joined
    expected: list[str] = field(default_factory=list)   # console: the output shown ('...' skips)
    not_run: str | None = None   # the block's reason, when it runs only elsewhere

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _statements(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join continuation lines (a trailing backslash); keep the first line's number."""
    out, start, parts = [], None, []
    for number, line in lines:
        if start is None:
            start = number
        parts.append(line.rstrip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            out.append((start, " ".join(p for p in parts if p)))
            start, parts = None, []
    return out


def blocks(doc: str):
    """(language, first body line number, body lines, not-run reason) of every fenced block."""
    text = (ROOT / doc).read_text()
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start("body")) + 1
        yield m.group("lang"), first, m.group("body").splitlines(), m.group("why")


def examples(doc: str) -> list[Example]:
    out = []
    for lang, first, body, why in blocks(doc):
        numbered = list(enumerate(body, first))
        if lang == "bash":
            lines = [(n, ln) for n, ln in numbered if ln.strip() and not ln.lstrip().startswith("#")]
            out += [Example(doc, n, cmd, not_run=why) for n, cmd in _statements(lines)]
        elif lang == "console":
            current: Example | None = None
            pending: list[tuple[int, str]] = []
            for n, ln in numbered:
                if ln.startswith("$ ") or pending:
                    pending.append((n, ln.removeprefix("$ ")))
                    if not ln.rstrip().endswith("\\"):
                        (start, cmd), = _statements(pending)
                        current, pending = Example(doc, start, cmd, not_run=why), []
                        out.append(current)
                elif current is not None and ln.strip():
                    current.expected.append(ln)
    return out


CASES = [e for doc in DOCUMENTS for e in examples(doc)]
# a command shown in several places runs once (its first place); each place's output is checked
FIRST: dict[str, Example] = {}
for _e in CASES:
    FIRST.setdefault(_e.command, _e)


def test_the_documents_have_examples():
    docs = {e.doc for e in CASES}
    assert {"README.md", "docs/BENCH.md", "docs/PLANNER.md", "docs/WORKLOADS.md"} <= docs


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_every_block_holding_a_command_is_labelled(doc):
    for lang, first, body, _ in blocks(doc):
        if lang:
            continue
        words = [ln.split()[0] for ln in body if ln.strip() and not ln.strip().startswith("#")]
        assert not any(w in COMMAND_WORDS or PYTHON.match(w) for w in words), (
            f"{doc}:{first}: a code block with a command has no label: ```bash (run by the tests), "
            "```console ($ lines and their output) or ```text (a synopsis, not run)")


def _argv(command: str) -> list[str]:
    return shlex.split(command, comments=True)


def _resolve(token: str) -> str:
    """A path the documents give from the repository root, as a path from anywhere."""
    if token.startswith("../shared/"):
        return str(SHARED / token.removeprefix("../shared/"))
    if "/" in token and not token.startswith(("/", "-")) and (ROOT / token.split("/")[0]).exists():
        return str(ROOT / token)
    return token


def _in_order(expected: list[str], output: str) -> str | None:
    """None when every shown line (whitespace collapsed) is in the output in order, else the first
    line that is not. A line ``...`` skips lines; a line ending in ``...`` is the start of one (a
    time the run measured follows)."""
    got = [" ".join(ln.split()) for ln in output.splitlines()]
    at = 0
    for line in expected:
        want = " ".join(line.split())
        if want == "...":
            continue
        prefix = want.removesuffix("...")
        found = next((i for i in range(at, len(got))
                      if (got[i].startswith(prefix) if want.endswith("...") else got[i] == want)), None)
        if found is None:
            return line
        at = found + 1
    return None


@functools.cache
def _help(script: str, subcommand: str | None = None) -> str:
    out = subprocess.run([sys.executable, script, *([subcommand] if subcommand else []), "--help"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, f"{script} --help: {out.stderr[-500:]}"
    return out.stdout


def _check_bench_script(example: Example, argv: list[str]) -> None:
    at = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    script = argv[at]
    assert (ROOT / script).is_file(), f"{example.id}: {script} does not exist"
    text = _help(script)
    choices = re.search(r"\{([\w,-]+)\}", text.split("\n\n")[0])
    if choices and at + 1 < len(argv) and argv[at + 1] in choices.group(1).split(","):
        text = _help(script, argv[at + 1])
    source = (ROOT / script).read_text()   # a flag hidden from --help (a child process's) is declared there
    for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) or f'"{flag}"' in source, \
            f"{example.id}: {script} has no {flag}"


_OUTPUTS: dict[tuple, str] = {}


def _run(first: Example, args: tuple[str, ...]) -> str:
    """stdout of ``kvsim ARGS`` (once per command in a test process)."""
    if args not in _OUTPUTS:
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
        assert code == 0, f"{first.id}: exit {code}: {err.getvalue()[-2000:]}"
        _OUTPUTS[args] = out.getvalue()
    return _OUTPUTS[args]


@pytest.mark.parametrize("example", [
    pytest.param(e, id=e.id, marks=pytest.mark.xdist_group(f"docs-{FIRST[e.command].id}")) for e in CASES])
def test_a_documented_command_runs_as_written(example, tmp_path, monkeypatch):
    argv = _argv(example.command)
    assert argv, example.id
    if any(PYTHON.match(a) for a in argv[:1]) and any(a.startswith("bench/") for a in argv[1:2]):
        _check_bench_script(example, argv)
        pytest.skip(f"{example.id}: a benchmark; its script and flags checked")
    if example.not_run:
        pytest.skip(f"{example.id}: {example.not_run}")
    if argv[0] == "make":
        makefile = (ROOT / "Makefile").read_text()
        for target in argv[1:]:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{example.id}: no make {target}"
        return
    assert argv[0] == "kvsim", (
        f"{example.id}: only kvsim, python bench/ and make commands run here; mark the block "
        "<!-- not run by tests: WHY --> if it runs elsewhere")
    args = [_resolve(a) for a in argv[1:]]
    missing = [a for a in args if a.startswith(str(SHARED)) and not Path(a).exists()]
    if missing:
        pytest.skip(f"{example.id}: needs {missing[0]} (../shared is absent)")
    monkeypatch.chdir(tmp_path)
    # the paths as the document gives them (the command ran on them resolved)
    out = _run(FIRST[example.command], tuple(args)).replace(str(SHARED), "../shared")
    wrong = _in_order(example.expected, out)
    assert wrong is None, f"{example.id}: the document shows {wrong!r}; the command printed:\n{out}"
