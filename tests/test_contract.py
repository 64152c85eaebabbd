"""The component contract over every component in the catalog (built-ins and installed contrib
distributions), and proof that each contract check can fail: deliberately broken components."""

import pytest
import torch
from pydantic import Field

from policyzoo import Advantages, Surrogate, hookimpl
from policyzoo.catalog import load_catalog
from policyzoo.contract import KL, Baseline, Clip, Component, Ratio, Reduce, Reward
from policyzoo.testing.contract import CHECKS, ContractFailure, check_component, contract_cases, run_checks

CATALOG = load_catalog(autoload=True, allow=None)
CASES = contract_cases(CATALOG)


def test_the_suite_covers_builtins_and_contrib():
    names = {str(c) for c in CASES}
    # one of each built-in slot and both contrib distributions (installed with pip, see the Makefile)
    assert {"sample:group", "reward:overlong_penalty", "filter:nonconstant_groups", "kl:k3",
            "baseline:group_norm", "ratio:token", "clip:ppo_clip", "reduce:token_mean"} <= names
    assert {"clip:sapo", "ratio:geo_tis"} <= names, "pip install ./contrib/policyzoo-sapo ./contrib/policyzoo-tis"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_component_passes_the_contract(case):
    check_component(case.cls, CATALOG)


# ----------------------------------------------------------------------------- broken components
class _Clip(Clip):
    """PPO-free surrogate -A r. Source: Williams 1992, a test double."""

    name = "test_clip"

    @hookimpl
    def clip(self, ratio, advantages):
        return Surrogate(-advantages * ratio)


class NoSource(_Clip):
    """A surrogate with no citation at all."""

    name = "no_source"


class Mutating(_Clip):
    """Clamps the advantages in place. Source: a test double."""

    name = "mutating"

    @hookimpl
    def clip(self, ratio, advantages):
        advantages.clamp_(-1e9, 1e9)  # same values, but an in-place write
        return Surrogate(-advantages * ratio)


class Leaky(Ratio):
    """Token ratio that forgets the mask. Source: a test double."""

    name = "leaky"

    @hookimpl
    def ratio(self, logprobs, old_logprobs):
        return torch.exp(logprobs - old_logprobs)


class Exploding(_Clip):
    """Surrogate -A r^8 (inf for large ratios). Source: a test double."""

    name = "exploding"

    @hookimpl
    def clip(self, ratio, advantages):
        return Surrogate(-advantages * ratio ** 8)


class InfDefault(_Clip):
    """A parameter whose default does not survive JSON. Source: a test double."""

    name = "inf_default"

    class Params(_Clip.Params):
        cap: float = Field(float("inf"), description="no cap by default")


class ByPosition(Baseline):
    """Groups rows by position (i // 3) instead of group_ids. Source: a test double."""

    name = "by_position"

    @hookimpl
    def baseline(self, rewards, response_mask):
        r = torch.nan_to_num(rewards).view(-1, 3)
        adv = (r - r.mean(-1, keepdim=True)).view(-1)
        return Advantages(torch.where(response_mask, adv[:, None].expand(response_mask.shape), 0.0))


class MicroMean(Reduce):
    """Divides by the micro-batch's own token count. Source: a test double."""

    name = "micro_mean"

    @hookimpl
    def reduce(self, loss, response_mask):
        return torch.where(response_mask, loss, 0.0).sum() / response_mask.sum().clamp(min=1)


class Entropyish(_Clip):
    """Adds -0.01 logprobs everywhere, masked positions included. Source: a test double."""

    name = "entropyish"

    @hookimpl
    def clip(self, ratio, advantages, logprobs):
        return Surrogate(-advantages * ratio - 0.01 * logprobs)


class DriftingKL(KL):
    """Adapts its coefficient inside the hook (the state moves on every call). Source: a test double."""

    name = "drifting_kl"

    def __init__(self, **params):
        super().__init__(**params)
        self.coef = 0.1

    @hookimpl
    def kl(self, logprobs, ref_logprobs, response_mask):
        self.coef *= 1.01
        return torch.where(response_mask, 0.5 * (logprobs - ref_logprobs) ** 2, 0.0)

    def update(self, metrics, collective):
        pass

    def state_dict(self):
        return {"coef": self.coef}

    def load_state_dict(self, state):
        self.coef = state["coef"]


class HiddenStateKL(DriftingKL):
    """Keeps state but has no update() (so nothing declares when it changes). Source: a test double."""

    name = "hidden_state_kl"
    update = Component.update


class LossyStateKL(DriftingKL):
    """Its saved state does not restore it. Source: a test double."""

    name = "lossy_state_kl"

    @hookimpl
    def kl(self, logprobs, ref_logprobs, response_mask):
        return torch.where(response_mask, 0.5 * (logprobs - ref_logprobs) ** 2, 0.0)

    def update(self, metrics, collective):
        self.coef += 1.0

    def load_state_dict(self, state):
        self.coef = 0.1


def _catalog_with(*classes):
    from policyzoo.testing import make_plugin

    return load_catalog(autoload=False, extra=[make_plugin(*classes)])


@pytest.mark.parametrize("cls, check", [
    (NoSource, "docstring"),
    (Mutating, "no_mutation"),
    (Leaky, "masked"),
    (Exploding, "extreme"),
    (InfDefault, "params_json"),
    (ByPosition, "spec"),
    (MicroMean, "spec"),
    (Entropyish, "masked"),
    (DriftingKL, "state"),
    (HiddenStateKL, "state"),
    (LossyStateKL, "state"),
], ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_each_check_catches_its_breakage(cls, check):
    result = run_checks(cls, _catalog_with(cls))
    assert result[check], f"{check} should fail for {cls.__name__}: {result}"
    with pytest.raises(ContractFailure, match=check):
        check_component(cls, _catalog_with(cls))


def test_a_correct_double_passes_every_check():
    # the same surrogate with a source and no defects passes all checks: the failures above are
    # caused by the defect each class adds, not by the harness
    assert run_checks(_Clip, _catalog_with(_Clip)) == dict.fromkeys(CHECKS)


def test_failure_message_names_the_component_and_the_reason():
    with pytest.raises(ContractFailure) as info:
        check_component(Leaky, _catalog_with(Leaky))
    text = str(info.value)
    assert "ratio component 'leaky'" in text and "masked" in text and "gradient reaches masked" in text


class NeedsPath(Reward):
    """A reward read from a file named by a required parameter. Source: a test double."""

    name = "needs_path"

    class Params(Reward.Params):
        path: str = Field(..., description="a text file holding one number")
        weight: float = 1.0

    @staticmethod
    def contract_params(workdir):
        (workdir / "value.txt").write_text("0.5")
        return {"path": str(workdir / "value.txt")}

    @hookimpl
    def reward(self, rollout):
        with open(self.params.path) as f:
            return torch.full((len(rollout),), float(f.read()))


@pytest.mark.parametrize("cls, said", [
    (DriftingKL, "state only in update"), (HiddenStateKL, "stateless means no state"),
    (LossyStateKL, "state round trip"),
], ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_state_failures_name_the_property(cls, said):
    result = run_checks(cls, _catalog_with(cls))
    assert result["state"].startswith(said), result["state"]


def test_contract_params_build_components_without_defaults():
    # without an example the suite cannot build it and says so; with contract_params it passes
    bare = type("NoExample", (NeedsPath,), {"contract_params": None, "__doc__": NeedsPath.__doc__,
                                             "name": "no_example"})
    assert "cannot build the component" in run_checks(bare, _catalog_with(bare))["shapes"]
    check_component(NeedsPath, _catalog_with(NeedsPath))


class NanLeak(Baseline):
    """Group mean baseline that forgets NaN rewards. Source: a test double."""

    name = "nan_leak"

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask):
        r = torch.nan_to_num(rewards, nan=0.0)
        mean = torch.stack([r[group_ids == g].mean() for g in group_ids])
        return Advantages(torch.where(response_mask, (r - mean)[:, None].expand(response_mask.shape), 0.0))


def test_nan_reward_rows_must_get_advantage_zero():
    result = run_checks(NanLeak, _catalog_with(NanLeak))
    assert "NaN reward" in result["masked"]
