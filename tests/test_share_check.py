"""The shared-prompt check's pass is remembered between starts (policyzoo.engine.trainer.share_check):
a second start with the same model folder, dtype, code and ids skips the two forwards and reports the first
start's numbers; another weights file, a failing check or a tolerance the record does not meet runs them."""

from __future__ import annotations

import os
import shutil
import types

import pytest
import torch
from _engine_helpers import tiny_model

from policyzoo.engine.trainer import share_check
from policyzoo.engine.trainer.deepspeed_trainer import Trainer

IDS = list(range(3, 40))


class Counting(torch.nn.Module):
    """The model, counting its forwards (the check runs two scoring passes: shared and per row)."""

    def __init__(self, model, shift: float = 0.0):
        super().__init__()
        self.model, self.calls, self.shift = model, 0, shift

    def forward(self, **kw):
        self.calls += 1
        out = self.model(**kw)
        if self.shift and kw.get("past_key_values") is not None:  # a cache path that moves the logits
            out = types.SimpleNamespace(logits=out.logits + torch.linspace(0, self.shift, out.logits.shape[-1]))
        return out


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model()), dtype=torch.float32).eval()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A model folder of its own (its files' times are part of the key) and a cache of its own."""
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    return shutil.copytree(tiny_model(), tmp_path / "model")


def _trainer(engine, folder) -> Trainer:
    tr = Trainer.__new__(Trainer)  # the scoring paths only, without DeepSpeed
    tr.engine, tr.pad_id, tr.device, tr.share_prompt = engine, 2, torch.device("cpu"), True
    tr.info = types.SimpleNamespace(path=folder)
    return tr


def test_a_second_start_reuses_the_pass_without_a_forward(model, folder):
    first = _trainer(Counting(model), folder)
    assert first.check_share_prompt(IDS) is None and first.share_prompt
    assert first.engine.calls >= 2 and first.share_prompt_check["remembered"] is False
    second = _trainer(Counting(model), folder)
    assert second.check_share_prompt(IDS) is None and second.share_prompt
    assert second.engine.calls == 0  # no forward at all
    got, want = second.share_prompt_check, first.share_prompt_check
    assert got["remembered"] is True and got["tolerance"] == 1e-3
    assert (got["max_diff"], got["mean_diff"]) == (want["max_diff"], want["mean_diff"])


def test_another_weights_file_or_other_ids_run_the_check_again(model, folder):
    _trainer(Counting(model), folder).check_share_prompt(IDS)
    other_ids = _trainer(Counting(model), folder)
    other_ids.check_share_prompt(IDS[:-1])
    assert other_ids.engine.calls >= 2
    weights = folder / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the file replaced a second later
    again = _trainer(Counting(model), folder)
    assert again.check_share_prompt(IDS) is None and again.engine.calls >= 2
    assert again.share_prompt_check["remembered"] is False


def test_a_failing_check_is_not_remembered(model, folder):
    # the cache path shifts the logits by values in [0, 1]: log-probs move by up to 1 nat > 1e-3
    for _ in range(2):
        tr = _trainer(Counting(model, shift=1.0), folder)
        assert "differs from the per-row forward" in tr.check_share_prompt(IDS) and not tr.share_prompt
        assert tr.engine.calls >= 2


def test_a_record_is_reused_only_within_the_tolerance(tmp_path):
    share_check.remember("k", {"max_diff": 0.002, "mean_diff": 0.001}, root=tmp_path)
    assert share_check.recall("k", 1e-3, root=tmp_path) is None  # 0.002 > 0.001: run the check
    assert share_check.recall("k", 0.1, root=tmp_path) == {"max_diff": 0.002, "mean_diff": 0.001}
    (tmp_path / "share-prompt-check" / "bad.json").write_text("{not json")
    assert share_check.recall("bad", 0.1, root=tmp_path) is None
    assert share_check.recall(None, 0.1, root=tmp_path) is None


def test_a_trainer_without_a_model_folder_is_not_cached(model, tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    tr = _trainer(Counting(model), None)
    assert tr.check_share_prompt(IDS) is None and tr.engine.calls >= 2
    assert not (tmp_path / "cache").exists()


def test_a_deeply_nested_record_is_ignored_not_raised(tmp_path):
    # json.loads of 200,000 nested brackets raises RecursionError: the check runs as without a cache
    (tmp_path / "share-prompt-check").mkdir()
    (tmp_path / "share-prompt-check" / "deep.json").write_text("[" * 200_000)
    assert share_check.recall("deep", 0.1, root=tmp_path) is None
