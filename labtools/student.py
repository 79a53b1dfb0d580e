"""Write the student copy: every cell tagged ``solution`` becomes a stub, checks stay intact.

The stub keeps the names the check cell reads, so the check can say "not yet" instead of
failing with a NameError: each top-level assignment becomes ``name = ...`` and each function
keeps its signature and docstring but raises ``NotImplementedError``.

    python -m labtools.student [--out student]      (or: make student)
    python -m labtools.student --lang zh_CN --out student/zh_CN   (or: make student LANG=zh_CN)
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
from pathlib import Path

import nbformat

from helpers.paths import NOTEBOOKS, REPO_ROOT
from labtools.i18n import translated_notebook

TODO = "# TODO: your solution here (the check cell below tells you when it is right)"


def _function_stub(node: ast.FunctionDef, source: str) -> str:
    header = ast.get_source_segment(source, node).split("\n")
    lines = header[: node.body[0].lineno - node.lineno]  # the signature (and decorators)
    doc = ast.get_docstring(node)
    body = [f'    """{doc}"""'] if doc else []
    return "\n".join([*lines, *body, "    raise NotImplementedError"])


def stub(source: str) -> str:
    """The student's version of a solution cell."""
    tree = ast.parse(source)
    parts = [TODO]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            parts.append(_function_stub(node, source))
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            parts += [f"{name} = ..." for name in names]
    return "\n".join(parts) + "\n"


def student_notebook(nb: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, int]:
    """A copy without outputs whose solution cells are stubs; also returns how many."""
    nb = nbformat.from_dict(nb)
    replaced = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        if "solution" in cell.metadata.get("tags", []):
            cell.source = stub(cell.source)
            cell.metadata["tags"] = [t for t in cell.metadata["tags"] if t != "solution"]
            replaced += 1
    return nb, replaced


def write_student_copy(out: Path, lang: str | None = None) -> dict[str, int]:
    """Every lesson, stubbed, into ``out`` (replaced wholesale so no stale solution survives).

    ``lang`` (``zh_CN``) stubs the translated edition instead of the English one.
    """
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    counts = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        teacher = translated_notebook(lang, path.stem) if lang else nbformat.read(path, 4)
        nb, counts[path.stem] = student_notebook(teacher)
        nbformat.write(nb, out / path.name)
    shutil.copy(NOTEBOOKS / "catalog.json", out / "catalog.json")
    notes = out.parent / "notes" if lang else out / "notes"  # zh links ../notes/, as in notebooks/
    if (NOTEBOOKS / "notes").is_dir():
        shutil.copytree(NOTEBOOKS / "notes", notes, dirs_exist_ok=True)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labtools.student", description=__doc__)
    parser.add_argument("--out", default=str(REPO_ROOT / "student"))
    parser.add_argument("--lang", help="a translated edition, e.g. zh_CN (default: English)")
    args = parser.parse_args(argv)
    counts = write_student_copy(Path(args.out), args.lang)
    for stem, n in counts.items():
        print(f"{stem}: {n} solution cell(s) replaced by stubs")
    print(f"Student copy in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
