"""Installing a plugin never changes a run that does not name its parts: every zoo bundle (and a
hybrid of zoo parts) resolves to the same bundle, the same component classes and parameters and
the same sources with the contrib distributions loaded as without them, and trains identically."""

import pytest

import policyzoo.testing.bandit
from policyzoo import assemble
from policyzoo.catalog import load_catalog
from policyzoo.testing.training import tiny_run

BARE = load_catalog(autoload=False)
WITH = load_catalog(autoload=True, allow=["policyzoo-sapo", "policyzoo-tis"])
SPECS = sorted(BARE.bundles) + [{"base": "grpo", "clip": {"use": "cispo", "eps_high": 5.0}}]


def _signature(run):
    out = {}
    for slot in run.bundle.slots():
        v = getattr(run, slot)
        out[slot] = [(type(c), c.params) for c in (v if isinstance(v, list) else [v] if v else [])]
    return out


def test_the_plugins_are_really_loaded_in_one_catalog_only():
    assert "sapo" in WITH.components["clip"] and "geo_tis" in WITH.components["ratio"] and "sapo" in WITH.bundles
    assert "sapo" not in BARE.components["clip"] and "sapo" not in BARE.bundles


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_same_resolved_bundle_components_and_sources(spec):
    bare, full = assemble(spec, catalog=BARE), assemble(spec, catalog=WITH)
    assert bare.bundle == full.bundle
    assert _signature(bare) == _signature(full)
    assert bare.sources == full.sources


@pytest.mark.parametrize("spec", ["grpo", "dapo"])
def test_same_training_with_and_without_plugins(spec):
    timing = ("time_", "sync_")
    runs = []
    for catalog in (BARE, WITH):
        cat = load_catalog(autoload=catalog is WITH, allow=["policyzoo-sapo", "policyzoo-tis"],
                           extra=[policyzoo.testing.bandit])
        r = tiny_run(spec, steps=3, catalog=cat)
        runs.append(([{k: v for k, v in h.items() if not k.startswith(timing)} for h in r.history],
                     r.bandit.theta.detach().clone()))
    assert runs[0][0] == runs[1][0]
    assert bool((runs[0][1] == runs[1][1]).all())
