"""The docs cannot drift: the hook reference against core/contract/hookspecs.py, the glossary against the
names the code uses, one bundle page per bundle with its real slot table and metrics, and the
plugin of "writing a plugin" runs."""

import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from policyzoo import contract as hookspecs  # the hook specs, markers and slot table
from policyzoo.catalog import load_catalog

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CATALOG = load_catalog(autoload=True, allow=["policyzoo-sapo", "policyzoo-tis"])
CALL_TYPE = {"single": "single", "collect": "collect", "optional": "optional single"}


def _sections(text: str, level: str = "## ") -> dict[str, str]:
    """``{heading: body}`` for headings of the given level."""
    parts = re.split(rf"^{level}(.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _spec_hooks() -> dict[str, list[str]]:
    out = {}
    for name, fn in inspect.getmembers(hookspecs.Spec, inspect.isfunction):
        if hasattr(fn, f"{hookspecs.PROJECT}_spec"):
            out[name] = [p for p in inspect.signature(fn).parameters if p != "self"]
    return out


# ----------------------------------------------------------------------------- hooks.md
HOOKS = _sections((DOCS / "hooks.md").read_text())
HOOK_SECTIONS = {k.strip("`"): v for k, v in HOOKS.items() if k.startswith("`")}


def test_every_hook_is_documented_and_nothing_else():
    assert set(HOOK_SECTIONS) == set(_spec_hooks())
    assert set(hookspecs.SLOTS) <= set(HOOK_SECTIONS)


@pytest.mark.parametrize("hook", sorted(_spec_hooks()))
def test_hook_section_states_call_type_and_every_argument(hook):
    body = HOOK_SECTIONS[hook]
    stated = re.search(r"\*\*call type:\*\* (.+)", body).group(1).strip()
    expected = CALL_TYPE[hookspecs.SLOTS[hook]] if hook in hookspecs.SLOTS else "register"
    assert stated == expected
    args_line = re.search(r"\*\*arguments:\*\*(.+?)(?:\n\n|\Z)", body, flags=re.S).group(1)
    for arg in _spec_hooks()[hook]:
        assert f"`{arg}" in args_line, f"{hook}: argument {arg!r} not documented"


def test_firstresult_matches_the_call_type():
    for hook, kind in hookspecs.SLOTS.items():
        opts = getattr(getattr(hookspecs.Spec, hook), f"{hookspecs.PROJECT}_spec")
        assert bool(opts.get("firstresult")) == (kind in ("single", "optional")), hook


def test_environment_switches_match_the_catalog():
    import policyzoo.catalog

    documented = set(re.findall(r"`(POLICYZOO_[A-Z_]+)", HOOKS["Environment switches"]))
    assert documented == set(re.findall(r"(POLICYZOO_[A-Z_]+)", policyzoo.catalog.__doc__))


# ----------------------------------------------------------------------------- glossary.md
def _source_words() -> set[str]:
    text = ""
    for folder in ("core", "plugins", "zoo", "contrib"):
        for path in (ROOT / folder).rglob("*.py"):
            text += path.read_text()
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def test_glossary_names_are_the_names_the_code_uses():
    text = (DOCS / "glossary.md").read_text()
    ours = [line.split("|")[1] for line in text.splitlines()
            if line.startswith("| `")]
    words = {w for cell in ours for token in re.findall(r"`([^`]+)`", cell)
             for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", token)}
    for required in ("logprobs", "old_logprobs", "rollout_logprobs", "ref_logprobs", "response_mask",
                     "advantages", "group_ids", "eps_low", "eps_high", "beta", "rewards", "returns", "values"):
        assert required in words, f"glossary lacks {required}"
    missing = sorted(words - _source_words())
    assert not missing, f"glossary names that the code does not use: {missing}"


# ----------------------------------------------------------------------------- bundles/*.md
BUNDLE_SECTIONS = ("Paper", "Slots", "Implementation details", "Metrics", "Differences from TRL and verl")


@pytest.mark.parametrize("name", sorted(CATALOG.bundles))
def test_bundle_page_has_every_section(name):
    path = DOCS / "bundles" / f"{name}.md"
    assert path.exists(), f"write docs/bundles/{name}.md"
    sections = _sections(path.read_text())
    for s in BUNDLE_SECTIONS:
        assert s in sections and len(sections[s].strip()) > 40, f"{name}: section {s!r} missing or empty"
    bundle = CATALOG.bundles[name][0]
    arxiv = re.search(r"arXiv:\d{4}\.\d{4,5}", bundle.paper)
    if arxiv:
        assert arxiv.group(0) in sections["Paper"]


@pytest.mark.parametrize("name", sorted(CATALOG.bundles))
def test_bundle_page_slot_table_is_the_bundle(name):
    bundle = CATALOG.bundles[name][0]
    table = _sections((DOCS / "bundles" / f"{name}.md").read_text())["Slots"]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    assert set(rows) == set(hookspecs.SLOTS), f"{name}: slot rows {sorted(rows)}"
    for slot, value in bundle.slots().items():
        uses = value if isinstance(value, tuple) else (() if value is None else (value,))
        cells = rows[slot]
        if not uses:
            assert cells[1] == "—", f"{name}.{slot}: the bundle has none, the page says {cells[1]}"
        for u in uses:
            assert f"`{u.name}`" in cells[1], f"{name}.{slot}: page says {cells[1]}, bundle uses {u.name}"
            for k, v in u.params.items():
                assert f"{k}={v}" in cells[2], f"{name}.{slot}: {k}={v} not on the page ({cells[2]})"


@pytest.mark.parametrize("name", sorted(CATALOG.bundles))
def test_bundle_page_metrics_are_reported_by_the_step(name):
    import policyzoo.testing.bandit
    from policyzoo.testing.training import tiny_run

    body = _sections((DOCS / "bundles" / f"{name}.md").read_text())["Metrics"]
    named = set(re.findall(r"`([a-z_/<>]+)`", body))
    cat = load_catalog(autoload=True, allow=["policyzoo-sapo", "policyzoo-tis"], extra=[policyzoo.testing.bandit])
    produced = set(tiny_run(name, steps=1, catalog=cat).history[0])
    assert named, f"{name}: the Metrics section names no metric"
    unknown = {m for m in named if m not in produced and not m.endswith("/<reason>")}
    assert not unknown, f"{name}: metrics the step does not report: {sorted(unknown)}"


# ----------------------------------------------------------------------------- writing-a-plugin.md
def test_the_first_plugin_is_complete_short_and_works():
    from policyzoo import assemble
    from policyzoo.testing import check_component

    text = (DOCS / "writing-a-plugin.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    assert text.index("```python") < text.index("\n## "), "the page must start with the plugin"
    assert len(code.strip().splitlines()) < 15
    module = types.ModuleType("capped_pg")
    exec(compile(code, "capped_pg.py", "exec"), module.__dict__)
    catalog = load_catalog(autoload=False, extra=[module])
    check_component(module.CappedPG, catalog)
    run = assemble({"base": "grpo", "clip": {"use": "capped_pg"}}, catalog=catalog)
    assert run.sources["clip"].startswith("capped_pg from (in-process)")
    assert "[project.entry-points.policyzoo]" in text
    sys.modules.pop("capped_pg", None)


def test_the_guides_distribution_builds_installs_and_registers_from_the_pages_text(tmp_path):
    text = (DOCS / "writing-a-plugin.md").read_text()
    blocks = re.findall(r"```(python|toml)\n(.*?)```", text, flags=re.S)
    module = [c for lang, c in blocks if lang == "python"][0]
    bundle = [c for lang, c in blocks if lang == "python" and "def register_bundles" in c][0]
    (toml,) = [c for lang, c in blocks if lang == "toml"]
    assert "[build-system]" in toml and "[project.entry-points.policyzoo]" in toml
    src, site = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    (src / "capped_pg.py").write_text(module + "\n" + bundle)
    (src / "pyproject.toml").write_text(toml)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                          "--no-index", "--target", str(site), str(src)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "300"}
    env.pop("POLICYZOO_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("POLICYZOO_PLUGINS", None)
    comps = subprocess.run([sys.executable, "-m", "policyzoo.cli", "components", "--slot", "clip"],
                           capture_output=True, text=True, env=env, timeout=900)
    assert comps.returncode == 0, comps.stderr
    (line,) = [ln for ln in comps.stdout.splitlines() if "capped_pg" in ln]
    assert "policyzoo-capped-pg 0.1.0" in line
    explain = subprocess.run([sys.executable, "-m", "policyzoo.cli", "explain", "capped_grpo"],
                             capture_output=True, text=True, env=env, timeout=900)
    assert explain.returncode == 0 and "clip      capped_pg" in explain.stdout, explain.stderr


def test_the_controller_example_passes_the_contract_and_adapts():
    from policyzoo.contract import LOCAL
    from policyzoo.testing import check_component, make_plugin

    text = (DOCS / "writing-a-plugin.md").read_text()
    code = re.search(r"```python controller\n(.*?)```", text, flags=re.S).group(1)
    scope: dict = {}
    exec(compile(code, "halving_kl.py", "exec"), scope)
    cls = scope["HalvingKL"]
    check_component(cls, load_catalog(autoload=False, extra=[make_plugin(cls)]))
    kl = cls(beta=0.04, target=0.01)
    kl.update({"kl_ref_row_mean": 0.02, "rows": 4}, LOCAL)  # 0.02 > 1.5 x 0.01: beta x 2 = 0.08
    assert kl.beta == 0.08 and kl.state_dict() == {"beta": 0.08}
    kl.update({"kl_ref_row_mean": 0.005, "rows": 4}, LOCAL)  # 0.005 < 0.01 / 1.5: beta / 2 = 0.04
    assert kl.beta == 0.04


def test_the_term_example_passes_the_contract_and_adds_its_term():
    from policyzoo import assemble
    from policyzoo.testing import check_component, make_plugin

    text = (DOCS / "writing-a-plugin.md").read_text()
    code = re.search(r"```python term\n(.*?)```", text, flags=re.S).group(1)
    scope: dict = {}
    exec(compile(code, "my_entropy.py", "exec"), scope)
    cls = scope["EntropyBonus"]
    catalog = load_catalog(autoload=False, extra=[make_plugin(cls)])
    check_component(cls, catalog)
    run = assemble({"base": "grpo", "term": [{"use": "my_entropy", "coef": 0.01}]}, catalog=catalog)
    assert run.term[0].coef == 0.01 and run.term[0].needs_entropy


def test_the_baseline_example_is_a_plugin_on_the_public_helpers_with_the_pages_numbers():
    import torch

    from policyzoo import assemble
    from policyzoo.testing import check_component

    text = (DOCS / "writing-a-plugin.md").read_text()
    code = re.search(r"```python baseline\n(.*?)```", text, flags=re.S).group(1)
    assert "from policyzoo.contract import GroupBaseline, group_stats, hookimpl, valid_scores" in code
    module = types.ModuleType("group_median")
    exec(compile(code, "group_median.py", "exec"), module.__dict__)
    catalog = load_catalog(autoload=False, extra=[module])  # registered through its register_components
    check_component(module.GroupMedian, catalog)
    run = assemble({"base": "grpo", "baseline": {"use": "group_median"}}, catalog=catalog)
    assert run.sources["baseline"].startswith("group_median from (in-process)")
    rewards = torch.tensor([3.0, 2.0, 1.0, float("nan"), 10.0, 4.0])
    mask = torch.ones(6, 2, dtype=torch.bool)
    mask[5, 1] = False  # a shorter row: its advantage covers its one token only
    adv = run.baseline.baseline(rewards, torch.tensor([0, 1, 0, 1, 0, 1]), mask, None).advantages
    # group 0: rows 0, 2, 4 = 3, 1, 10, median 3 -> 0, -2, 7; group 1: rows 1, 5 = 2, 4 (row 3 NaN:
    # unscorable, 0), median (2 + 4) / 2 = 3 -> -1, +1
    assert adv.tolist() == [[0.0, 0.0], [-1.0, -1.0], [-2.0, -2.0], [0.0, 0.0], [7.0, 7.0], [1.0, 0.0]]


def test_hooks_page_lists_every_slot_base_and_what_it_declares():
    from policyzoo.contract import BASES

    table = _sections((DOCS / "hooks.md").read_text())["Slot base classes"]
    rows = {r.split("|")[1].strip(): r for r in table.splitlines() if r.startswith("| ") and "base class" not in r}
    assert set(rows) == set(BASES)
    for slot, base in BASES.items():
        assert f"`policyzoo.contract.{base.__name__}`" in rows[slot]
        for field in base.Params.model_fields:
            assert f"`{field}`" in rows[slot], f"{slot}: parameter {field} not on the page"
        declared = [k for k in vars(base) if not k.startswith("_") and k not in (slot, "slot", "Params")]
        for attr in declared:
            assert f"`{attr}" in rows[slot], f"{slot}: attribute {attr} not on the page"


# ----------------------------------------------------------------------------- README.md: the idea first, then the map
README = (ROOT / "README.md").read_text()


def _readme_section(title: str) -> str:
    return README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_readme_is_short_and_starts_with_the_idea():
    # README holds the idea, a hybrid, the two commands and the map; the rest lives in docs/
    assert len(README.splitlines()) <= 150
    first = README.split("\n## ", 1)[0]  # the pitch and the hybrid, before any section
    assert "```yaml\n" in first and "policyzoo compare --algos" in first
    # .ci/run calls `make test`: README's two commands are the ones CI and a new user run
    commands = _readme_section("The two commands")
    assert "make demo   # " in commands and "make test   # " in commands
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_hybrid_is_a_valid_config(tmp_path):
    from policyzoo import assemble
    from policyzoo.run_config import load_config

    yaml_text = README.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "hybrid.yaml").write_text(yaml_text)
    config = load_config(str(tmp_path / "hybrid.yaml"))
    run = assemble(config.algorithm, catalog=CATALOG)
    # what its comments say: cispo replaces grpo's ppo_clip, a filter is added, the KL removed, 2 updates per batch
    assert run.clip.name == "cispo" and run.clip.params.eps_high == 5.0
    assert [f.name for f in run.filter] == ["nonconstant_groups"] and run.filter[0].params.resample is True
    assert run.kl is None and config.train.updates_per_batch == 2
    assert run.baseline.name == "group_norm"  # grpo's, inherited


def test_readme_compare_line_plans_two_entries_by_three_seeds(tmp_path, capsys):
    import shlex

    from policyzoo.cli import main

    line = re.search(r"^(policyzoo compare --algos \S+ .*)$", README, flags=re.M).group(1)
    args = shlex.split(line)[1:]
    args[args.index("--output-dir") + 1] = str(tmp_path / "cmp")
    code = main([*args, "--print-commands"])  # the gradient probe runs; nothing trains
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("policyzoo train ")]
    assert code in (0, None)
    # 2 entries x 3 seeds = 6 runs; the hybrid's 3 carry its slot change; none is written yet
    assert len(lines) == 6 and sum("algorithm.clip.use=cispo" in x for x in lines) == 3
    assert not (tmp_path / "cmp").exists()


def test_every_doc_is_linked_from_the_readme_map():
    section = _readme_section("Where things are")
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", section))
    pages = {p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md")} | {"docs/bundles/"}
    assert pages <= linked, f"docs not linked from README's map: {sorted(pages - linked)}"


# ----------------------------------------------------------------------------- every path the docs name exists
def _stale_paths(root: Path = ROOT) -> list[str]:
    """bench/architecture_files.py's ``stale_paths``, loaded by its path (bench/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("architecture_files", ROOT / "bench" / "architecture_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.stale_paths(root)


def test_every_path_readme_and_docs_name_exists():
    assert _stale_paths() == [], "a file moved or renamed: fix these paths (python bench/architecture_files.py)"


def test_the_path_check_finds_what_is_stale(tmp_path):
    for f in ("core/plan/__init__.py", "core/doctor/plan.py", "core/engine/run/loop.py", "docs/engine.md"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    (tmp_path / "README.md").write_text(
        "| `core/` (`plan.py`) | building |\n"          # line 1: core/plan.py is gone (a folder now)
        "`run/loop.py` and `core/engine/run/gone.py`\n"  # line 2: the first exists (by its end), not the second
        "`plugins/<slot>/`, `bench/x.py --out bench/results/new`, [engine](docs/engine.md)\n"  # line 3: none stale
        "[the page](docs/moved.md) and `core/doctor/` (`plan.py`)\n")  # line 4: a dead link (said once)
    (tmp_path / "docs" / "a.md").write_text("[back](engine.md), `policyzoo/engine/run/loop.py`, `SyncSource`\n")
    # by hand: line 1 plan.py (core/ holds plan/ only), line 2 gone.py, line 3 bench/x.py (not in this tree),
    # line 4 the link, listed after the line's paths (core/doctor/plan.py exists); docs/a.md names only what
    # exists (policyzoo/... is core/...; a class name is no path)
    assert _stale_paths(tmp_path) == ["README.md:1: plan.py", "README.md:2: core/engine/run/gone.py",
                                      "README.md:3: bench/x.py", "README.md:4: link docs/moved.md"]
