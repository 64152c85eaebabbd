"""The house by job, as rules on the imports (every module's AST, function-level imports counted).

Layers, lowest first: ``errors`` <- ``contract`` <- ``step`` <- building a run (``catalog``, ``assembly``,
``config``, ``settings``, ``host``, ``data``, ``plan``; then ``plugins``/``zoo``, which import only the contract,
errors and data) <- ``engine`` <- the top (``api``, ``cli``, ``testing``, the package root). A module imports only
its own layer or lower ones; inside the contract one direction (ground <- batch/policy/components <-
slots <- hookspecs); inside the engine ``rollout/`` and ``trainer/`` never import each other, ``report/``
uses only ``rundir`` and ``dist``, and the engine root no room. No cycle among policyzoo modules, and a
function-level policyzoo import only of the three legitimate kinds. The file map in docs/engine.md,
README's folders and pyproject's package list stay equal to the tree.
"""

from __future__ import annotations

import ast
import inspect
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"core": "policyzoo", "plugins": "policyzoo.plugins", "zoo": "policyzoo.zoo"}
#: the old public paths, kept one release as re-exports (nothing of the project imports them)
REMOVED = ("hookspecs", "slots", "batch", "components", "policy", "stats", "runstate")  # removed: CHANGELOG.md
BUILD = ("policyzoo.catalog", "policyzoo.assembly", "policyzoo.config", "policyzoo.conventions", "policyzoo.data",
         "policyzoo.plan", "policyzoo.settings", "policyzoo.resolve", "policyzoo.run_config", "policyzoo.rules",
         "policyzoo.host", "policyzoo.conformance", "policyzoo.equivalence")
CONTRACT_LEVEL = {"ground": 0, "batch": 0, "runstate": 0, "untrusted": 0, "stats": 1, "components": 1, "policy": 1,
                  "loss_slots": 1.5, "slots": 2, "baselines": 2, "hookspecs": 3, "": 4}
ROOMS = ("rollout", "ahead", "trainer", "sync", "run", "report")


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    where: str  # file:line
    in_function: bool


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_files(root: Path) -> dict[str, Path]:
    """``{module name: file}`` of every policyzoo module under ``root`` (core/, plugins/, zoo/)."""
    out = {}
    for folder, pkg in ROOTS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def edges(root: Path, files: dict[str, Path] | None = None, package: str = "") -> list[Edge]:
    """Every import of a policyzoo module by a module in ``files``: ``from A import b`` is an edge to
    ``A.b`` when that is a module, else to ``A``; relative imports are resolved."""
    files = files if files is not None else module_files(root)
    known = set(module_files(root)) | set(files)
    out = []
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inner = {id(sub) for f in funcs for sub in ast.walk(f)}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if is_pkg else name.split(".")[:-1]
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for t in targets:
                if _under(t, "policyzoo") or (package and _under(t, package)):
                    out.append(Edge(name, t, f"{path.relative_to(root)}:{node.lineno}", id(node) in inner))
    return out


def layer(mod: str) -> float:
    if _under(mod, "policyzoo.errors"):
        return 0
    if _under(mod, "policyzoo.contract"):
        return 1
    if _under(mod, "policyzoo.step"):
        return 2
    if _under(mod, *BUILD):
        return 3
    if _under(mod, "policyzoo.plugins", "policyzoo.zoo"):
        return 3.5
    if _under(mod, "policyzoo.engine"):
        return 4
    return 5  # api, cli, testing, the package root


def legitimate_lazy(e: Edge) -> bool:
    """The three kinds of function-level import: the CLI's sub-commands (each loads what it runs); the
    catalog loading the plugins and the zoo; keeping the engine (and with it torch-heavy start-up,
    vLLM, DeepSpeed, transformers) out of ``import policyzoo`` and out of the pytest plugin that every
    test session of the environment loads."""
    if e.src == "policyzoo.cli":
        return True
    if e.src == "policyzoo.catalog" and _under(e.dst, "policyzoo.plugins", "policyzoo.zoo"):
        return True
    return (e.src == "policyzoo.api" and _under(e.dst, "policyzoo.engine")) or e.src == "policyzoo.testing.plugin"


def rule_problems(es: list[Edge]) -> list[str]:
    """Every edge that breaks a rule, as ``file:line src -> dst: why``."""
    bad = []
    for e in es:
        s, d = e.src, e.dst
        why = None
        if not _under(s, "policyzoo") and not _under(d, "policyzoo.contract", "policyzoo.errors", "policyzoo.data"):
            why = "a plugin distribution imports only policyzoo.contract, policyzoo.errors and policyzoo.data"
        elif _under(s, "policyzoo.plugins", "policyzoo.zoo") and not _under(
                d, "policyzoo.contract", "policyzoo.errors", "policyzoo.data", s.split(".")[0] + "." + s.split(".")[1]):
            why = "plugins and the zoo import only policyzoo.contract, policyzoo.errors and policyzoo.data"
        elif _under(s, "policyzoo.contract") and _under(d, "policyzoo.contract"):
            a, b = s.split(".")[2:3] or [""], d.split(".")[2:3] or [""]
            if CONTRACT_LEVEL[b[0]] >= CONTRACT_LEVEL[a[0]] and s != d:
                why = "inside the contract imports run ground <- batch/policy/components <- slots <- hookspecs"
        elif layer(d) > layer(s) and not (e.in_function and legitimate_lazy(e)):
            why = f"an upward import (layer {layer(s)} -> {layer(d)})"
        elif _under(s, "policyzoo.engine.rollout") and _under(d, "policyzoo.engine.trainer") or \
                _under(s, "policyzoo.engine.trainer") and _under(d, "policyzoo.engine.rollout"):
            why = "rollout/ and trainer/ never import each other (they meet in engine/policy.py)"
        elif _under(s, "policyzoo.engine.report") and _under(d, "policyzoo.engine") and not _under(
                d, "policyzoo.engine.report", "policyzoo.engine.rundir", "policyzoo.engine.dist"):
            why = "report/ uses only rundir and dist of the engine"
        elif _under(s, "policyzoo.engine") and not any(_under(s, f"policyzoo.engine.{r}") for r in ROOMS) and \
                any(_under(d, f"policyzoo.engine.{r}") for r in ROOMS):
            why = "the engine root holds what every room uses and imports no room"
        elif e.in_function and not legitimate_lazy(e):
            why = "a function-level import that is none of the three legitimate kinds: import at the top"
        if why:
            bad.append(f"{e.where} {s} -> {d}: {why}")
    return bad


def cycles(es: list[Edge]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module)."""
    graph: dict[str, set[str]] = {}
    for e in es:
        if e.src != e.dst:
            graph.setdefault(e.src, set()).add(e.dst)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def layout_problems(root: Path) -> list[str]:
    es = edges(root)
    for src in sorted((root / "contrib").glob("*/src/*")):  # the plugin distributions beside the repo
        files = {".".join([src.name, *p.relative_to(src).with_suffix("").parts]).removesuffix(".__init__"): p
                 for p in src.rglob("*.py")}
        es += [e for e in edges(root, files, src.name) if _under(e.dst, "policyzoo")]
    return rule_problems(es) + [f"import cycle: {' <-> '.join(c)}" for c in cycles(es)]


# ----------------------------------------------------------------------------- the rules hold
def test_the_tree_keeps_every_rule():
    assert layout_problems(ROOT) == []


def test_no_import_cycle_counting_function_level_imports():
    es = edges(ROOT)
    assert any(e.in_function for e in es)  # function-level imports are in the graph
    assert cycles(es) == []


def _copy(tmp_path: Path) -> Path:
    for folder in ("core", "plugins", "zoo", "contrib"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return tmp_path


def _plant(root: Path, rel: str, line: str) -> None:
    path = root / rel
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_a_planted_upward_import_fails(tmp_path):
    root = _copy(tmp_path)
    _plant(root, "core/contract/ground.py", "from policyzoo.engine import dist  # planted")
    problems = layout_problems(root)
    assert any("core/contract/ground.py" in p and "policyzoo.engine.dist" in p and "upward" in p for p in problems)


def test_planted_room_crossing_lazy_import_and_cycle_fail(tmp_path):
    root = _copy(tmp_path)
    _plant(root, "core/engine/rollout/engines.py", "from policyzoo.engine.trainer import lora  # planted")
    _plant(root, "core/step/collect.py", "def _planted():\n    from policyzoo.step import learn\n    return learn")
    _plant(root, "plugins/kl/__init__.py", "from policyzoo.step import boundary  # planted")
    problems = layout_problems(root)
    assert any("rollout/ and trainer/" in p for p in problems)
    assert any("core/step/collect.py" in p and "function-level" in p for p in problems)
    assert any(p.startswith("import cycle:") and "policyzoo.step.collect" in p for p in problems)
    assert any("plugins/kl/__init__.py" in p and "plugins and the zoo" in p for p in problems)


def test_contract_direction_is_enforced(tmp_path):
    root = _copy(tmp_path)
    _plant(root, "core/contract/batch.py", "from policyzoo.contract.slots import Sample  # planted")
    problems = layout_problems(root)
    assert any("core/contract/batch.py" in p and "inside the contract" in p for p in problems)


# ----------------------------------------------------------------------------- the maps equal the tree
def _tree() -> set[str]:
    out = {"core/"}
    for path in (ROOT / "core").rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if "__pycache__" in rel:
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            out.add(rel + "/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            out.add(rel)
    return out


def test_docs_engine_lists_every_folder_and_file_once():
    text = (ROOT / "docs" / "engine.md").read_text()
    section = text.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([^`]+)` \|", section, re.M)
    assert len(listed) == len(set(listed)), "a path is listed twice"
    assert set(listed) == _tree()


def test_readme_map_names_every_room():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    for room in ("core/contract/", "core/step/", "core/engine/", "rollout/", "ahead/", "trainer/", "run/", "report/",
                 "core/testing/", "plugins/", "zoo/", "contrib/"):
        assert f"`{room}`" in section, room


def test_pyproject_packages_every_package_folder():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {name for name, path in module_files(ROOT).items() if path.name == "__init__.py"}
    assert listed == found


# ----------------------------------------------------------------------------- the old paths are gone
def test_the_removed_paths_are_gone_and_the_contract_has_their_names():
    import importlib

    import pytest

    import policyzoo.contract as contract
    import policyzoo.step

    for old in REMOVED:  # deprecated for one release, removed (CHANGELOG.md)
        assert not (ROOT / "core" / f"{old}.py").exists()
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"policyzoo.{old}")
    for name in ("Spec", "hookimpl", "Keep", "SLOTS", "LOCAL", "Clip", "Reward", "BASES", "Rollout", "StepBatch",
                 "Bundle", "use", "Component", "Policy", "Generated", "whiten", "moments"):
        assert hasattr(contract, name), name
    assert hasattr(contract.runstate, "current")
    assert policyzoo.step.train_step.__module__ == "policyzoo.step.learn"  # policyzoo.step is the step package


def test_plugins_are_one_package_per_slot():
    from policyzoo.contract import SLOTS

    flat = sorted(p.name for p in (ROOT / "plugins").glob("*.py") if p.name != "__init__.py")
    assert flat == [], "a slot's components live in plugins/<slot>/"
    packages = {p.parent.name for p in (ROOT / "plugins").glob("*/__init__.py")}
    assert packages == set(SLOTS), packages ^ set(SLOTS)


def test_one_step_function_composes_the_phases():
    # sync, one-step overlap and asynchronous sampling are ways of producing the batch (an Ahead given to
    # train_step), never a step function of their own: only core/step/ calls collect() and learn()
    calls = re.compile(r"(?<![\w.])(collect|learn)\(")
    outside = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "core").rglob("*.py") if "step" not in p.parent.name
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if calls.search(line) and not line.lstrip().startswith(("def ", "#"))]
    assert outside == []
    from policyzoo.step import train_step

    assert "ahead" in inspect.signature(train_step).parameters


# ----------------------------------------------------------------------------- sizes (issue 33)
MAX_FILE_LINES, MAX_FUNCTION_LINES = 300, 50


def size_problems(root: Path) -> list[str]:
    """Every module of core/, plugins/ and zoo/ longer than MAX_FILE_LINES lines and every function or
    method longer than MAX_FUNCTION_LINES (``end_lineno - lineno + 1``: from its ``def`` line to its last
    line, decorators not counted), as ``path[:line]: why``."""
    bad = []
    for path in module_files(root).values():
        rel, text = path.relative_to(root), path.read_text()
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            bad.append(f"{rel}: {n} lines, over {MAX_FILE_LINES}: split it by job")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    bad.append(f"{rel}:{node.lineno} {node.name}: {n} lines, over {MAX_FUNCTION_LINES}: "
                               "split it into helpers")
    return bad


def test_no_file_over_300_lines_and_no_function_over_50_lines():
    assert size_problems(ROOT) == []


def test_planted_long_file_and_function_fail_and_the_limits_pass(tmp_path):
    root = _copy(tmp_path)
    fifty, forty_nine = "    x = 0\n" * 50, "    x = 0\n" * 49
    # a def line + 50 body lines = 51 lines (over); a def line + 49 = 50 (the limit, passes)
    (root / "core" / "planted_long_def.py").write_text(f"def long():\n{fifty}\n\ndef fits():\n{forty_nine}")
    # 301 lines (over) and 300 lines (the limit) of one statement each
    (root / "plugins" / "kl" / "planted_301.py").write_text("y = 0\n" * 301)
    (root / "zoo" / "planted_300.py").write_text("y = 0\n" * 300)
    problems = size_problems(root)
    assert "core/planted_long_def.py:1 long: 51 lines, over 50: split it into helpers" in problems
    assert not any("planted_long_def.py" in p and " fits:" in p for p in problems)
    assert "plugins/kl/planted_301.py: 301 lines, over 300: split it by job" in problems
    assert not any("planted_300.py" in p for p in problems)


# ----------------------------------------------------------------------------- the run loop (issue 33, item 2)
def run_room_problems(root: Path) -> list[str]:
    """In core/engine/run/: every ``getattr(self`` (an attribute that may not exist: the session and the
    loop make theirs in their ``__init__``) and every function over 50 lines (``def`` line to last line)."""
    bad = []
    for path in sorted((root / "core" / "engine" / "run").glob("*.py")):
        rel, text = path.relative_to(root).as_posix(), path.read_text()
        bad += [f"{rel}:{i}: getattr(self" for i, line in enumerate(text.splitlines(), 1) if "getattr(self" in line]
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50:
                bad.append(f"{rel}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    return bad


def test_the_run_room_has_no_getattr_self_and_no_long_function():
    assert run_room_problems(ROOT) == []


def test_planted_getattr_self_and_long_function_in_the_run_room_fail(tmp_path):
    root = _copy(tmp_path)
    body50, body49 = "    x = 0\n" * 50, "    x = 0\n" * 49
    # line 1: a def with a getattr(self ...) default; lines 3-53: def + 50 body lines = 51 (over);
    # lines 55-104: def + 49 = 50 lines (the limit, passes)
    (root / "core" / "engine" / "run" / "planted.py").write_text(
        f"def f(self): return getattr(self, 'x', 0)\n\ndef long():\n{body50}\ndef fits():\n{body49}")
    assert sorted(p for p in run_room_problems(root) if "planted.py" in p) == [
        "core/engine/run/planted.py:1: getattr(self", "core/engine/run/planted.py:3 long: 51 lines"]
