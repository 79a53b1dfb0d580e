"""The learner's copy: every cell tagged ``solution`` becomes a stub, checks stay intact.

The stub keeps the names the check cell reads, so the check can say "not yet" instead of
failing with a NameError: each top-level assignment becomes ``name = ...`` and each function
keeps its signature and docstring but raises ``NotImplementedError``.

Two uses, one code path:

- ``make lab`` opens ``lab/``, the copy a learner works in (``--lab``): every lesson of every
  edition (``lab/zh_CN/`` for the Chinese one), the start page, catalog.json and any notes.
  It is written again on each ``make lab`` so that a ``git pull`` reaches the learner, but a
  file the learner changed (edited, or run and saved) is kept: ``lab/.generated.json`` holds
  the sha256 of what was written, and a file that no longer has it is left alone, with one
  line saying how to get the new version (delete it, or ``make lab-reset``).
- ``make student`` writes a fresh copy to hand out (``--out student``), replaced wholesale so
  that no stale solution survives.

``notebooks/`` stays the answer key: the solutions filled in, the copy CI runs.

    python -m labtools.student --lab [--reset]     (make lab; make lab-reset)
    python -m labtools.student [--out student]      (make student)
    python -m labtools.student --lang zh_CN --out student/zh_CN   (make student LANG=zh_CN)
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shutil
import sys
from pathlib import Path

import nbformat

from helpers.paths import NOTEBOOKS, REPO_ROOT
from labtools.i18n import editions, translated_notebook

TODO = "# TODO: your solution here (the check cell below tells you when it is right)"
LAB = REPO_ROOT / "lab"
MANIFEST = ".generated.json"  # in lab/: relative path -> sha256 of the content written


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


def lesson_files(lang: str | None = None, prefix: str = "") -> tuple[dict[str, bytes], dict]:
    """Every lesson of one edition, stubbed: {prefix + file name: content}, {stem: stubs}."""
    files, counts = {}, {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        teacher = translated_notebook(lang, path.stem) if lang else nbformat.read(path, 4)
        nb, counts[path.stem] = student_notebook(teacher)
        files[f"{prefix}{path.name}"] = nbformat.writes(nb).encode()
    return files, counts


def kit_files(notes: str = "notes/", start_page: bool = True) -> dict[str, bytes]:
    """What the lessons link to beside them: catalog.json, the start page, the notes."""
    files = {"catalog.json": (NOTEBOOKS / "catalog.json").read_bytes()}
    if start_page:
        files["README.md"] = (NOTEBOOKS / "README.md").read_bytes()
    folder = NOTEBOOKS / "notes"
    for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
        if path.is_file():
            files[notes + path.relative_to(folder).as_posix()] = path.read_bytes()
    return files


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_files(out: Path, files: dict[str, bytes], keep_changed: bool) -> dict[str, str]:
    """Write ``files`` under ``out``; relative path -> "written", "unchanged", "kept" or "removed".

    ``keep_changed`` (the learner's lab/): a file whose bytes differ from what the manifest
    says was written is the learner's and is kept; a file written before and no longer made
    (a lesson renamed upstream) is removed only if unchanged. Otherwise ``out`` is replaced.
    """
    manifest_path = out / MANIFEST
    if not keep_changed and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    done = {}
    for name, data in files.items():
        path = out / name
        current = path.read_bytes() if path.is_file() else None
        if current == data:
            done[name] = "unchanged"
        elif current is not None and keep_changed and manifest.get(name) != _sha256(current):
            done[name] = "kept"  # the learner's: its manifest entry stays the old one
            continue
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            done[name] = "written"
        manifest[name] = _sha256(data)
    for name in sorted(set(manifest) - set(files)):
        path = out / name
        if not path.is_file() or _sha256(path.read_bytes()) == manifest[name]:
            path.unlink(missing_ok=True)
            del manifest[name]
            done[name] = "removed"
    if keep_changed:
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return done


def write_lab(out: Path | None = None) -> tuple[dict[str, int], dict[str, str]]:
    """The learner's copy in ``out`` (lab/): the English lessons, each edition's in
    ``out/<lang>/``, the start page, catalog.json and notes; the learner's changes kept.
    Returns ({stem: stubs} of the English lessons, {relative path: what happened})."""
    files, counts = lesson_files()
    out = out or LAB
    for lang in editions():
        files.update(lesson_files(lang, prefix=f"{lang}/")[0])
    files.update(kit_files())
    return counts, write_files(out, files, keep_changed=True)


def write_student_copy(out: Path, lang: str | None = None) -> dict[str, int]:
    """Every lesson, stubbed, into ``out`` (replaced wholesale so no stale solution survives).

    ``lang`` (``zh_CN``) stubs the translated edition instead of the English one; its links
    reach the notes one folder up (``../notes/``), as in notebooks/.
    """
    files, counts = lesson_files(lang)
    files.update(kit_files(notes="../notes/" if lang else "notes/", start_page=not lang))
    write_files(out, files, keep_changed=False)
    return counts


def kept_line(name: str) -> str:
    return (
        f"lab/{name} has your changes and was not refreshed; to get the new version, "
        f"delete it (or `make lab-reset` for every file) and run `make lab` again"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m labtools.student",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lab", action="store_true", help="refresh lab/, the learner's copy")
    parser.add_argument("--reset", action="store_true", help="with --lab: replace lab/ entirely")
    parser.add_argument("--out", default=str(REPO_ROOT / "student"))
    parser.add_argument("--lang", help="a translated edition, e.g. zh_CN (default: English)")
    args = parser.parse_args(argv)
    if args.lab:
        if args.reset and LAB.exists():
            shutil.rmtree(LAB)
            print("lab/ removed: every lesson is written again, exercises open")
        _, done = write_lab()
        for name, what in done.items():
            if what == "kept":
                print(kept_line(name))
        written = sum(what == "written" for what in done.values())
        print(f"lab/: the learner's copy, exercises open ({written} file(s) written)")
        return 0
    counts = write_student_copy(Path(args.out), args.lang)
    for stem, n in counts.items():
        print(f"{stem}: {n} solution cell(s) replaced by stubs")
    print(f"Student copy in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
