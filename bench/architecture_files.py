"""Every file path that README.md and docs/ name, checked against the tree: prints the ones that do not
exist (``python bench/architecture_files.py``; exit 1 when there is one). ``tests/test_docs.py`` runs the
same check, so a file moved or renamed without its docs fails the tests.

What counts as a path: a word of the text (in backticks or not) that starts with one of the repository's
top-level folders (``core/``, ``docs/``, ``bench/``, ``tests/``, ...), or that ends in ``.py`` / ``.md``
and holds a ``/`` or is a bare file name (``run/loop.py``, ``preload.py``). Docs write engine files
relative to their room (``run/loop.py`` for ``core/engine/run/loop.py``) and the package's modules under
their import name (``policyzoo/...`` for ``core/...``), so a path exists when some file or folder of the
tree ends with it, ``/``-aligned. Left out: words with a placeholder (``<slot>``, ``NAME``, ``*``,
``{...}``), web addresses, run-directory contents (``runs/...``, ``checkpoints/``) and the few paths a
command has not written yet or a guide has its reader write (:data:`NOT_IN_TREE`, each with why).
Relative Markdown links (``[text](engine.md)``) must lead to a file beside the document.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the repository's own top-level folders: a word starting with one of them is a path in this repository
TOP = ("core", "docs", "bench", "tests", "plugins", "zoo", "contrib", "requirements", ".ci")
#: paths the docs name that are rightly not in the tree (path: why)
NOT_IN_TREE = {"capped_pg.py": "the file docs/writing-a-plugin.md has its reader write"}
#: peers' files the docs cite (verl's ``core_algos.py``, HumanEval's harness): not this repository's
EXTERNAL = ("verl/", "trl/", "human_eval/", "core_algos.py")
#: a word after one of these is where a command will write, not a file of the tree
OUTPUT_OPTIONS = ("--out", "--output-dir")
WORD = re.compile(r"[A-Za-z0-9_.<>{}*/-]+")
SKIP_DIRS = {".git", ".venv", ".build", "runs", "__pycache__", "node_modules"}


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every ``docs/**/*.md``, sorted."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def tree_paths(root: Path = ROOT) -> set[str]:
    """Every file and folder of the checkout (``/``-separated, relative to ``root``), build outputs left out."""
    out: set[str] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        for p in folder.iterdir():
            if p.name in SKIP_DIRS or p.name.endswith(".egg-info"):
                continue
            out.add(p.relative_to(root).as_posix())
            if p.is_dir() and not p.is_symlink():
                stack.append(p)
    return out


def _candidate(word: str) -> str | None:
    """The path a word of the text names, or None when it names none (see the module docstring)."""
    word = word.lstrip("('\"").rstrip(".,;:)'\"")
    if (any(c in word for c in "<>{}*") or "//" in word or word.startswith(("runs/", "/", ".build/", *EXTERNAL))
            or any(re.fullmatch(r"[A-Z][A-Z_]+", part) for part in word.split("/"))):
        return None
    if word.startswith("policyzoo/"):
        word = "core/" + word[len("policyzoo/"):]
    if "/" in word and word.split("/", 1)[0] in TOP:
        return word.rstrip("/")
    if re.fullmatch(r"[\w/-]+\.(py|md)", word):
        return word
    return None


def named_paths(text: str, tree: set[str]) -> list[tuple[int, str, str | None]]:
    """``(line number, path, folder)`` for every path a document's text names, in order. ``folder`` is, for a
    bare module file name (``plan.py``), the last folder of the tree named before it on its line (`` `core/`
    (`catalog.py`, `plan.py`) `` names ``core/plan.py``), else None."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        folder, previous = None, ""
        for word in WORD.findall(line):
            path = None if previous in OUTPUT_OPTIONS else _candidate(word)
            previous = word
            if path is None:
                continue
            if word.rstrip(".,;:)'\"").endswith("/"):
                folder = path if exists(path, tree) else folder
                out.append((n, path, None))
            else:
                out.append((n, path, folder if "/" not in path and path.endswith(".py") else None))
    return out


def exists(path: str, tree: set[str], folder: str | None = None) -> bool:
    """Whether ``path`` (or the module ``path``.py) is a file or folder of ``tree``, or the ``/``-aligned end of
    one; a bare file name with a ``folder`` must be a file of that folder (of a folder ending with it)."""
    if folder is not None:
        parents = (p[:-len(path) - 1] for p in tree if p.endswith("/" + path))
        return any(parent == folder or parent.endswith("/" + folder) for parent in parents)
    return any(name in tree or any(p.endswith("/" + name) for p in tree) for name in (path, path + ".py"))


def broken_links(doc: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line number, target)`` for every relative Markdown link of ``doc`` (``[text](target)``) whose target
    is not a file or folder beside ``doc`` (the part before ``#`` checked; web addresses left out)."""
    out = []
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            target = target.split("#", 1)[0]
            if target and "://" not in target and not target.startswith("mailto:"):
                if not (doc.parent / target).exists():
                    out.append((n, target))
    return out


def stale_paths(root: Path = ROOT) -> list[str]:
    """``"FILE:LINE: PATH"`` for every path README.md and docs/ name that the tree does not have, and every
    relative link that leads nowhere."""
    tree = tree_paths(root)
    found = []
    for doc in doc_files(root):
        where = doc.relative_to(root).as_posix()
        links = broken_links(doc, root)
        for n, path, folder in named_paths(doc.read_text(), tree):
            elsewhere = any(path == p or path.startswith(p + "/") for p in NOT_IN_TREE)
            if not elsewhere and (n, path) not in links and not exists(path, tree, folder):
                found.append(f"{where}:{n}: {path}")
        found += [f"{where}:{n}: link {target}" for n, target in links]
    return found


def main() -> int:
    stale = stale_paths()
    print("\n".join(stale) if stale else "every path README.md and docs/ name exists")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
