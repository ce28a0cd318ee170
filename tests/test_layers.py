"""The design card's layers (/work/shared/DESIGN.md, docs/ARCHITECTURE.md), checked on the source.

Every module of the ``kvsim`` namespace (found through pyproject.toml's package-dir, as the wheel
maps it) and app.py is parsed; its imports are every ``import`` / ``from ... import`` statement,
at module level or inside a function (a lazy import is still a dependency), and every
``importlib.import_module("literal")``. Then:

* dependencies point down only: a module imports its own layer or the layers below;
* the simulator never imports kernels/ (nor kernels the simulator, which the order already says);
* no import names a top-level package of ours outside ``kvsim`` (``import workloads``: the clash
  with PyPI's ``kernels`` that the one namespace exists to avoid);
* allocator/ stays plain Python: no simpy, torch, triton, streamlit or plotly;
* no import cycles between modules.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# THE list of layers, top (may import everything below) to bottom: (name, module prefixes, what
# lives there). A module's layer is its longest matching prefix. docs/ARCHITECTURE.md prints it
# (``layers_text``; test_the_architecture_document_prints_this_list keeps them equal).
LAYERS = (
    ("pages", ("app", "kvsim.app_pages", "kvsim.dashboard.router", "kvsim.dashboard.entry"),
     "the dashboard's pages and their router: widgets only (Streamlit)"),
    ("cli", ("kvsim.cli",), "one module per command; options.py = the shared flags -> build_engine()"),
    ("dashboard", ("kvsim.dashboard",), "dashboard logic, tested without Streamlit"),
    ("planner", ("kvsim.planner",),
     "presets, capacity, roofline, engine_setup.build_engine, sweeps, reproduce"),
    ("viz", ("kvsim.viz",), "figures (pure functions of arrays and tables)"),
    ("simulator", ("kvsim.simulator",),
     "engine, scheduler (the modes table), cost-model interface, recorder, summary"),
    ("kernels", ("kvsim.kernels",), "Triton kernels, reference, bridge (plain arrays in, report out)"),
    ("allocator", ("kvsim.allocator",), "pools and allocators (numpy only)"),
    ("workloads", ("kvsim.workloads",), "requests, loaders, synthetic generators, keys"),
    ("errors", ("kvsim.errors", "kvsim"), "InputError"),
)


def layers_text() -> str:
    """The list as docs/ARCHITECTURE.md prints it, top first: the layer's name and modules, then
    what lives there."""
    return "\n".join(f"{name:<10} {', '.join(prefixes)}\n{'':<10} {what}"
                     for name, prefixes, what in LAYERS)


RANK = {name: len(LAYERS) - i for i, (name, _, _) in enumerate(LAYERS)}
# pairs the order allows but the design card forbids
FORBIDDEN = {("simulator", "kernels")}
# the one command that starts the dashboard names its launcher; nothing else in the CLI may
UPWARD_ALLOWED_FROM = ("kvsim.cli.dashboard",)
OUR_TOP_LEVEL = ("allocator", "kernels", "workloads", "simulator", "planner", "viz", "app_pages")
THIRD_PARTY_BANNED = {"allocator": ("simpy", "torch", "triton", "streamlit", "plotly"),
                      "dashboard": ("streamlit",)}


def layer_of(module: str) -> str | None:
    best, best_len = None, -1
    for name, prefixes, _ in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = name, len(prefix)
    return best


def source_modules() -> dict[str, Path]:
    """module name -> file, for every module the wheel installs, plus app.py."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir = cfg.get("package-dir", {})
    modules = {"app": ROOT / "app.py"}
    for package in cfg["packages"]:
        parts = package.split(".")
        for i in range(len(parts), 0, -1):  # the longest mapped parent
            if ".".join(parts[:i]) in package_dir:
                folder = Path(package_dir[".".join(parts[:i])], *parts[i:])
                break
        else:
            folder = Path(*parts)
        for path in sorted((ROOT / folder).glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def imports_of(module: str, path: Path, known=()) -> set[str]:
    """Absolute names of everything ``module`` imports (resolving relative imports).

    ``from X import Y`` names the module X.Y when that is one of ``known``, else X (a parent
    package's ``__init__`` is not counted for each of its submodules, as import-linter does).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return found


MODULES = source_modules()


def graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (names that are not modules are dropped)."""
    edges = {m: {n for n in imports_of(m, p, MODULES) if n in MODULES and n != m}
             for m, p in MODULES.items()}
    from kvsim import cli  # the router imports its commands by name from a table
    edges["kvsim.cli"] |= {m for m in cli.COMMANDS.values() if m in MODULES}
    return edges


def test_the_architecture_document_prints_this_list():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    start = text.index("<!-- layers: tests/test_layers.py LAYERS -->")
    block = text[start:].split("```", 2)[1]
    assert block.strip() == layers_text()


def test_every_package_of_the_wheel_is_found():
    names = set(MODULES)
    for expected in ("kvsim.cli", "kvsim.cli.replay", "kvsim.planner.engine_setup", "kvsim.errors",
                     "kvsim.simulator.engine", "kvsim.allocator.paged", "kvsim.kernels.bridge",
                     "kvsim.workloads.loaders", "kvsim.viz.pool"):
        assert expected in names
    assert all(layer_of(m) is not None for m in names), [m for m in names if layer_of(m) is None]


def test_dependencies_point_down_only():
    bad = []
    for module, deps in graph().items():
        src = layer_of(module)
        for dep in deps:
            dst = layer_of(dep)
            allowed = module.startswith(UPWARD_ALLOWED_FROM) and dst == "pages"
            if (RANK[dst] > RANK[src] or (src, dst) in FORBIDDEN) and not allowed:
                bad.append(f"{module} ({src}) imports {dep} ({dst})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_names_one_of_our_folders_outside_the_namespace():
    bad = [f"{m} imports {name}" for m, p in MODULES.items() for name in imports_of(m, p)
           if name.split(".")[0] in OUR_TOP_LEVEL]
    assert not bad, "\n".join(sorted(bad))


@pytest.mark.parametrize("layer", sorted(THIRD_PARTY_BANNED))
def test_plain_layers_import_no_heavy_frameworks(layer):
    banned = THIRD_PARTY_BANNED[layer]
    bad = [f"{m} imports {name}" for m, p in MODULES.items() if layer_of(m) == layer
           for name in imports_of(m, p) if name.split(".")[0] in banned]
    assert not bad, "\n".join(sorted(bad))


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (the cycles)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert strongly_connected(graph()) == []


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The walker sees lazy and dynamic imports, and the cycle finder finds a cycle."""
    src = tmp_path / "mod.py"
    src.write_text("import importlib\n\ndef f():\n    from kvsim.planner import sweep\n"
                   "    return importlib.import_module('workloads')\n")
    found = imports_of("kvsim.simulator.mod", src, MODULES)
    assert {"kvsim.planner.sweep", "workloads"} <= found and "kvsim.planner" not in found
    assert layer_of("kvsim.simulator.mod") == "simulator" and layer_of("kvsim.errors") == "errors"
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_pages_catch_only_input_errors():
    """A page shows a user's mistake (InputError) with st.error; anything else keeps its
    traceback (docs/ARCHITECTURE.md, errors)."""
    caught = []
    for module, path in MODULES.items():
        if layer_of(module) not in ("pages", "dashboard"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler):
                name = ast.unparse(node.type) if node.type is not None else "everything"
                caught.append((module, node.lineno, name))
    assert len(caught) >= 10      # the walk saw the pages' handlers
    assert [c for c in caught if c[2] != "InputError"] == []
