"""The transformers rollout engine (``engine.rollout: transformers``): a fallback for models vLLM
cannot load, with the interface and conventions of :mod:`policyzoo.engine.rollout.vllm_engine`."""

from __future__ import annotations

import torch

from policyzoo.contract.batch import Rollout
from policyzoo.contract.policy_protocol import Generated
from policyzoo.engine import device

from .engine_base import NEXT_TOP_K, EngineBase, build_rollout, request_seed
from .finish import finish, text_stop


class HFRollout(EngineBase):
    """transformers ``generate`` on a private copy of the weights (no KV-cache sharing).

    A step's prompts go to **one** ``generate`` call, left-padded: on a GPU one call per prompt left it
    launch-bound, 6.6x slower than TRL's rollout at 8 prompts x 8 samples x 128 tokens
    (bench/results/gpu_h200). Each prompt still draws its samples from its own generator, seeded by
    ``request_seed(seed, first_index + i, n)`` (:class:`SeededSampling`), so a prompt samples the same
    whichever batch or data-parallel rank it is in, as vLLM's per-request seeds do. Log-probs are
    the sampled token's under the sampling distribution, ``[B, T]``, computed on the device (never a
    vocabulary-wide ``[B, T, V]`` copy to the host)."""

    def __init__(self, model_info, dtype: str, trust_remote_code: bool = False):
        super().__init__(model_info)
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_info.path), dtype=getattr(torch, dtype),
                                                          trust_remote_code=trust_remote_code)
        self.model.eval().requires_grad_(False)
        self.model.to(device.local_device())

    def _sampling(self, greedy: bool, temperature: float, top_p: float, top_k: int, min_p: float,
                  repetition_penalty: float) -> dict:
        """``generate``'s sampling keywords; greedy sets none of the warpers."""
        return dict(do_sample=not greedy, temperature=None if greedy else temperature,
                    top_p=None if greedy else top_p, top_k=None if greedy else (top_k or None),
                    min_p=None if greedy or not min_p else min_p,
                    repetition_penalty=None if repetition_penalty == 1.0 else repetition_penalty)

    @torch.no_grad()
    def generate(self, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 top_p: float = 1.0, greedy: bool = False, first_index: int = 0, top_k: int = 0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, stop: list[str] = ()) -> Rollout:
        from transformers import LogitsProcessorList

        prompt_ids, texts = self.encode(rows)
        eos = set(self.info.eos_token_ids)
        x, mask = left_pad(prompt_ids, self.info.pad_token_id, self.model.device)
        sampler = None if greedy else SeededSampling(
            [request_seed(seed, first_index + i, n) for i in range(len(prompt_ids))], n,
            temperature, top_p, top_k, min_p)
        # greedy decoding picks the one token the sampler leaves finite (or the argmax when greedy); greedy
        # generate takes one sequence per input, so each prompt is repeated n times here (prompt-major)
        x, mask = x.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        out = self.model.generate(x, attention_mask=mask, max_new_tokens=max_tokens,
                                  **self._sampling(True, temperature, top_p, top_k, min_p, repetition_penalty),
                                  **self._options(stop, x.shape[1]), eos_token_id=list(eos),
                                  logits_processor=LogitsProcessorList([sampler] if sampler else []),
                                  pad_token_id=self.info.pad_token_id, output_scores=greedy,
                                  return_dict_in_generate=True)
        gen = out.sequences[:, x.shape[1]:]  # [P*n, T'], prompt-major
        chosen = chosen_logprobs(out.scores, gen) if greedy else sampler.chosen()
        gen = gen.cpu()
        responses, lps, trunc, comps = [], [], [], []
        for j in range(gen.shape[0]):  # finished rows are padded after their end: finish() drops it
            toks, text, _, cut = finish(self.tokenizer, gen[j].tolist(), eos, stop, max_tokens)
            responses.append(toks)
            lps.append(chosen[j, :len(toks)].tolist())
            trunc.append(cut)
            comps.append(text)
        return build_rollout(prompt_ids, responses, lps, trunc, rows, texts, comps, n, self.info.pad_token_id,
                             temperature, max_tokens, first_index)

    def greedy(self, rows: list[dict], max_tokens: int) -> Rollout:
        return self.generate(rows, 1, max_tokens, 1.0, 0, greedy=True)

    @torch.no_grad()
    def generate_tokens(self, contexts: list[list[int]], max_tokens: list[int], temperature: float,
                        seeds: list[int], top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                        repetition_penalty: float = 1.0, stop: list[str] = ()) -> list[Generated]:
        """One continuation per context, one ``generate`` call each (seeded with ``seeds[i]``);
        ``temperature`` 0 is greedy; sampling options and log-probs as in :meth:`generate`."""
        eos, res = list(self.info.eos_token_ids), []
        for ids, m, seed in zip(contexts, max_tokens, seeds):
            torch.manual_seed(seed)
            stops = self._options(stop, len(ids))
            x = torch.tensor([ids], device=self.model.device)
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=m, eos_token_id=eos,
                                      **self._sampling(temperature == 0, temperature, top_p, top_k, min_p,
                                                       repetition_penalty),
                                      **stops, pad_token_id=self.info.pad_token_id, output_scores=True,
                                      return_dict_in_generate=True)
            gen = out.sequences[:, len(ids):]
            chosen = chosen_logprobs(out.scores, gen)[0]
            toks, text, done, _ = finish(self.tokenizer, gen[0].cpu().tolist(), eos, stop, m)
            res.append(Generated(toks, chosen[:len(toks)].tolist(), text, done))  # EOS or a stop string
        return res

    def _options(self, stop: list[str], start: int) -> dict:
        """``generate``'s stop strings (matched in the decoded text from position ``start``, as vLLM
        does), and ids the tokenizer cannot decode suppressed at the logits."""
        out = {"stopping_criteria": text_stop(self.tokenizer, list(stop), start)} if stop else {}
        if self.info.undecodable_ids:
            out["suppress_tokens"] = self.info.undecodable_ids
        return out

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        params = dict(self.model.named_parameters())
        for name, t in named_tensors:
            params[name].copy_(t)

    @torch.no_grad()
    def score_next(self, ids: list[int], k: int = NEXT_TOP_K) -> dict[int, float]:
        """Log-probs of the ``k`` most likely tokens after ``ids`` (temperature 1; no cache here)."""
        x = torch.tensor([ids], device=self.model.device)
        lp = self.model(x).logits[0, -1].float().log_softmax(-1).cpu()
        top = lp.topk(k)
        return {int(t): float(v) for t, v in zip(top.indices, top.values)}

    @torch.no_grad()
    def score(self, ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], device=self.model.device)
        lp = self.model(x).logits[0, :-1].float().log_softmax(-1)
        return lp.gather(-1, x[0, 1:, None]).squeeze(-1).cpu()


def left_pad(prompt_ids: list[list[int]], pad_id: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded ``[P, L]`` batch of ids and its attention mask (1 on prompt tokens),
    on ``dev``: generation then starts at column ``L`` for every row (transformers derives the
    position ids from the mask)."""
    width = max(len(ids) for ids in prompt_ids)
    x = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, ids in enumerate(prompt_ids):
        x[i, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        mask[i, width - len(ids):] = 1
    return x.to(dev), mask.to(dev)


def chosen_logprobs(scores: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """The sampled tokens' log-probs under the sampling distribution, ``[B, T']`` fp32 on the host:
    ``log_softmax`` of each step's processed scores (``[B, V]``, after temperature and the top-k/p
    filters, as ``generate(output_scores=True)`` returns them) gathered at ``tokens[:, t]`` on the
    device, one step at a time (never a ``[B, T', V]`` tensor). Columns past a row's end hold the
    pad token's value, which callers cut off."""
    if not scores:
        return torch.zeros(tokens.shape[0], 0)
    cols = [s.float().log_softmax(-1).gather(1, tokens[:, t:t + 1]) for t, s in enumerate(scores)]
    return torch.cat(cols, 1).cpu()


class SeededSampling:
    """Samples every prompt's ``n`` rows with that prompt's own ``torch.Generator`` (seeded from
    ``seeds[i]``); a logits processor (any callable of ``input_ids, scores``), the last of a greedy
    ``generate``: it applies temperature, top-k,
    top-p and min-p (transformers' warpers, in ``generate``'s order) after the processors before it
    (repetition penalty, suppressed ids), draws one token per row, records its log-prob under the
    warped distribution, and returns scores that are -inf everywhere but that token, which greedy
    decoding then takes. Rows are prompt-major, ``n`` per prompt. A prompt's generator advances once
    per step whatever the other prompts do, so its samples do not depend on the batch."""

    def __init__(self, seeds: list[int], n: int, temperature: float, top_p: float, top_k: int, min_p: float):
        from transformers.generation.logits_process import (
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.seeds, self.n, self.gens, self.logprobs = seeds, n, None, []
        self.warpers = ([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []) + \
            ([TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else []) + \
            ([MinPLogitsWarper(min_p)] if min_p else [])

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.gens is None:  # on the scores' device
            self.gens = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        for w in self.warpers:
            scores = w(input_ids, scores)
        logp = scores.float().log_softmax(-1)
        n = self.n
        toks = torch.cat([torch.multinomial(logp[i * n:(i + 1) * n].exp(), 1, generator=g)
                          for i, g in enumerate(self.gens)])  # [B, 1]
        self.logprobs.append(logp.gather(1, toks).squeeze(1))
        return torch.full_like(scores, float("-inf")).scatter_(1, toks, 0.0)

    def chosen(self) -> torch.Tensor:
        """The sampled tokens' log-probs, ``[B, T']`` fp32 on the host (columns past a row's end hold
        values of tokens ``generate`` replaced by padding, which callers cut off)."""
        return torch.stack(self.logprobs, 1).cpu() if self.logprobs else torch.zeros(len(self.seeds) * self.n, 0)
