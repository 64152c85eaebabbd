"""The reward_model reward on a tiny Llama sequence classifier whose output is set by hand.

The model: hidden size 4, one layer whose attention and MLP outputs are zeroed (o_proj and
down_proj = 0), so the residual stream at every position is the token's embedding. Token id k
embeds as the one-hot vector e_(k mod 4). The final RMSNorm (weight 1, eps 1e-6) maps e_j to
e_j / sqrt(mean(e_j^2) + eps) = e_j / sqrt(1/4 + 1e-6) = 1.999996 e_j, and the score head w gives
score = 1.999996 * w[j] at the pooled position, the last non-pad token.
Vocabulary: [PAD]=0, [UNK]=1, a=2, b=3, c=4, d=5 -> j = 2, 3, 0, 1.
"""

import pytest
import torch

from policyzoo.contract import Rollout
from policyzoo.errors import ConfigError
from policyzoo.plugins.reward import RewardModel

SCALE = (0.25 + 1e-6) ** -0.5  # 1.999996


def make_model(folder, head, chat_template=None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "a": 2, "b": 3, "c": 4, "d": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    fast.chat_template = chat_template
    fast.save_pretrained(folder)
    config = LlamaConfig(vocab_size=6, hidden_size=4, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, rms_norm_eps=1e-6,
                         num_labels=len(head), pad_token_id=0)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(4)[torch.arange(6) % 4])
        model.model.layers[0].self_attn.o_proj.weight.zero_()
        model.model.layers[0].mlp.down_proj.weight.zero_()
        model.score.weight.copy_(torch.tensor(head))
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def one_label(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("rm1"), [[1.0, 2.0, 3.0, 4.0]])


def rollout(prompts, completions):
    b = len(completions)
    return Rollout(prompt_ids=[[1]] * b, response_ids=torch.zeros(b, 1, dtype=torch.long),
                   response_mask=torch.ones(b, 1, dtype=torch.bool), rollout_logprobs=torch.zeros(b, 1),
                   group_ids=torch.arange(b), truncated=torch.zeros(b, dtype=torch.bool),
                   prompts=prompts, completions=completions, rows=[{"answer": "1"}] * b)


def test_scores_are_the_head_at_the_last_real_token(one_label):
    comp = RewardModel(path=one_label, batch_size=3)
    assert comp.model is None  # loaded lazily
    r = rollout(["a b ", "", "a a a ", "c "], ["c", "d", "b", "a"])
    # last tokens c, d, b, a -> j = 0, 1, 3, 2 -> w = 1, 2, 4, 3. Rows 1 and 3 are padded in their
    # batches ([a b c | d | a a a b] and [c a]): pooling at a pad (j = 0) would give 2.0 instead.
    expected = torch.tensor([1.0, 2.0, 4.0, 3.0]) * SCALE
    assert torch.allclose(comp.reward(r), expected, atol=1e-5)
    model = comp.model
    comp.reward(r)
    assert comp.model is model and not any(p.requires_grad for p in model.parameters())


def test_long_sequences_are_cut_from_the_left(one_label):
    # "a b c d" with max_length 2 keeps "c d": last token d -> w[1] = 2 (cut on the right: b -> 4)
    comp = RewardModel(path=one_label, max_length=2)
    assert torch.allclose(comp.reward(rollout(["a b c "], ["d"])), torch.tensor([2.0 * SCALE]), atol=1e-5)


def test_label_selects_a_logit(tmp_path):
    path = make_model(tmp_path, [[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 0.0, 5.0]])
    # last token b -> j = 3: label 1 -> 5 x SCALE, label 0 -> 4 x SCALE
    assert torch.allclose(RewardModel(path=path, label=1).reward(rollout([""], ["a b"])),
                          torch.tensor([5.0 * SCALE]), atol=1e-5)
    assert torch.allclose(RewardModel(path=path, label=0).reward(rollout([""], ["a b"])),
                          torch.tensor([4.0 * SCALE]), atol=1e-5)
    with pytest.raises(ConfigError, match="2 labels"):
        RewardModel(path=path).reward(rollout([""], ["a"]))
    with pytest.raises(ConfigError, match="0..1"):
        RewardModel(path=path, label=2).reward(rollout([""], ["a"]))


def test_chat_template_of_the_reward_model_is_used(tmp_path):
    # template: each message's content and a space, then a closing "b". Row prompt "a", completion
    # "c" -> "a c b": last token b -> w[3] = 4. Without the template "a " + "c" would score w[0] = 1.
    path = make_model(tmp_path, [[1.0, 2.0, 3.0, 4.0]], "{% for m in messages %}{{ m['content'] }} {% endfor %}b")
    r = rollout(["a "], ["c"])
    r.rows = [{"answer": "1", "prompt": [{"role": "user", "content": "a"}]}]
    assert torch.allclose(RewardModel(path=path).reward(r), torch.tensor([4.0 * SCALE]), atol=1e-5)


def test_missing_folder_fails_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="no such model folder"):
        RewardModel(path=str(tmp_path / "nothing"))


def test_folder_that_is_not_a_classifier(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="cannot load a sequence-classification model"):
        RewardModel(path=str(tmp_path)).reward(rollout([""], ["a"]))
