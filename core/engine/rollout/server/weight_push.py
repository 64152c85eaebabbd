"""The trainer's side of the weight push into rollout servers, through vLLM's own weight-transfer
routes (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``; the server runs with ``VLLM_SERVER_DEV_MODE=1``, as ``policyzoo serve``
sets it).

One process group per server: the trainer's rank 0 is group rank 0, the server's TP x PP workers
ranks 1.. (vLLM's ``rank_offset`` convention). Two transports:

* ``policyzoo_gloo`` (CPU servers): a ``ProcessGroupGloo`` over a ``TCPStore`` the trainer opens on a
  port the OS picks (so no free port is guessed); the server's workers run
  ``policyzoo.engine.rollout.server.worker.GlooWeightTransferEngine``.
* ``nccl`` (CUDA servers): vLLM's own ``NCCLWeightTransferEngine`` on the workers, and vLLM's
  ``nccl_common.trainer_init`` (a ``PyNcclCommunicator``) here, unpacked (one broadcast per tensor).
  Written from vLLM 0.32's code, not run here (no GPU).

A push streams the trainer's ``(name, tensor)`` pairs in chunks of at most ``chunk_bytes``: per
chunk, each server's ``/update_weights`` request (the chunk's names, dtypes, shapes) runs in a
helper thread while the tensors are broadcast, since the workers receive inside that request.
"""

from __future__ import annotations

import datetime
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from .protocol import GLOO_BACKEND, ServerError, gloo_group

#: bytes of weights per /update_weights request
CHUNK_BYTES = 256 * 2**20


def local_address(base_url: str) -> str:
    """The address of this machine on the route to the server (the server's workers connect back
    to it): the local end of a UDP socket aimed at the server (no packet is sent)."""
    host, port = base_url.split("://", 1)[1].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, int(port)))
        return s.getsockname()[0]


def chunks(weights, max_bytes: int = CHUNK_BYTES):
    """Lists of ``(name, tensor)`` pairs of at most ``max_bytes`` each (a larger tensor alone)."""
    chunk, size = [], 0
    for name, t in weights:
        nbytes = t.numel() * t.element_size()
        if chunk and size + nbytes > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, t))
        size += nbytes
    if chunk:
        yield chunk


def chunk_info(chunk) -> dict:
    return {"names": [n for n, _ in chunk], "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in chunk],
            "shapes": [list(t.shape) for _, t in chunk]}


class ServerGroup:
    """The process group between this trainer (rank 0) and one server's ``workers``; ``post(path,
    body)`` sends one control request to that server (raising :class:`ServerError`)."""

    def __init__(self, base_url: str, post, backend: str, workers: int, timeout_s: float):
        self.base_url, self.post, self.backend, self.timeout_s = base_url, post, backend, timeout_s
        self.size = 1 + workers
        self.group = None

    def open(self) -> None:
        """Drop any earlier trainer's group on the server, then rendezvous with its workers."""
        import torch

        self.post("/shutdown_weight_transfer_engine", None)
        host = local_address(self.base_url)
        if self.backend == GLOO_BACKEND:
            store = torch.distributed.TCPStore(host, 0, self.size, is_master=True, wait_for_workers=False,
                                               timeout=datetime.timedelta(seconds=self.timeout_s))
            info = {"master_address": host, "master_port": store.port, "rank_offset": 1, "world_size": self.size,
                    "timeout_s": self.timeout_s}
            self._rendezvous(info, lambda: gloo_group(store, 0, self.size, host, self.timeout_s))
        elif self.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            with socket.socket() as s:  # vLLM's StatelessProcessGroup takes a port, not a store
                s.bind((host, 0))
                port = s.getsockname()[1]
            info = {"master_address": host, "master_port": port, "rank_offset": 1, "world_size": self.size,
                    "packed": False}
            self._rendezvous(info, lambda: trainer_init(info, rank=0))
        else:
            raise ServerError(self.base_url, f"the server's weight transfer backend is {self.backend!r}",
                              f"start it with `policyzoo serve` (backend {GLOO_BACKEND} on CPU, nccl on CUDA)")

    def _rendezvous(self, info: dict, join) -> None:
        """The workers block in the init request until the group forms, and ``join`` blocks until
        they come: both run in daemon threads, and a request that fails (a worker that cannot join)
        is raised at once rather than after the group's timeout (the join thread ends with it, and
        never holds the process at exit)."""
        box: dict = {}
        done = threading.Event()

        def run(key, fn):
            try:
                box[key] = fn()
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                box[key + "_error"] = e
            done.set()

        post = lambda: self.post("/init_weight_transfer_engine", {"init_info": info})  # noqa: E731
        threads = [threading.Thread(target=run, args=(k, f), daemon=True, name=f"policyzoo-{k}")
                   for k, f in (("request", post), ("group", join))]
        for t in threads:
            t.start()
        while not ("request_error" in box or "group_error" in box or all(not t.is_alive() for t in threads)):
            done.wait(1.0)
            done.clear()
        for key in ("request_error", "group_error"):
            if key in box:
                raise box[key]
        self.group = box["group"]

    def broadcast(self, tensor) -> None:
        t = tensor.detach().contiguous()
        if self.backend == GLOO_BACKEND:
            self.group.broadcast(t.cpu(), 0).wait()
        else:
            import torch

            self.group.broadcast(t, src=0, stream=torch.cuda.current_stream())


def push(groups: list[ServerGroup], weights, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Send ``weights`` (``(hf_name, tensor)`` pairs) to every server of ``groups``; returns the
    number of tensors. Each server: start, one update per chunk, finish (see the module docstring)."""
    for g in groups:
        g.post("/start_weight_update", None)
    count = 0
    with ThreadPoolExecutor(len(groups)) as ex:
        for chunk in chunks(weights, chunk_bytes):
            body = {"update_info": chunk_info(chunk)}
            pending = [ex.submit(g.post, "/update_weights", body) for g in groups]
            try:
                for _, t in chunk:
                    for g in groups:
                        g.broadcast(t)
            except Exception as e:  # a worker gone mid-broadcast: the request's error says more
                for f in pending:
                    f.exception(timeout=5) if f.done() else None
                raise ServerError("weight push", f"broadcasting the weights failed: {e}",
                                  "the rollout server stopped or lost its connection; restart it and continue "
                                  "with --resume RUN_DIR (the last checkpoint is intact)") from e
            for f in pending:
                f.result()
            count += len(chunk)
    for g in groups:
        g.post("/finish_weight_update", None)
    return count
