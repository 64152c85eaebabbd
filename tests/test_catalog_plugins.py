"""Plugin discovery through entry points: duplicates, broken imports, the autoload-off and
allowlist switches. Throwaway distributions are written into tmp_path (a package plus a
``.dist-info`` with ``entry_points.txt``) and put on sys.path, as pip would leave them."""

import subprocess
import sys
import textwrap

import pytest

from policyzoo import PluginError
from policyzoo.catalog import load_catalog

DUPLICATE_CLIP = '''
from policyzoo import Clip, Surrogate, hookimpl

class MyClip(Clip):
    """Another PPO clip. Source: a test double."""
    name = "{name}"

    @hookimpl
    def clip(self, ratio, advantages):
        return Surrogate(-advantages * ratio)

@hookimpl
def register_components(register):
    register(MyClip)
'''

DUPLICATE_BUNDLE = '''
from policyzoo import hookimpl
from policyzoo.zoo.grpo import BUNDLE

@hookimpl
def register_bundles(register):
    register(BUNDLE)
'''


def make_dist(root, dist: str, module: str, code: str, version: str = "0.3.1"):
    """Write package ``module`` and the metadata of distribution ``dist`` under ``root``."""
    pkg = root / module
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[policyzoo]\n{module} = {module}\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("POLICYZOO_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("POLICYZOO_PLUGINS", raising=False)
    return tmp_path


def test_duplicate_of_a_builtin_names_both_distributions(site):
    make_dist(site, "policyzoo-dupe", "pz_dupe", DUPLICATE_CLIP.format(name="ppo_clip"))
    with pytest.raises(PluginError) as info:
        load_catalog(allow=["policyzoo-dupe"])
    text = str(info.value)
    assert "clip component 'ppo_clip'" in text
    assert "policyzoo 0.1.0 (policyzoo.plugins)" in text and "policyzoo-dupe 0.3.1 (pz_dupe)" in text
    assert "rename" in text


def test_duplicate_of_another_plugin_names_both_distributions(site):
    # policyzoo-sapo (installed from contrib/) already registers the clip 'sapo'
    make_dist(site, "policyzoo-sapo-fork", "pz_sapo_fork", DUPLICATE_CLIP.format(name="sapo"))
    with pytest.raises(PluginError) as info:
        load_catalog(allow=["policyzoo-sapo", "policyzoo-sapo-fork"])
    text = str(info.value)
    assert "policyzoo-sapo 0.1.0" in text and "policyzoo-sapo-fork 0.3.1" in text


def test_duplicate_bundle_names_both_distributions(site):
    make_dist(site, "policyzoo-regrpo", "pz_regrpo", DUPLICATE_BUNDLE)
    with pytest.raises(PluginError) as info:
        load_catalog(allow=["policyzoo-regrpo"])
    text = str(info.value)
    assert "algorithm 'grpo'" in text and "policyzoo 0.1.0" in text and "policyzoo-regrpo 0.3.1" in text


def test_import_error_is_reported_by_distribution_with_the_reason(site):
    make_dist(site, "policyzoo-broken", "pz_broken", "raise ImportError('needs the flash-attn package')\n")
    with pytest.raises(PluginError) as info:
        load_catalog(allow=["policyzoo-broken"])
    text = str(info.value)
    assert "plugin distribution 'policyzoo-broken'" in text
    assert "ImportError: needs the flash-attn package" in text
    assert "POLICYZOO_PLUGINS" in text and "POLICYZOO_DISABLE_PLUGIN_AUTOLOAD" in text


def test_autoload_off_loads_no_entry_point(site, monkeypatch):
    make_dist(site, "policyzoo-broken", "pz_broken", "raise RuntimeError('must not be imported')\n")
    monkeypatch.setenv("POLICYZOO_DISABLE_PLUGIN_AUTOLOAD", "1")
    catalog = load_catalog()  # the broken distribution is not even imported
    assert [p.dist for p in catalog.plugins] == ["policyzoo", "policyzoo"]
    assert "sapo" not in catalog.components["clip"] and "geo_tis" not in catalog.components["ratio"]
    assert "sapo" not in catalog.bundles
    assert "pz_broken" not in sys.modules


def test_allowlist_loads_only_the_named_distributions(site, monkeypatch):
    make_dist(site, "policyzoo-broken", "pz_broken", "raise RuntimeError('must not be imported')\n")
    monkeypatch.setenv("POLICYZOO_PLUGINS", "policyzoo-tis")
    catalog = load_catalog()
    assert "geo_tis" in catalog.components["ratio"]
    assert "sapo" not in catalog.components["clip"] and "sapo" not in catalog.bundles
    assert {p.dist for p in catalog.plugins} == {"policyzoo", "policyzoo-tis"}


def test_with_everything_installed_both_contrib_distributions_load(site):
    catalog = load_catalog()
    by_dist = {p.dist: p for p in catalog.plugins}
    assert by_dist["policyzoo-sapo"].components == ["clip:sapo"] and by_dist["policyzoo-sapo"].bundles == ["sapo"]
    assert by_dist["policyzoo-tis"].components == ["ratio:geo_tis"] and by_dist["policyzoo-tis"].version == "0.2.0"
    assert catalog.components["clip"]["sapo"][1].dist == "policyzoo-sapo"


def test_plugins_lists_broken_distributions_with_their_error_and_a_run_still_refuses_them(site):
    make_dist(site, "policyzoo-broken", "pz_broken", "raise ImportError('needs the flash-attn package')\n")
    make_dist(site, "policyzoo-dupe", "pz_dupe", DUPLICATE_CLIP.format(name="ppo_clip"))  # fails to register
    make_dist(site, "policyzoo-good", "pz_good", DUPLICATE_CLIP.format(name="good_clip"))
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "COLUMNS": "300"}
    proc = subprocess.run([sys.executable, "-m", "policyzoo.cli", "plugins"], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    good, _, bad = proc.stdout.partition("broken plugin distributions")
    assert "policyzoo-good" in good and "clip:good_clip" in good and "policyzoo-broken" not in good
    assert "policyzoo-broken" in bad and "ImportError: needs the flash-attn package" in bad
    assert "policyzoo-dupe" in bad and "registered twice" in bad
    assert "Traceback" not in proc.stderr
    run = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--dry-run"], capture_output=True,
                         text=True, env=env, timeout=900)
    assert run.returncode == 2 and "policyzoo-broken" in run.stderr and "Traceback" not in run.stderr


def test_keep_broken_leaves_out_only_the_broken_distribution(site):
    make_dist(site, "policyzoo-dupe", "pz_dupe2", DUPLICATE_CLIP.format(name="ppo_clip"))
    cat = load_catalog(keep_broken=True)
    assert [b.dist for b in cat.broken] == ["policyzoo-dupe"]
    assert "policyzoo-dupe" not in [p.dist for p in cat.plugins]
    assert cat.components["clip"]["ppo_clip"][1].dist == "policyzoo"  # the built-in one stays


def test_allowlist_names_compare_as_pip_does(site, monkeypatch):
    # policyzoo_tis / PolicyZoo.TIS mean the distribution policyzoo-tis (PEP 503 normalisation)
    monkeypatch.setenv("POLICYZOO_PLUGINS", "PolicyZoo_TIS")
    assert "geo_tis" in load_catalog().components["ratio"]


def test_allowlist_name_that_matches_nothing_is_an_error(site, monkeypatch):
    monkeypatch.setenv("POLICYZOO_PLUGINS", "policyzoo-tis,policyzoo-sapoo")
    with pytest.raises(PluginError) as info:
        load_catalog()
    text = str(info.value)
    assert "POLICYZOO_PLUGINS" in text and "policyzoo-sapoo" in text
    assert "policyzoo-sapo" in text.split("installed plugin distributions:")[1]


def test_a_register_function_without_the_marker_is_refused(site):
    # pluggy calls only marked hook implementations: an unmarked register_components would register
    # nothing while looking installed, so the catalog refuses it by name with the fix
    make_dist(site, "policyzoo-unmarked", "pz_unmarked", DUPLICATE_CLIP.format(name="unmarked_clip").replace(
        "@hookimpl\ndef register_components", "def register_components"))
    with pytest.raises(PluginError) as info:
        load_catalog(allow=["policyzoo-unmarked"])
    text = str(info.value)
    assert "(pz_unmarked).register_components" in text and "without the hook marker" in text and "@hookimpl" in text
    broken = load_catalog(allow=["policyzoo-unmarked"], keep_broken=True)
    assert [b.dist for b in broken.broken] == ["policyzoo-unmarked"]  # `policyzoo plugins` lists it as broken
    assert "unmarked_clip" not in broken.components["clip"]
