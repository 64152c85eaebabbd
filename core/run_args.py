"""The arguments of ``policyzoo train``, ``plan`` and ``serve`` (argparse only: light, so that
``policyzoo --help`` loads no torch); the commands themselves are in :mod:`policyzoo.cli`."""

from __future__ import annotations

import argparse

from .run_config import config_help

TRAIN_EPILOG = ("held-out value (eval_accuracy): the mean over the held-out rows of the task's summed reward of one "
                "greedy completion per row; shown as 'accuracy' when the task's reward is one 0/1 correctness check "
                "(answer_match, math_verify), else as 'held-out reward'.\n\n"
                "config keys (set with key=value; algorithm slot parameters: policyzoo explain NAME):\n")


def train_arguments(t: argparse.ArgumentParser) -> None:
    """``--algo``, ``--config``, ``--trl-config``, ``--output-dir``, ``--max-steps``, ``--resume``,
    ``--force-resume``, ``--dry-run``, ``--verbose`` and the ``key=value`` overrides on ``t``."""
    t.formatter_class = argparse.RawDescriptionHelpFormatter
    t.epilog = TRAIN_EPILOG + config_help()
    t.add_argument("--algo", help="a zoo name or a hybrid entry, e.g. grpo, grpo+clip=cispo, grpo+kl=null")
    t.add_argument("--config", help="a YAML config file")
    t.add_argument("--trl-config", metavar="FILE", help="a TRL GRPOConfig as YAML, ported key by key (TRL's "
                   "defaults for keys it does not give; key=value overrides win; --dry-run shows each key's source)")
    t.add_argument("--output-dir", help="the run directory (default runs/<algo>-<time>)")
    t.add_argument("--max-steps", type=int, metavar="N", help="train N optimizer steps: the same as train.steps=N "
                   "(with --resume: continue up to step N)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last complete checkpoint")
    t.add_argument("--force-resume", action="store_true",
                   help="with --resume: load the checkpoint even if its algorithm, reward, model or data "
                   "config differs")
    t.add_argument("--dry-run", action="store_true", help="run every check the real run makes before loading "
                   "weights (config, plugins, data and the columns the rewards need, model folder and tokenizer, "
                   "prompt lengths, trackers, DeepSpeed config, run directory, checkpoint), print the resolved "
                   "config and exit; nothing is written")
    t.add_argument("--verbose", action="store_true", help="show library logs and warnings that are silenced by "
                   "default (Triton, deprecated reduce_op, NUMA binding, info logs)")
    t.add_argument("overrides", nargs="*", metavar="key=value")


def plan_arguments(pn: argparse.ArgumentParser) -> None:
    """``--algo``, ``--config``, ``--from-run``, ``--gpus``, ``--rollout-tp``, ``--rollout``, ``--gpu``,
    ``--shape`` and the items (``P G L``, ``model=``, ``prompt=``, ``memory=``, ``key=value``) on ``pn``."""
    pn.add_argument("--algo", help="a zoo name or a hybrid entry such as grpo+clip=cispo (default grpo)")
    pn.add_argument("--config", help="a YAML config file")
    pn.add_argument("--from-run", metavar="RUN_DIR", help="plan a finished run and show its measured time split")
    pn.add_argument("--gpus", type=int, help="trainer GPUs (data-parallel ranks): print the model state per GPU")
    pn.add_argument("--rollout-tp", type=int, help="GPUs one vLLM engine is sharded over "
                    "(engine.vllm_tensor_parallel_size)")
    pn.add_argument("--rollout", choices=["colocated", "server"], help="vLLM on the trainer's GPUs or on a server's")
    pn.add_argument("--gpu", help="the GPU whose memory the verdict judges (h100-80gb, a100-80gb, h200-141gb, ...; "
                    "default with --gpus: h100-80gb)")
    pn.add_argument("--shape", help="a known model shape instead of model=PATH (qwen2.5-1.5b, qwen2.5-7b, "
                    "llama-3.1-8b, llama-3.1-70b)")
    pn.add_argument("items", nargs="*", metavar="P G L | model=PATH | prompt=N | memory=GiB | key=value")


def serve_arguments(sv: argparse.ArgumentParser) -> None:
    """vLLM server options (model, host, shared secret, port, parallelism, dtype, ...) and, after ``--``,
    vLLM's own arguments on ``sv``."""
    sv.add_argument("--model", help="model folder or Hub id in the local cache (default: the embedded default)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind; other than loopback only with a shared "
                    "secret (--token-file or POLICYZOO_SERVER_TOKEN)")
    sv.add_argument("--token-file", metavar="FILE", help="a file only you can read (chmod 600) holding the shared "
                    "secret; every route then needs Authorization: Bearer <secret> (or set POLICYZOO_SERVER_TOKEN)")
    sv.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    sv.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs (CPU: workers) the one vLLM engine is "
                    "sharded over (default 1)")
    sv.add_argument("--dtype", default="float32", help="as the trainer's model.dtype (engine.rollout_dtype)")
    sv.add_argument("--max-model-len", type=int, help="vLLM's context length in tokens (default: the model's); a "
                    "run refuses a server whose context is shorter than its prompt + response")
    sv.add_argument("--seed", type=int, default=0, help="vLLM's seed (default 0)")
    sv.add_argument("--served-model-name", help="the model name the OpenAI API serves (default: --model)")
    sv.add_argument("--weight-transfer", help="vLLM weight-transfer backend (default: nccl on CUDA, "
                    "policyzoo_gloo on CPU)")
    sv.add_argument("--kv-cache-gb", type=float, default=1.0, help="CPU only: vLLM's KV cache, GiB")
    sv.add_argument("vllm_args", nargs=argparse.REMAINDER, help="after --: arguments passed to vLLM unchanged")
