"""The sandbox's filesystem view: the few host paths a Python interpreter needs, read-only, and
nothing else.

A program in the sandbox starts in an empty root (bubblewrap's own tmpfs, remounted read-only).
Into it :func:`view` binds, each read-only at its own path:

==========================  ====================================================================
what                        why
==========================  ====================================================================
the interpreter's file      the program to run (its real path; symlinks to it are recreated)
its standard library        ``sysconfig``'s ``stdlib`` and ``platstdlib`` (``lib-dynload`` inside)
its shared libraries        the files ``ldd`` names for the interpreter and every extension module
                            of ``lib-dynload``, the dynamic loader among them
``/etc/ld.so.cache``        the loader's index of those libraries (paths only, no secrets)
a venv's ``pyvenv.cfg``     when the interpreter is a venv's: Python reads it to find its home
top-level symlinks          ``/bin -> usr/bin``, ``/lib -> usr/lib``, ... as on the host (merged /usr)
``sandbox.ro_paths``        only the paths the user names (e.g. a venv with numpy), nothing implied
==========================  ====================================================================

Not bound: ``$HOME`` (so no ``~/.netrc``, ``~/.cache/huggingface/token``), ``/home``, ``/root``,
``/srv``, ``/mnt``, ``/opt``, ``/sys``, the rest of ``/etc`` (``passwd`` included), the project
checkout, the run directory, the site-packages of the interpreter. ``/proc`` is the sandbox's own
(a new PID namespace: it shows only the sandbox's processes), ``/dev`` a minimal one, ``/tmp`` a
sized tmpfs (:mod:`policyzoo.plugins.env.sandbox`).

:func:`view` raises :class:`SandboxError` (a ``UserError``) for an
interpreter that cannot be probed and for an ``ro_paths`` entry that is not an absolute,
existing path other than ``/``.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import lru_cache

from policyzoo.errors import UserError

TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PROBE = ("import json, os, sys, sysconfig; p = sysconfig.get_paths(); print(json.dumps({'exe': sys.executable, "
          "'prefix': sys.prefix, 'base_prefix': sys.base_prefix, 'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'],"
          " 'dynload': [d for d in sys.path if d.endswith('lib-dynload')]}))")


class SandboxError(UserError):
    """The sandbox cannot run here (bubblewrap missing, user namespaces refused, an interpreter
    that cannot be probed) or is configured wrong (``ro_paths``, ``tmp_mb``)."""


def _error(what: str, why: str, fix: str) -> UserError:
    return SandboxError(what, why, fix)


def _probe(python: str) -> dict:
    """What the interpreter says of itself (its own ``-I -S`` run on the host: no site, no user code)."""
    try:
        out = subprocess.run([python, "-I", "-S", "-c", _PROBE], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin"}, check=True).stdout
        return json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise _error("env: python_sandbox: python", f"cannot run the sandbox's interpreter {python!r}: {e}",
                     "give an existing Python 3 interpreter readable by every user (default /usr/bin/python3)")


def _libraries(files: list[str]) -> set[str]:
    """The shared libraries ``ldd`` names for ``files`` (the loader included)."""
    if not files:
        return set()
    out = subprocess.run(["ldd", *files], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    libs = set()
    for line in out.splitlines():
        line = line.strip()
        if "=>" in line:
            line = line.split("=>", 1)[1].strip()
        path = line.split(" (", 1)[0].strip()
        if path.startswith("/") and os.path.exists(path):
            libs.add(path)
    return libs


def _links_to(path: str) -> list[tuple[str, str]]:
    """``(target, link)`` for each symlink met while resolving ``path``'s last component (the
    directories above it resolved), so the path works inside the sandbox as on the host."""
    links = []
    path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    for _ in range(40):  # the kernel's own bound on a symlink chain
        if not os.path.islink(path):
            break
        target = os.readlink(path)
        links.append((target, path))
        nxt = target if os.path.isabs(target) else os.path.join(os.path.dirname(path), target)
        path = os.path.join(os.path.realpath(os.path.dirname(nxt)), os.path.basename(nxt))
    return links


HIDDEN = ("/tmp", "/proc", "/dev")  # the sandbox's own: a path under them would be covered, not shown


def check_ro_paths(ro_paths) -> tuple[str, ...]:
    """``ro_paths`` as a tuple of absolute, existing paths (as given, normalised); raises for any
    other entry, for one that resolves (symlinks followed) to ``/``, and for one under the sandbox's
    own ``/tmp``, ``/proc`` or ``/dev``. The view binds each entry's resolved path and links the given
    path to it."""
    out = []
    for p in ro_paths:
        if not isinstance(p, str) or not os.path.isabs(p):
            raise _error(f"env: python_sandbox: ro_paths: {p!r}", "each entry must be an absolute path",
                         "name the folder the program needs, e.g. ro_paths: [/opt/venvs/numpy]")
        if not os.path.exists(p):
            raise _error(f"env: python_sandbox: ro_paths: {p}", "the path does not exist", "fix the path or drop it")
        given, real = "/" + os.path.normpath(p).lstrip("/"), os.path.realpath(p)
        if real == "/":
            raise _error(f"env: python_sandbox: ro_paths: {p}", "it resolves to / (the whole host filesystem)",
                         "name only the folder the program needs, e.g. ro_paths: [/opt/venvs/numpy]")
        for path in (given, real):
            if any(path == h or path.startswith(h + "/") for h in HIDDEN):
                raise _error(f"env: python_sandbox: ro_paths: {p}", f"{path} lies under the sandbox's own "
                             f"{', '.join(HIDDEN)}, which cover it", "move it elsewhere, e.g. under /opt or /srv")
        out.append(given)
    return tuple(out)


@lru_cache(maxsize=16)
def view(python: str, ro_paths: tuple[str, ...] = ()) -> tuple[str, ...]:
    """bubblewrap arguments that build the view (module docstring) for ``python`` plus
    ``ro_paths``: ``--ro-bind SRC DEST`` and ``--symlink TARGET LINK`` pairs, parents before children."""
    info = _probe(python)
    binds: set[str] = set()
    links: dict[str, str] = {}
    for top in TOP_LINKS:
        if os.path.islink(top):
            links[top] = os.readlink(top)
    exe = os.path.abspath(python)
    for target, link in _links_to(exe):
        links.setdefault(link, target)
    real = os.path.realpath(exe)
    binds.add(real)
    roots = {info["stdlib"], info["platstdlib"], *info["dynload"]}
    binds.update(os.path.realpath(r) for r in roots if os.path.isdir(r))
    if info["prefix"] != info["base_prefix"]:  # a venv: its pyvenv.cfg names the base interpreter
        cfg = os.path.join(info["prefix"], "pyvenv.cfg")
        if os.path.exists(cfg):
            binds.add(cfg)
    modules = [os.path.join(d, f) for d in info["dynload"] if os.path.isdir(d) for f in sorted(os.listdir(d))
               if f.endswith(".so")]
    for lib in _libraries([real, *modules]):
        for target, link in _links_to(lib):
            links.setdefault(link, target)
        binds.add(os.path.realpath(lib))
    if os.path.exists("/etc/ld.so.cache"):
        binds.add("/etc/ld.so.cache")
    for given in ro_paths:  # the resolved folder, and the given path as a link to it when they differ
        real = os.path.realpath(given)
        binds.add(real)
        if real != given:
            links.setdefault(given, real)
    args: list[str] = []
    for path in sorted(binds):
        args += ["--ro-bind", path, path]
    for link in sorted(links, key=lambda p: p.count("/")):
        if link not in binds:
            args += ["--symlink", links[link], link]
    return tuple(args)


def bound_paths(python: str, ro_paths: tuple[str, ...] = ()) -> list[str]:
    """The host paths :func:`view` binds (for the dry run and the docs)."""
    args = view(python, ro_paths)
    return [args[i + 1] for i in range(len(args)) if args[i] == "--ro-bind"]
