"""The simulator and the planner read in small pieces (issue 27): no function of simulator/ or
planner/ is 80 lines or longer (docstring included)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 80


def test_no_function_of_the_simulator_or_the_planner_reaches_80_lines():
    sizes = []
    for folder in ("simulator", "planner"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    sizes.append((node.end_lineno - node.lineno + 1,
                                  f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    assert len(sizes) > 500     # the walk saw the packages
    longest = max(sizes)
    assert longest[0] < LIMIT, f"{longest[1]} is {longest[0]} lines"
