"""The house by job, as rules on the imports (every module's AST, function-level imports counted).

Layers, lowest first: ``errors`` <- ``contract`` <- ``step`` <- building a run (``catalog``, ``assembly``,
``config``, ``settings``, ``host``, ``data``, ``plan``; then ``plugins``/``zoo``, which import only the contract,
errors and data) <- ``engine`` <- the top (``api``, ``cli``, ``testing``, the package root). A module imports only
its own layer or lower ones; inside the contract one direction (ground <- batch/policy_protocol/components <-
slots <- baselines <- hookspecs); inside the engine ``rollout/`` and ``trainer/`` never import each other, ``report/``
uses only ``rundir`` and ``dist``, and the engine root no room. No cycle among policyzoo modules, and a
function-level policyzoo import only of the three legitimate kinds. The file map in docs/engine.md,
README's folders and pyproject's package list stay equal to the tree.

Modules by job (issue 49): one import path per name (no re-export shims; a package's ``__init__.py`` is
its public face and may gather its modules' names, any other module offers only what it defines), no
module under ~60 lines split from a sibling, and no ``__getattr__`` delegation (a wrapper writes out
every method of the protocol it shares with what it wraps). Files over 300 lines and functions over 50
are printed as warnings to look at, not failures.
"""

from __future__ import annotations

import ast
import inspect
import re
import shutil
import tomllib
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"core": "policyzoo", "plugins": "policyzoo.plugins", "zoo": "policyzoo.zoo"}
#: the old public paths, kept one release as re-exports (nothing of the project imports them)
REMOVED = ("hookspecs", "slots", "batch", "components", "policy", "stats", "runstate")  # removed: CHANGELOG.md
BUILD = ("policyzoo.catalog", "policyzoo.assembly", "policyzoo.run_config", "policyzoo.conventions", "policyzoo.data",
         "policyzoo.plan", "policyzoo.config_sections", "policyzoo.resolve", "policyzoo.rules", "policyzoo.native_bf16",
         "policyzoo.equivalence")
CONTRACT_LEVEL = {"ground": 0, "batch": 0, "runstate": 0, "untrusted": 0, "stats": 1, "components": 1,
                  "policy_protocol": 1, "slots": 2, "baselines": 2.5, "hookspecs": 3, "": 4}
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
                why = ("inside the contract imports run ground <- batch/policy_protocol/components <- slots <- "
                       "baselines <- hookspecs")
        elif layer(d) > layer(s) and not (e.in_function and legitimate_lazy(e)):
            why = f"an upward import (layer {layer(s)} -> {layer(d)})"
        elif _under(s, "policyzoo.engine.rollout") and _under(d, "policyzoo.engine.trainer") or \
                _under(s, "policyzoo.engine.trainer") and _under(d, "policyzoo.engine.rollout"):
            why = "rollout/ and trainer/ never import each other (they meet in engine/lm_policy.py)"
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
    _plant(root, "core/engine/rollout/vllm_engine.py", "from policyzoo.engine.trainer import lora  # planted")
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


# ----------------------------------------------------------------------------- modules by job (issue 49, item 4)
#: a module shorter than this whose one importer is a sibling is a piece of that sibling's job
SMALL_MODULE_LINES = 60
#: the folders whose imports count: the package, the plugin distributions, the tests and the benchmarks
IMPORTERS = ("core", "plugins", "zoo", "contrib", "tests", "bench")


def _defined(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (def, class, assignment; also under a top-level if/try)."""
    out = set()
    for node in tree.body:
        for sub in ([node] if not isinstance(node, (ast.If, ast.Try)) else ast.walk(node)):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(sub.name)
            elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _dunder_all(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


def _imports_from(tree: ast.Module, path: Path, module: str | None) -> list[tuple[ast.ImportFrom, str]]:
    """Every ``from X import ...`` of ``tree`` (the file ``path``) with X resolved to a policyzoo module name
    (a relative import resolved against ``module``, the file's own name; files outside the package have none)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            if module is None:
                continue
            parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
        if _under(base, "policyzoo"):
            out.append((node, base))
    return out


def reexport_problems(root: Path) -> list[str]:
    """Every re-export shim, as ``file:line name: why``. One import path per public name: a name is imported
    from the module that defines it. A package's ``__init__.py`` is its public face (``policyzoo``,
    ``policyzoo.contract``, ``policyzoo.step``, ``policyzoo.testing``: the paths the docs show) and may
    gather its modules' names; any other module re-exports when it imports a policyzoo name it never uses
    or lists an imported name in its ``__all__`` (the shim's side), and an import of a name from a module
    (not a package) that does not define it goes through a shim (the importer's side)."""
    files = module_files(root)
    name_of = {path: name for name, path in files.items()}
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in files.items()}
    modules = {name for name, path in files.items() if path.name != "__init__.py"}
    bad = []
    for name in sorted(modules):
        tree, rel = trees[name], files[name].relative_to(root)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        exported = _dunder_all(tree)
        for node, base in _imports_from(tree, files[name], name):
            if node not in tree.body:  # a function-level import is a use
                continue
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{base}.{alias.name}" in files:  # a submodule, imported as such
                    continue
                if local not in used:
                    bad.append(f"{rel}:{node.lineno} {local}: imported from {base} and unused here, a re-export shim: "
                               f"import it from {base} where it is needed")
                elif local in exported:
                    bad.append(f"{rel}:{node.lineno} {local}: in __all__ but defined in {base}: a second import "
                               "path; drop it from __all__")
    defined = {name: _defined(trees[name]) for name in modules}
    for folder in IMPORTERS:
        for path in sorted((root / folder).rglob("*.py")):
            for node, base in _imports_from(ast.parse(path.read_text(), str(path)), path, name_of.get(path)):
                for alias in node.names if base in modules else ():
                    if alias.name not in defined[base] and f"{base}.{alias.name}" not in files:
                        bad.append(f"{path.relative_to(root)}:{node.lineno} {alias.name}: imported from {base}, which "
                                   "does not define it: import it from the module that does")
    return bad


def split_problems(root: Path) -> list[str]:
    """Every module under :data:`SMALL_MODULE_LINES` lines split from a sibling: its only importer (in
    core/, plugins/, zoo/, contrib/, tests/ or bench/, function-level imports counted) is one other module
    of its own package, not the package's ``__init__``; it holds part of that module's job. A short module
    that a test or another room imports, or that a package gathers (a plugin, a zoo bundle), has a job
    of its own."""
    files = module_files(root)
    name_of = {path: name for name, path in files.items()}
    users: dict[str, set[str]] = {}
    for folder in IMPORTERS:
        for path in sorted((root / folder).rglob("*.py")):
            me, tree = name_of.get(path, str(path.relative_to(root))), ast.parse(path.read_text(), str(path))
            targets = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            targets += [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                        for node, base in _imports_from(tree, path, name_of.get(path)) for a in node.names]
            for t in targets:
                if t in files and t != me:
                    users.setdefault(t, set()).add(me)
    bad = []
    for name, path in sorted(files.items()):
        n = len(path.read_text().splitlines())
        if path.name == "__init__.py" or n >= SMALL_MODULE_LINES or len(users.get(name, ())) != 1:
            continue
        (user,) = users[name]
        if user in files and files[user].name != "__init__.py" and user.rsplit(".", 1)[0] == name.rsplit(".", 1)[0]:
            bad.append(f"{path.relative_to(root)}: {n} lines, imported only by its sibling {user}: merge it there")
    return bad


def test_no_reexport_shims_one_import_path_per_name():
    assert reexport_problems(ROOT) == []


def test_no_module_split_from_a_sibling_under_60_lines():
    assert split_problems(ROOT) == []


def test_planted_shims_and_a_planted_split_fail(tmp_path):
    root = _copy(tmp_path)
    for folder in ("tests", "bench"):
        (root / folder).mkdir()
    # a shim: catalog.py imports a name it does not use and lists another imported name in __all__
    _plant(root, "core/catalog.py", "from .resolve import resolved_view  # planted\n__all__ = ['Catalog', 'Spec']")
    # an importer going through a shim: Rollout is defined in contract/batch.py, not contract/slots.py
    (root / "tests" / "test_planted.py").write_text("from policyzoo.contract.slots import Rollout\n")
    # a 3-line module whose one importer is its sibling learn.py
    (root / "core" / "step" / "planted_piece.py").write_text("def piece():\n    return 1\n\n")
    _plant(root, "core/step/learn.py", "from .planted_piece import piece  # planted")
    problems = reexport_problems(root)
    assert any(p.startswith("core/catalog.py:") and " resolved_view: imported from policyzoo.resolve and unused" in p
               for p in problems)
    assert any(p.startswith("core/catalog.py:") and " Spec: in __all__ but defined in policyzoo.contract" in p
               for p in problems)
    assert "tests/test_planted.py:1 Rollout: imported from policyzoo.contract.slots, which does not define it: " \
           "import it from the module that does" in problems
    # the package faces gather names without being shims: contract/__init__.py imports Rollout from .batch
    assert not any(p.startswith("core/contract/__init__.py") for p in problems)
    planted = [p for p in split_problems(root) if "planted" in p]  # (the copy has no tests importing the others)
    assert planted == ["core/step/planted_piece.py: 3 lines, imported only by its sibling policyzoo.step.learn: "
                       "merge it there"]
    # the same module also imported by a test has a job of its own (it is tested on its own)
    (root / "tests" / "test_piece.py").write_text("from policyzoo.step.planted_piece import piece\n")
    assert not any("planted" in p for p in split_problems(root))


# ----------------------------------------------------------------------------- no hidden delegation (issue 49, item 2)
#: each wrapper and the protocol it satisfies with a def of every member, the wrapped engines' too
WRAPPERS = {
    "policyzoo.engine.ahead.passthrough:PassThrough": "policyzoo.contract:Policy",
    "policyzoo.engine.ahead.overlap:OverlapPolicy": "policyzoo.contract:Policy",
    "policyzoo.engine.ahead.async_sampler:AsyncSampler": "policyzoo.contract:Policy",
    "policyzoo.engine.ahead.async_sampler:_Recorder": "policyzoo.contract:Policy",
    "policyzoo.engine.rollout.tensor_parallel:GroupRollout": "policyzoo.engine.rollout.engine_base:RolloutEngine",
}
#: ``__getattr__`` that hides no method: the Python API's reward registry (a name it does not hold is a
#: callable of another process: a UserError saying so); a package's module-level PEP 562 lazy import is
#: its public face (policyzoo.testing)
GETATTR_ALLOWED = ("core/api.py:_Registry",)


def _load(ref: str):
    import importlib

    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def protocol_members(proto) -> set[str]:
    """The public methods and attributes a ``typing.Protocol`` declares (its own and its bases')."""
    out = set()
    for k in proto.__mro__:
        if k.__module__.startswith("policyzoo"):
            out |= {n for n in (*vars(k), *getattr(k, "__annotations__", {})) if not n.startswith("_")}
    return out


def delegation_problems(cls, proto) -> list[str]:
    """What hides a member of ``proto`` in ``cls``: a ``__getattr__`` / ``__getattribute__`` in its classes,
    or a member no class of its own (its policyzoo bases counted) defines."""
    own = [k for k in cls.__mro__ if k.__module__.startswith("policyzoo")]
    bad = [f"{k.__name__} defines {d}" for k in own for d in ("__getattr__", "__getattribute__") if d in vars(k)]
    return bad + [f"{cls.__name__} has no def of {m}" for m in sorted(protocol_members(proto))
                  if not any(m in vars(k) for k in own)]


def getattr_problems(root: Path) -> list[str]:
    """Every ``def __getattr__`` / ``__getattribute__`` of a class in core/, plugins/, zoo/ or contrib/ (not in
    :data:`GETATTR_ALLOWED`) and every module-level one outside a package's ``__init__.py``."""
    bad = []
    for folder in ("core", "plugins", "zoo", "contrib"):
        for path in sorted((root / folder).rglob("*.py")):
            rel, tree = path.relative_to(root).as_posix(), ast.parse(path.read_text(), str(path))
            for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
                for f in cls.body:
                    if isinstance(f, ast.FunctionDef) and f.name in ("__getattr__", "__getattribute__") and \
                            f"{rel}:{cls.name}" not in GETATTR_ALLOWED:
                        bad.append(f"{rel}:{f.lineno} {cls.name}.{f.name}: name the methods it passes on")
            bad += [f"{rel}:{f.lineno} module-level {f.name} outside a package's __init__" for f in tree.body
                    if isinstance(f, ast.FunctionDef) and f.name == "__getattr__" and path.name != "__init__.py"]
    return bad


def test_every_wrapper_defines_its_protocol():
    for wrapper, proto in WRAPPERS.items():
        assert delegation_problems(_load(wrapper), _load(proto)) == [], wrapper
    assert protocol_members(_load("policyzoo.contract:Policy")) >= {
        "collective", "sampling_options", "generate", "logprobs", "ref_logprobs", "sum_pi_squared", "values",
        "backward", "optimizer_step", "sync", "reduce_totals"}
    # the wrapped engines define the same methods (info and tokenizer are set by their __init__)
    methods = protocol_members(_load("policyzoo.engine.rollout.engine_base:RolloutEngine")) - {"info", "tokenizer"}
    assert methods == {"generate", "greedy", "generate_tokens", "load_weights", "score", "score_next"}
    for engine in ("policyzoo.engine.rollout.vllm_engine:VLLMRollout", "policyzoo.engine.rollout.hf:HFRollout",
                   "policyzoo.engine.rollout.server:ServerRollout"):
        assert [m for m in sorted(methods) if not hasattr(_load(engine), m)] == [], engine


def test_no_getattr_delegation_in_the_tree():
    assert getattr_problems(ROOT) == []


def test_planted_delegation_fails(tmp_path):
    class Proto(typing.Protocol):
        size: int

        def load_weights(self, named_tensors) -> None: ...

    Proto.__module__ = Wrapper.__module__ = Explicit.__module__ = "policyzoo.planted"
    assert delegation_problems(Wrapper, Proto) == ["Wrapper defines __getattr__", "Wrapper has no def of load_weights",
                                                   "Wrapper has no def of size"]
    assert delegation_problems(Explicit, Proto) == []
    root = _copy(tmp_path)
    rel = "core/engine/ahead/overlap.py"
    _plant(root, rel, "class Planted:\n    def __getattr__(self, name):\n        return name")
    line = _lines(root, rel) - 1  # the planted def is the file's second-to-last line
    assert getattr_problems(root) == [f"{rel}:{line} Planted.__getattr__: name the methods it passes on"]


class Wrapper:  # the hidden kind: load_weights and size reach the inner engine only through __getattr__
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Explicit:  # the named kind
    def __init__(self, inner):
        self.inner = inner

    @property
    def size(self) -> int:
        return self.inner.size

    def load_weights(self, named_tensors) -> None:
        self.inner.load_weights(named_tensors)


def _lines(root: Path, rel: str) -> int:
    return len((root / rel).read_text().splitlines())


# ----------------------------------------------------------------------------- sizes: a warning to look (issue 49)
MAX_FILE_LINES, MAX_FUNCTION_LINES = 300, 50


class SizeWarning(UserWarning):
    """A long module or function: a prompt to look whether it holds one job, not a rule to satisfy."""


def size_warnings(root: Path) -> list[str]:
    """Every module of core/, plugins/ and zoo/ longer than MAX_FILE_LINES lines and every function or
    method longer than MAX_FUNCTION_LINES (``end_lineno - lineno + 1``: from its ``def`` line to its last
    line, decorators not counted), as ``path[:line]: why``."""
    out = []
    for path in module_files(root).values():
        rel, text = path.relative_to(root), path.read_text()
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            out.append(f"{rel}: {n} lines, over {MAX_FILE_LINES}: does it hold one job?")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    out.append(f"{rel}:{node.lineno} {node.name}: {n} lines, over {MAX_FUNCTION_LINES}: does it read "
                               "top to bottom?")
    return sorted(out)


def test_long_files_and_functions_are_printed_to_look_at():
    found = size_warnings(ROOT)
    for line in found:  # printed (pytest -s) and in pytest's warnings summary; never a failure
        print(f"layout: {line}")
        warnings.warn(line, SizeWarning, stacklevel=1)
    assert all(": " in line and " lines, over " in line for line in found)


def test_planted_long_file_and_function_are_found_and_the_limits_pass(tmp_path):
    root = _copy(tmp_path)
    fifty, forty_nine = "    x = 0\n" * 50, "    x = 0\n" * 49
    # a def line + 50 body lines = 51 lines (over); a def line + 49 = 50 (the limit, passes)
    (root / "core" / "planted_long_def.py").write_text(f"def long():\n{fifty}\n\ndef fits():\n{forty_nine}")
    # 301 lines (over) and 300 lines (the limit) of one statement each
    (root / "plugins" / "kl" / "planted_301.py").write_text("y = 0\n" * 301)
    (root / "zoo" / "planted_300.py").write_text("y = 0\n" * 300)
    found = size_warnings(root)
    assert "core/planted_long_def.py:1 long: 51 lines, over 50: does it read top to bottom?" in found
    assert not any("planted_long_def.py" in p and " fits:" in p for p in found)
    assert "plugins/kl/planted_301.py: 301 lines, over 300: does it hold one job?" in found
    assert not any("planted_300.py" in p for p in found)


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
