"""The two wings, computed from the code: what the lessons import, what the tools import.

``helpers/`` is the lesson kit: the notebooks' code cells and the scripts their ``%%writefile``
cells write import it, and nothing else of this repository. ``labtools/`` is the tools wing:
``make`` runs it, and no lesson, taught script or kit module may import it. Nothing here is
typed by hand: the imports are read with ``ast`` (at a module's top and inside functions), so a
new module, or a lesson that starts importing one, is placed by what it does.

    python -m labtools.layers     # lines per wing, what the lessons reach, import loops
"""

from __future__ import annotations

import ast
import json
import sys
from functools import cache

from helpers.paths import NOTEBOOKS, REPO_ROOT

WINGS = ("helpers", "labtools")


def modules(wing: str) -> list[str]:
    """The modules of one wing, by name (``__init__`` left out)."""
    return sorted(p.stem for p in (REPO_ROOT / wing).glob("*.py") if p.stem != "__init__")


def python_source(source: str) -> str:
    """A cell's source with IPython's magics and shell lines blanked, so ast can read it."""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())


def run_as_module(node: ast.AST) -> set[str]:
    """``wing.module`` in a command list: ``[sys.executable, "-m", "helpers.torchrun", ...]``."""
    if not isinstance(node, (ast.List, ast.Tuple)):
        return set()
    words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
    return {
        ".".join(name.split(".")[:2])
        for flag, name in zip(words, words[1:], strict=False)
        if flag == "-m" and isinstance(name, str) and name.split(".")[0] in WINGS
    }


def imported(source: str) -> set[str]:
    """``wing.module`` names that ``source`` imports, or runs with ``python -m``, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        found |= run_as_module(node)
        if isinstance(node, ast.ImportFrom) and node.module in WINGS:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in WINGS:
            found.add(".".join(node.module.split(".")[:2]))
        elif isinstance(node, ast.Import):
            found |= {
                ".".join(a.name.split(".")[:2]) for a in node.names if a.name.split(".")[0] in WINGS
            }
    return found


@cache
def graph() -> dict[str, set[str]]:
    """Every module of both wings and the modules of both wings it imports."""
    return {
        f"{wing}.{name}": imported((REPO_ROOT / wing / f"{name}.py").read_text())
        - {f"{wing}.{name}"}
        for wing in WINGS
        for name in modules(wing)
    }


@cache
def lesson_imports() -> dict[str, set[str]]:
    """What each notebook imports of this repository: its code cells and its scripts."""
    found = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]  # no schema validation: 10x faster
        sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        scripts = [s.partition("\n")[2] for s in sources if s.startswith("%%writefile")]
        kernel = [python_source(s) for s in sources if not s.startswith("%%writefile")]
        found[path.stem] = set().union(*(imported(s) for s in scripts + kernel))
    return found


def reached(start: set[str], edges: dict[str, set[str]]) -> set[str]:
    """``start`` and everything it imports, transitively."""
    seen, todo = set(), list(start)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += edges.get(module, set())
    return seen


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles (strongly connected groups of two or more, or a module importing
    itself), each as its sorted members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in edges.get(node, ()):
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def lines(wing: str) -> int:
    return sum(len((REPO_ROOT / wing / f"{m}.py").read_text().splitlines()) for m in modules(wing))


def main() -> int:
    edges = graph()
    lessons = lesson_imports()
    reach = reached(set().union(*lessons.values()), edges)
    for wing in WINGS:
        print(f"{wing}/: {len(modules(wing))} modules, {lines(wing)} lines")
    kit = {f"helpers.{m}" for m in modules("helpers")}
    print(f"lessons reach {len(reach & kit)} of {len(kit)} kit modules")
    unused = sorted(kit - reach)
    if unused:
        print(f"kit modules no lesson reaches: {', '.join(unused)}")
    tools_in_lessons = sorted(reach - kit)
    found = loops(edges)
    for group in found:
        print("import loop: " + " <-> ".join(group))
    if tools_in_lessons:
        print(f"lessons reach the tools wing: {', '.join(tools_in_lessons)}")
    print("no import loops" if not found else f"{len(found)} import loop(s)")
    return 1 if found or tools_in_lessons else 0


if __name__ == "__main__":
    sys.exit(main())
