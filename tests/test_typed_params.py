"""A component's parameters are validated into its typed ``Params`` once, at assembly, and the component
receives that object; ``Component(**params)`` still validates on its own."""

from __future__ import annotations

import pytest

import policyzoo.assembly as assembly
import policyzoo.contract.components as components
from policyzoo.errors import ConfigError
from policyzoo.plugins.clip.ppo import PPOClip


def test_assembly_validates_each_component_once_and_hands_it_the_typed_object(monkeypatch):
    made, inside = [], []
    real = components.validate_params

    def at_assembly(cls, params, where):
        made.append((cls.slot, real(cls, params, where)))
        return made[-1][1]

    monkeypatch.setattr(assembly, "validate_params", at_assembly)
    monkeypatch.setattr(components, "validate_params", lambda *a, **k: inside.append(a) or real(*a, **k))
    run = assembly.assemble({"base": "grpo", "clip": {"eps_high": 0.28}})
    assert inside == []  # no component validated its parameters again
    assert len(made) == len(run.components())  # one validation per component
    clip = dict(made)["clip"]
    assert run.clip.params is clip and type(clip) is PPOClip.Params
    assert (clip.eps_low, clip.eps_high) == (0.2, 0.28)  # grpo's eps_low kept, the override's eps_high


def test_a_bad_parameter_fails_at_assembly_naming_the_key():
    with pytest.raises(ConfigError) as e:
        assembly.assemble({"base": "grpo", "clip": {"eps_high": -1.0}})
    assert e.value.where == "algorithm.clip.eps_high"


def test_a_component_built_by_hand_validates_and_refuses_a_foreign_params_object():
    assert PPOClip(eps_high=0.3).params.eps_high == 0.3
    with pytest.raises(ConfigError):
        PPOClip(eps_hgh=0.3)
    with pytest.raises(TypeError):
        PPOClip(_params=components.Params())  # another class's Params
    with pytest.raises(TypeError):
        PPOClip(_params=PPOClip.Params(), eps_low=0.1)  # the object and keys at once
