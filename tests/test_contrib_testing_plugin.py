"""The pytest plugin policyzoo.testing, used as a plugin author would: a test file in a fresh
folder, no conftest, run by a separate pytest process that finds the fixtures through the
``pytest11`` entry point."""

import subprocess
import sys
import textwrap

AUTHOR_TESTS = '''
import torch
from policyzoo import Clip, Surrogate, assemble, hookimpl
from policyzoo.catalog import get_catalog
from policyzoo.testing import check_component


class HalfClip(Clip):
    """REINFORCE surrogate with the ratio capped at 3: -A min(r, 3). Source: a test double."""
    name = "half_clip"

    @hookimpl
    def clip(self, ratio, advantages):
        return Surrogate(-advantages * ratio.clamp(max=3.0))


def test_catalog_has_builtins_only(pz_catalog):
    assert {p.dist for p in pz_catalog.plugins} == {"policyzoo"}
    assert "sapo" not in pz_catalog.components["clip"] and "grpo" in pz_catalog.bundles


def test_toy_batch_is_ragged_and_deterministic(pz_toy_batch):
    from policyzoo.testing import toy_batch
    assert pz_toy_batch.response_mask.sum(-1).tolist() == [5, 3, 1, 4, 0, 2]
    assert pz_toy_batch.group_ids.tolist() == [7, 3, 7, 3, 7, 3]
    assert pz_toy_batch.logprobs.requires_grad
    assert torch.equal(pz_toy_batch.old_logprobs, toy_batch().old_logprobs)


def test_register_makes_a_component_usable_by_name(pz_register):
    pz_register(HalfClip)
    run = assemble({"base": "grpo", "clip": {"use": "half_clip"}})
    assert run.sources["clip"].startswith("half_clip from (in-process)")


def test_registration_ends_with_the_test():
    assert "half_clip" not in get_catalog().components["clip"]


def test_contract_and_tiny_run_with_a_recorder(pz_register, pz_hook_recorder, pz_tiny_run):
    catalog = pz_register(HalfClip)
    check_component(HalfClip, catalog)
    rec = pz_hook_recorder()
    result = pz_tiny_run({"base": "grpo", "clip": {"use": "half_clip"}}, steps=2, plugins=[HalfClip],
                         recorder=rec)
    assert result.weights_changed and len(result.history) == 2
    # one step: sample, the task reward, KL for the metric, baseline, then the loss hooks
    assert rec.names()[:8] == ["sample", "reward", "kl", "baseline", "ratio", "clip", "kl", "reduce"]
    assert rec.of("clip")[0].component.startswith("half_clip(")
    assert len(rec.of("reduce")) == 2
'''


def test_fixtures_reach_an_author_test_suite_through_pytest11(tmp_path):
    (tmp_path / "test_my_plugin.py").write_text(textwrap.dedent(AUTHOR_TESTS))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_plugin.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout


def test_tiny_run_of_a_plugin_that_is_also_installed():
    # policyzoo-sapo is pip-installed (entry point autoloaded); passing its module explicitly, as an
    # author testing their own plugin does, must not register 'sapo' twice
    import policyzoo_sapo

    from policyzoo.testing.training import tiny_run

    result = tiny_run({"base": "grpo", "clip": {"use": "sapo"}}, steps=2, plugins=[policyzoo_sapo])
    assert len(result.history) == 2 and result.weights_changed
