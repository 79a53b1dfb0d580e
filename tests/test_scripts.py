"""Scripts are recovered from their lesson's %%writefile cell, byte for byte."""

from __future__ import annotations

import ast
import functools
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import cell_scripts
from labtools import exported_scripts


def test_script_comes_from_the_notebook_cell(tmp_path):
    path = cell_scripts.ensure_script("00_environment", "work/smoke_allreduce.py", cwd=tmp_path)
    text = path.read_text()
    assert text.startswith('"""All-reduce smoke test')
    assert "dist.all_reduce(x, op=dist.ReduceOp.SUM)" in text
    assert "%%writefile" not in text


def test_unknown_script_is_a_clear_error():
    with pytest.raises(LookupError, match="no '%%writefile work/nope.py' cell"):
        cell_scripts.cell_script("00_environment", "work/nope.py")


def test_python_first_lines_with_quotes_do_not_stop_the_search():
    """06 has a code cell whose first line is a comment with an apostrophe (one core's rate)."""
    assert "def main()" in cell_scripts.cell_script("04_dataloader_tuning", "work/loader_train.py")


def test_the_scripts_a_lesson_writes_are_listed_once_each():
    assert exported_scripts.written_scripts("05_profiling") == [
        "work/profile_core.py",
        "work/profile_ddp.py",
        "work/straggler.py",
    ]
    assert "work/ddp_train.py" in exported_scripts.written_scripts("02_distributed_data_parallel")


def test_every_taught_script_passes_ruff(capsys):
    """ruff skips %%writefile cells and work/: `make lint` checks the scripts as files."""
    assert exported_scripts.lint([sys.executable, "-m", "ruff"]) == 0, capsys.readouterr().out


DISTRIBUTED = ("torch.distributed", "accelerate", "lightning_fabric")


def joins_a_group(tree: ast.Module) -> bool:
    """Imports torch.distributed (or a framework over it) at its top: a torchrun worker."""
    modules = [n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    return any(m == d or m.startswith(d + ".") for m in modules for d in DISTRIBUTED)


def shape_problems(tree: ast.Module) -> list[str]:
    """What keeps a worker script from the shape every taught script has."""
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    problems = [] if mains else ["no main()"]
    if mains and "record" not in [ast.unparse(d) for d in mains[0].decorator_list]:
        problems.append("main() is not wrapped in @record")
    guards = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    if not any("main()" in ast.unparse(g) for g in guards):
        problems.append('no `if __name__ == "__main__": main()`')
    calls = [
        ast.unparse(n)[:40]
        for n in tree.body
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
    ]
    problems += [f"work at import: {call}" for call in calls]
    return problems


def test_every_worker_a_lesson_starts_has_main_under_record_and_a_guard():
    """Importing a taught script runs nothing, and an exception in a worker reaches torchrun's
    error file (so the launcher names the failing rank from it, notebook 13)."""
    seen = set()
    for stem in sorted({nb for nb, _, _ in exported_scripts.lesson_scripts()}):
        for script in exported_scripts.launched_scripts(stem):
            tree = ast.parse(cell_scripts.cell_script(stem, script))
            if not joins_a_group(tree):
                continue  # a failure reproduced with plain Python (notebook 13)
            seen.add(script)
            assert not shape_problems(tree), f"{stem}: {script}: {shape_problems(tree)}"
    assert len(seen) >= 15, sorted(seen)


# ---------------------------------------------------------------- one process-group set-up

# Every taught script joins its process group one way: the setup() that CONTRIBUTING.md states
# ("Rules"), read from there; the docstring may differ, the code may not.
RULES = (exported_scripts.ROOT / "CONTRIBUTING.md").read_text()
SETUP = textwrap.dedent(
    RULES.split("joins its process group one way", 1)[1].split("```python\n", 1)[1].split("```")[0]
)

# Scripts that start their group another way on purpose, and why (the only ones allowed to).
OWN_SETUP = {
    "work/trouble_cuda0.py": "notebook 13's bug on purpose: no set_device, every rank on cuda:0",
    "work/trouble_job.py": "notebook 13's --timeout: the hang of section 6 fails in seconds",
    "work/job_accelerate.py": "notebook 06: Accelerator() starts the group, the lesson's point",
    "work/job_fabric.py": "notebook 06: Fabric.launch() starts the group, the lesson's point",
    "work/fake_layout.py": "notebook 12: torch's fake process group plans a layout, no devices",
    "work/multinode_probe.py": "notebook 14: gloo between two hosts in network namespaces",
}


def _code(function: ast.FunctionDef) -> str:
    """The function without its docstring (comments are not in the tree)."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return ast.dump(ast.FunctionDef(function.name, function.args, body, [], function.returns))


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] == name
    ]


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def setup_problems(script: str, tree: ast.Module, taught: dict[str, ast.Module]) -> list[str]:
    """How a taught script's process group set-up differs from SETUP."""
    canonical = _code(ast.parse(SETUP).body[0])
    problems = []
    setup = _functions(tree).get("setup")
    if setup is not None and _code(setup) != canonical:
        problems.append("its setup() is not the idiom")
    for function in [tree, *_functions(tree).values()]:
        if function is setup or not isinstance(function, ast.FunctionDef):
            continue
        if _calls(function, "init_process_group"):
            problems.append(f"{function.name}() calls init_process_group: call setup()")
    imported = {
        n.module: {a.name for a in n.names}
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.module in taught
    }
    if "setup" in _functions(tree) or any("setup" in names for names in imported.values()):
        return problems
    starts = _calls(tree, "init_process_group") or _calls(tree, "init_device_mesh")
    if starts:
        problems.append("defines no setup() and imports it from no taught script")
    return problems


@functools.cache
def taught_trees() -> dict[str, tuple[str, str, ast.Module, bool]]:
    """Module name -> (lesson, script, tree, launched by a cell) of every script the lessons
    write."""
    launched = functools.cache(exported_scripts.launched_scripts)
    return {
        Path(script).stem: (stem, script, ast.parse(text), script in launched(stem))
        for stem, script, text in exported_scripts.lesson_scripts()
    }


def test_every_taught_script_sets_up_its_process_group_with_the_one_idiom():
    """Issue 41: one name, the local rank read one way, set_device before
    init_process_group(backend, device_id=..., timeout=60 s) on GPUs. A script that adds one idea
    to another imports setup() (or the function that calls it) from that script."""
    trees = {name: tree for name, (_, _, tree, _) in taught_trees().items()}
    wrong, idioms = [], 0
    for stem, script, tree, launched in taught_trees().values():
        starts_group = _calls(tree, "init_process_group") or "setup" in _functions(tree)
        if script in OWN_SETUP or not (starts_group or joins_a_group(tree)):
            continue
        if launched or starts_group:
            idioms += "setup" in _functions(tree)
            wrong += [f"{stem}: {script}: {p}" for p in setup_problems(script, tree, trees)]
    assert not wrong, "\n".join(wrong)
    assert idioms >= 10, idioms  # 00-10 define it; 11 and 12 import notebook 09's


def gpu_inits_without_set_device(tree: ast.Module) -> list[str]:
    """init_process_group calls that may use NCCL and no torch.cuda.set_device before them in
    their function: every rank would open a context on cuda:0 (notebook 13, section 10)."""
    missing = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        for call in _calls(function, "init_process_group"):
            backend = call.args[0] if call.args else None
            for keyword in call.keywords:
                backend = keyword.value if keyword.arg == "backend" else backend
            if isinstance(backend, ast.Constant) and backend.value == "gloo":
                continue  # CPU only
            before = [c for c in _calls(function, "set_device") if c.lineno < call.lineno]
            if not before:
                missing.append(f"{function.name}(), line {call.lineno}")
    return missing


def test_no_gpu_script_inits_its_group_before_set_device():
    """Issue 41.2: notebook 04's scripts passed device_id= without set_device, and DataLoader's
    pin-memory thread then pinned on cuda:0 for every rank."""
    wrong = []
    for stem, script, tree, _ in taught_trees().values():
        missing = gpu_inits_without_set_device(tree)
        if missing and script not in OWN_SETUP:
            wrong.append(f"{stem}: {script}: {missing}")
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_what_they_are_for():
    """The two checks above, on scripts made wrong on purpose."""
    good = ast.parse("import os\n" + SETUP)
    assert not gpu_inits_without_set_device(good)
    assert not setup_problems("work/a.py", good, {})
    no_pin = ast.parse(SETUP.replace("torch.cuda.set_device(device)", "pass"))
    assert gpu_inits_without_set_device(no_pin) == ["setup(), line 6"]
    assert setup_problems("work/a.py", no_pin, {}) == ["its setup() is not the idiom"]
    start = ast.parse(SETUP.replace("def setup", "def start"))
    assert setup_problems("work/a.py", start, {}) == [
        "start() calls init_process_group: call setup()",
        "defines no setup() and imports it from no taught script",
    ]
    grown = ast.parse("from a import setup\n")
    assert not setup_problems("work/b.py", grown, {"a": good})
    mesh = ast.parse(
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "def main():\n    init_device_mesh('cuda', (2,))\n"
    )
    assert setup_problems("work/b.py", mesh, {"a": good})
