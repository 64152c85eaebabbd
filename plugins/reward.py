"""``reward`` components: rollout -> ``rewards [B]`` float (NaN = unscorable).

The step multiplies each component's result by its ``weight`` parameter (declared by
:class:`policyzoo.slots.Reward`, default 1.0) and sums them. Components added to this module must be appended to
``COMPONENTS`` at the bottom.
"""

from __future__ import annotations

import importlib
import math

import torch
from pydantic import Field

from policyzoo.slots import Reward
from policyzoo.data.answers import extract_number
from policyzoo.errors import ConfigError, DataError, UserError
from policyzoo.hookspecs import hookimpl


class RewardFunctionError(UserError):
    """A user reward function could not be imported, raised, or returned the wrong thing."""


# ----------------------------------------------------------------------------- overlong penalty
class OverlongPenalty(Reward):
    """DAPO's soft overlong punishment (eq. 13), ``[B]`` float in [-1, 0].

    With |y| the response's token count (``response_mask`` sum), L_max = ``max_tokens`` and
    L_cache = ``cache``: 0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache if
    L_max - L_cache < |y| <= L_max; -1 if |y| > L_max. ``max_tokens`` None -> the run's
    ``sample.max_tokens``, with an env its ``max_total_tokens`` (resolved in ``check``; the
    rollout's ``max_tokens`` if unchecked);
    ``cache`` None -> 20% of L_max (the paper's ratio, 4096 of 20480), so short budgets do not
    penalise every response; a ``cache`` larger than L_max is clipped to L_max (the ramp then
    starts at length 0).
    Source: Yu et al. 2025, DAPO (arXiv:2503.14476) eq. 13 (L_cache 4096 of 20480 there).
    Errors: ``ConfigError`` when no L_max can be found."""

    name = "overlong_penalty"

    class Params(Reward.Params):
        max_tokens: int | None = Field(None, ge=1, description="L_max (>= 1); None = the run's sample.max_tokens")
        cache: int | None = Field(None, ge=1, description="L_cache (>= 1): length of the linear penalty ramp "
                                  "before L_max; None = 20% of L_max (DAPO's 4096 of 20480)")

    def __init__(self, **params):
        super().__init__(**params)
        self.max_tokens = self.params.max_tokens

    def check(self, run) -> None:
        if self.params.max_tokens is None:
            self.max_tokens = run.max_response_tokens

    @hookimpl
    def reward(self, rollout):
        l_max = self.max_tokens or rollout.max_tokens
        if not l_max:
            raise ConfigError("reward (overlong_penalty).max_tokens", "no L_max: max_tokens is None and "
                              "neither the sampler nor the rollout states a token limit",
                              "set `{use: overlong_penalty, max_tokens: 1024}`")
        cache = min(self.params.cache or max(1, round(0.2 * l_max)), l_max)
        length = rollout.response_mask.sum(-1).double()
        start = l_max - cache
        ramp = (start - length) / cache
        out = torch.where(length <= start, torch.zeros_like(length),
                          torch.where(length <= l_max, ramp, torch.full_like(length, -1.0)))
        return out.float()


# ----------------------------------------------------------------------------- answer match
class AnswerMatch(Reward):
    """Strict numeric answer check, ``[B]`` float in {0.0, 1.0}.

    The completion's answer is the number right after its last "Answer:" or "####" marker if one
    is present, else its last number; ``row["answer"]`` is parsed the same way (so a GSM8K
    solution "... #### 72" works). 1.0 when both are equal as decimals ("72" = "72.0" = "72.00",
    "1,234" = "1234"), else 0.0 (also when the completion has no number). No tolerance, no
    fractions, no LaTeX: use the ``math_verify`` reward for those.
    Errors: ``DataError`` naming the row when it has no parsable ``answer``.
    Source: GSM8K's "#### answer" format (Cobbe et al. 2021, arXiv:2110.14168)."""

    name = "answer_match"
    needs_answer = True  # prompt-only data is refused before training

    @hookimpl
    def reward(self, rollout):
        out = []
        for i, (row, text) in enumerate(zip(rollout.rows, rollout.completions)):
            if "answer" not in row:
                raise DataError(f"reward: answer_match, row {i}", f"the data row has no 'answer' column "
                                f"(columns: {', '.join(map(str, row)) or 'none'})",
                                "add an 'answer' column to the data set, or use another reward")
            gold = extract_number(str(row["answer"]))
            if gold is None:
                raise DataError(f"reward: answer_match, row {i}", f"answer {str(row['answer'])[:80]!r} "
                                "contains no number", "answer_match compares numbers; use math_verify "
                                "or a `function` reward for other answers")
            got = extract_number(text)
            out.append(1.0 if got is not None and got == gold else 0.0)
        if len(out) != len(rollout):
            raise DataError("reward: answer_match", f"{len(rollout)} rows but {len(rollout.rows)} data rows "
                            f"and {len(rollout.completions)} completions", "the sampler must fill rows and completions")
        return torch.tensor(out, dtype=torch.float32)


# ----------------------------------------------------------------------------- user function
def load_function(path: str, where: str):
    """Import ``"package.module:function"``; raise :class:`RewardFunctionError` with the fix."""
    module_name, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:
        raise RewardFunctionError(where, f"cannot import module {module_name!r} of reward function {path!r}: "
                                  f"{type(e).__name__}: {e}", "check the module is importable (installed or "
                                  "on PYTHONPATH) and the path is 'package.module:function'") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardFunctionError(where, f"module {module_name!r} has no attribute {attr!r}",
                                      f"define `def {attr.split('.')[-1]}(prompts, completions, **kwargs)` "
                                      f"in {module_name} or fix the name")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardFunctionError(where, f"{path!r} is a {type(obj).__name__}, not a function",
                                  "point `function` at a callable")
    return obj


class Function(Reward):
    """A user reward function, called TRL-style on the whole batch; ``[B]`` float32.

    ``function`` = "package.module:name" is imported when the run is built (the Python API,
    ``policyzoo.train(rewards=[callable])``, registers a callable under ``policyzoo.api:REWARDS.<name>``).
    It is called with TRL ``GRPOTrainer``'s keyword arguments: ``prompts`` and ``completions``
    (B each), ``completion_ids`` (B lists of generated token ids, end-of-sequence token included when
    generated), ``trainer_state`` (:class:`policyzoo.runstate.TrainerState`: ``global_step``,
    ``max_steps``, ``epoch``), and every other column of the data rows as a list of B values
    (missing keys None; ``prompt``, ``completion`` and ``completion_ids`` are not repeated, keys
    starting with ``_`` are internal). Conversational data (the row's prompt was a list of chat
    messages) gets ``prompts`` as the message lists the model saw and ``completions`` as
    ``[{"role": "assistant", "content": text}]``; plain-text data gets the prompt strings as given in
    the data and the completion strings. It must return B numbers; None means unscorable (NaN).
    Its metric is ``reward/<name>`` (the function's name).
    Errors (:class:`RewardFunctionError`, a ``UserError``): a path that does not import; a raising
    function (the function is re-run row by row to name the first failing row); a result of the
    wrong length or with a non-number (naming the row).
    Source: TRL ``GRPOTrainer._calculate_rewards`` reward-function convention (huggingface.co/docs/trl)."""

    name = "function"

    class Params(Reward.Params):
        function: str = Field(..., pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
                              description="import path 'package.module:function' of "
                              "fn(prompts, completions, **columns)")

    def __init__(self, **params):
        super().__init__(**params)
        self.fn = load_function(self.params.function, f"reward: function -> {self.params.function}")

    @property
    def label(self) -> str:
        """The function's own name (``reward/<name>`` in the metrics), as TRL logs reward functions."""
        return self.params.function.rpartition(":")[2].rpartition(".")[2]

    @staticmethod
    def _columns(rows: list[dict]) -> dict[str, list]:
        skip = {"prompt", "completion", "completion_ids", "prompts", "completions", "trainer_state"}
        keys = list(dict.fromkeys(k for row in rows for k in row if k not in skip and not str(k).startswith("_")))
        return {k: [row.get(k) for row in rows] for k in keys}

    @staticmethod
    def _inputs(rollout, rows: list[dict]) -> tuple[list, list, list]:
        """``(prompts, completions, completion_ids)`` in TRL's form (see the class docstring)."""
        texts = list(rollout.completions)
        ids = [r[m].tolist() for r, m in zip(rollout.response_ids, rollout.response_mask)]
        raw = [row.get("_raw_prompt") for row in rows]
        if raw and all(isinstance(x, list) for x in raw):
            return ([row["prompt"] for row in rows], [[{"role": "assistant", "content": t}] for t in texts], ids)
        prompts = [x if isinstance(x, str) else p for x, p in zip(raw, rollout.prompts)] if rollout.prompts else raw
        return prompts, texts, ids

    def _call(self, prompts, completions, ids, rows):
        from policyzoo.runstate import current

        return self.fn(prompts=list(prompts), completions=list(completions), completion_ids=list(ids),
                       trainer_state=current(), **self._columns(rows))

    @hookimpl
    def reward(self, rollout):
        name = self.params.function
        b = len(rollout)
        rows = rollout.rows if len(rollout.rows) == b else [{} for _ in range(b)]
        prompts, completions, ids = self._inputs(rollout, rows)
        try:
            result = self._call(prompts, completions, ids, rows)
        except Exception as e:
            row = self._failing_row(prompts, completions, ids, rows)
            prompt = rollout.prompt_excerpt(row, 60) if row is not None else ""
            at = f"row {row} (prompt {prompt!r})" if row is not None else "the batch"
            raise RewardFunctionError(f"reward: function {name}", f"{name} raised {type(e).__name__}: {e} "
                                      f"on {at}", f"fix {name} or the data row; return None for rows it "
                                      "cannot score") from None
        try:
            values = list(result)
        except TypeError:
            values = None
        if values is None or len(values) != b:
            got = f"{len(values)} values" if values is not None else repr(type(result).__name__)
            raise RewardFunctionError(f"reward: function {name}", f"returned {got} for {b} completions",
                                      "return one float (or None) per completion, in order")
        out = []
        for i, v in enumerate(values):
            if v is None:
                out.append(math.nan)
                continue
            try:
                out.append(float(v))
            except (TypeError, ValueError):
                raise RewardFunctionError(f"reward: function {name}, row {i}", f"returned {v!r}, not a number",
                                          "return a float, or None for an unscorable row") from None
        return torch.tensor(out, dtype=torch.float32)

    def _failing_row(self, prompts, completions, ids, rows) -> int | None:
        for i in range(len(completions)):
            try:
                self._call(prompts[i:i + 1], completions[i:i + 1], ids[i:i + 1], rows[i:i + 1])
            except Exception:
                return i
        return None


# ----------------------------------------------------------------------------- math-verify
class MathVerify(Reward):
    """Symbolic answer check with the ``math-verify`` package, ``[B]`` float in {0.0, 1.0}.

    1.0 when ``verify(parse(row["answer"]), parse(completion))`` is True: math-verify extracts the
    completion's last boxed / LaTeX / plain expression and compares values symbolically ("42" =
    "\\boxed{42}" = "\\boxed{42.0}", "0.5" = "\\frac{1}{2}"); 0.0 otherwise, including a
    completion with no extractable answer (a wrong format counts as wrong, never as NaN).
    ``timeout`` bounds each parse/verify in seconds with ``signal.alarm``, which works only in the
    main thread; off the main thread the calls run without a time limit.
    Errors: ``UserError`` if the package is missing (at construction, before training);
    ``DataError`` naming the row when ``row["answer"]`` has no parsable answer.
    Source: Hugging Face Math-Verify (github.com/huggingface/Math-Verify), gold first in verify."""

    name = "math_verify"
    needs_answer = True

    class Params(Reward.Params):
        timeout: int = Field(5, ge=1, description="seconds allowed per parse and per verify (main thread only)")

    def __init__(self, **params):
        super().__init__(**params)
        try:
            import math_verify
        except ImportError:
            raise UserError("reward: math_verify", "the math-verify package is not installed",
                            "pip install math-verify  (or: pip install 'policyzoo[data]')") from None
        self.mv = math_verify

    @hookimpl
    def reward(self, rollout):
        import threading

        t = self.params.timeout if threading.current_thread() is threading.main_thread() else None
        if not (len(rollout.rows) == len(rollout.completions) == len(rollout)):
            raise DataError("reward: math_verify", f"{len(rollout)} rows but {len(rollout.rows)} data rows and "
                            f"{len(rollout.completions)} completions", "the sampler must fill rows and completions")
        out = []
        for i, (row, text) in enumerate(zip(rollout.rows, rollout.completions)):
            gold = self.mv.parse(str(row.get("answer", "")), parsing_timeout=t)
            if not gold:
                raise DataError(f"reward: math_verify, row {i}", f"no parsable answer in the data row's 'answer' "
                                f"({str(row.get('answer'))[:80]!r})", "give every row an 'answer' math-verify can read")
            ok = self.mv.verify(gold, self.mv.parse(text, parsing_timeout=t), timeout_seconds=t)
            out.append(1.0 if ok else 0.0)
        return torch.tensor(out, dtype=torch.float32)


# ----------------------------------------------------------------------------- reward model
class RewardModel(Reward):
    """A frozen transformers sequence-classification model as reward, ``[B]`` float32 (logits).

    ``path``: any local folder that ``AutoModelForSequenceClassification`` loads (weights are
    loaded once, lazily, at the first call; the folder is checked at construction). Input text:
    the row's chat ``prompt`` plus the completion as an assistant turn through the reward model's
    own chat template if it has one, else ``rollout.prompts[i] + completion``. Sequences longer
    than ``max_length`` tokens are cut from the left (the end of the completion is kept); batches
    are right-padded (pad = eos if the tokenizer has no pad token). The score is the model's own
    pooled logit (transformers pools at the last non-pad token, as TRL's RewardTrainer trains it)
    for label ``label``; None requires a single-label model. No grad; eval mode; fp32.
    Errors: ``ConfigError`` for a missing folder, a folder that does not load, or a label that is
    not one of the model's; ``UserError`` when transformers is missing.
    Source: Ouyang et al. 2022, InstructGPT (arXiv:2203.02155) Sec. 3.5 (a scalar learned reward)."""

    name = "reward_model"

    class Params(Reward.Params):
        path: str = Field(..., description="local folder of a transformers sequence-classification model")
        batch_size: int = Field(8, ge=1, description="completions scored per forward pass")
        max_length: int = Field(1024, ge=1, description="tokens per scored sequence (cut from the left)")
        label: int | None = Field(None, ge=0, description="logit index to use; None = the single label")

    def __init__(self, **params):
        super().__init__(**params)
        import os

        self.where = f"reward: reward_model -> path {self.params.path}"
        if not os.path.isfile(os.path.join(self.params.path, "config.json")):
            raise ConfigError(self.where, "no such model folder (no config.json there)",
                              "point path at a folder written by save_pretrained")
        self.model = self.tokenizer = None

    def _load(self):
        try:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError:
            raise UserError("reward: reward_model", "the transformers package is not installed",
                            "pip install transformers") from None
        try:
            tok = AutoTokenizer.from_pretrained(self.params.path)
            model = AutoModelForSequenceClassification.from_pretrained(self.params.path, dtype=torch.float32)
        except Exception as e:
            raise ConfigError(self.where, f"cannot load a sequence-classification model: {type(e).__name__}: "
                              f"{str(e)[:200]}", "use a folder with a *ForSequenceClassification model") from None
        n, label = model.config.num_labels, self.params.label
        if (label is None and n != 1) or (label is not None and label >= n):
            raise ConfigError(f"{self.where} -> label", f"the model has {n} labels ({model.config.id2label}), "
                              f"label = {label}", f"set label to one of 0..{n - 1}")
        tok.truncation_side, tok.padding_side = "left", "right"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tok.pad_token_id
        self.tokenizer, self.model = tok, model.eval().requires_grad_(False)

    def _text(self, rollout, i: int) -> str:
        row, completion = rollout.rows[i] if rollout.rows else {}, rollout.completions[i]
        if self.tokenizer.chat_template and isinstance(row.get("prompt"), list):
            chat = row["prompt"] + [{"role": "assistant", "content": completion}]
            return self.tokenizer.apply_chat_template(chat, tokenize=False)
        return rollout.prompts[i] + completion

    @hookimpl
    def reward(self, rollout):
        if self.model is None:
            self._load()
        texts = [self._text(rollout, i) for i in range(len(rollout))]
        step = self.params.batch_size if self.tokenizer.pad_token is not None else 1
        special = not self.tokenizer.chat_template
        out = []
        with torch.no_grad():
            for lo in range(0, len(texts), step):
                enc = self.tokenizer(texts[lo:lo + step], padding=step > 1, truncation=True, return_tensors="pt",
                                     max_length=self.params.max_length, add_special_tokens=special)
                logits = self.model(**enc).logits
                out.append(logits[:, self.params.label or 0].float())
        return torch.cat(out) if out else torch.zeros(0)


# ----------------------------------------------------------------------------- environment reward
class EnvReward(Reward):
    """The environment's episode reward, ``[B]`` float: ``rollout.env_rewards`` (each episode's
    ``Episode.reward()``), so an env's reward goes through the same weighting, metrics
    (``reward/env_reward``) and baselines as any other. The task's default reward when the run
    has an env. Errors: ``ConfigError`` when the run has no ``env``.
    Source: the environment's own reward, ``Episode.reward()`` (the outcome reward of TRL's
    ``environment_factory`` and verl's agent loop)."""

    name = "env_reward"

    def check(self, run) -> None:
        if run.env is None:
            raise ConfigError("rewards (env_reward)", "the run has no environment, so there is no episode reward",
                              "add one, e.g. `algorithm: {base: grpo, env: {use: calculator}}`, or drop env_reward")

    @hookimpl
    def reward(self, rollout):
        if rollout.env_rewards is None:
            raise ConfigError("rewards (env_reward)", "the rollout holds no episode rewards (single-turn sampling)",
                              "set algorithm.env, or drop env_reward")
        return rollout.env_rewards.float()


COMPONENTS = (OverlongPenalty, AnswerMatch, Function, MathVerify, RewardModel, EnvReward)
