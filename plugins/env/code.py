"""``python_sandbox``: the model writes Python, a bubblewrap sandbox runs it
(:mod:`policyzoo.plugins.env.sandbox`), and its output is the next observation."""

from __future__ import annotations

import math
import re

from pydantic import Field

from policyzoo.contract import Env, Episode, Observation
from policyzoo.data.answers import extract_number
from policyzoo.plugins.env.sandbox import SandboxError, check_sandbox, memory_bound, run_python

CODE_SYSTEM = ("Solve the task by writing Python. Put your program in one ```python ... ``` block; it is run and "
               "you see its output (stdout and stderr). Fix it if it fails. When it works, reply without code: "
               "'Answer: <result>'.")
_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)


def find_code(text: str) -> str | None:
    """The first fenced code block of ``text`` (```python ...```; an unclosed block runs to the
    end), or None when there is none."""
    m = _BLOCK.search(text)
    return m.group(1) if m else None


class CodeEpisode(Episode):
    """One episode: each turn's code block runs in the sandbox, followed by the row's ``tests``
    (Python ``assert`` lines) when it has them; the output is the tool message."""

    def __init__(self, row: dict, params):
        super().__init__(row)
        turns = [{"role": "user", "content": row["prompt"]}] if isinstance(row["prompt"], str) else [
            m for m in row["prompt"] if m.get("role") != "system"]
        self.prompt = [{"role": "system", "content": params.system_prompt or CODE_SYSTEM}, *turns]
        self.params, self.passed, self.final = params, False, None
        self.sandbox_error = ""

    def step(self, turn_text: str, turn_ids: list[int]) -> Observation:
        p = self.params
        code = find_code(turn_text) if p.code_blocks else turn_text
        if code is None:
            self.final = turn_text
            return Observation(done=True)
        tests = self.row.get("tests") or ""
        r = run_python(code + ("\n\n" + tests if tests else ""), timeout_s=p.timeout_s, cpu_s=p.cpu_s,
                       memory_mb=p.memory_mb, max_procs=p.max_procs, max_output_chars=p.max_output_chars,
                       python=p.python, tmp_mb=p.tmp_mb, ro_paths=tuple(p.ro_paths))
        if r.sandbox_error:  # the sandbox failed, not the program: no verdict, the episode is unscorable
            self.sandbox_error = r.sandbox_error
            return Observation(done=True)
        self.passed = bool(tests) and r.ok
        self.last_stdout = r.stdout
        status = ("timed out after {:g} s (killed)".format(p.timeout_s) if r.timed_out
                  else f"killed by signal {r.exit_code - 128} (a CPU, memory or process limit)"
                  if r.exit_code > 128 else f"exit code {r.exit_code}")  # bwrap: 128 + n = died of signal n
        text = f"{status}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}".rstrip()
        done = self.passed and p.stop_when_passed
        return Observation(messages=[] if done else [{"role": p.tool_role, "content": text}], tool_call=True,
                           tool_error=not r.ok, done=done)

    def reward(self) -> float:
        """With ``tests``: 1.0 when the last program passed them. Without: 1.0 when the number in
        the final answer (or, without one, the last run's stdout) equals the row's ``answer``. NaN
        (unscorable) when the sandbox itself failed to run a program (``SandboxResult.sandbox_error``):
        its score ``sandbox_failure`` is then 1 (``env_score/sandbox_failure``, the fraction of episodes)."""
        self.scores["sandbox_failure"] = float(bool(self.sandbox_error))
        if self.sandbox_error:
            return math.nan
        if self.row.get("tests"):
            return 1.0 if self.passed else 0.0
        text = self.final if self.final is not None else getattr(self, "last_stdout", "")
        got, gold = extract_number(text or ""), extract_number(str(self.row.get("answer", "")))
        return 1.0 if got is not None and got == gold else 0.0


class PythonSandbox(Env):
    """A code environment: the model's Python runs in a bubblewrap sandbox with no network, a
    read-only filesystem view, CPU / memory / process / wall-clock limits
    (:mod:`policyzoo.plugins.env.sandbox`), and stdout/stderr come back as the observation.

    Step: the turn's first ```python``` block (the whole turn with ``code_blocks: false``) runs,
    followed by the row's ``tests`` column (assert lines) if present; a turn without code is the
    final answer. A program that fails, times out, or hits a limit (a fork bomb, a memory bomb, an
    attempt to write outside ``/tmp`` or to open a socket) is a tool error
    (``env_tool_errors_mean``) and its output is shown to the model. A program the sandbox could not
    start (bubblewrap, a namespace, mount or cgroup failed) is no failure of the model: the episode
    ends unscored (reward NaN, which the step leaves out of every statistic and gives advantage 0),
    counted as ``env_score/sandbox_failure``. Reward: with ``tests``, 1.0
    when the last program passed them (the episode ends there with ``stop_when_passed``); else 1.0
    when the final answer's number (or the last output's) equals the row's ``answer`` -- GSM8K
    answered by a program. The sandbox is checked when the env is built, before any model loads.
    Source: code-execution RL environments (verl sandbox-fusion tool, prime-rl/verifiers sandboxes,
    TRL OpenEnv); the tests-as-reward of CodeRL (Le et al. 2022, arXiv:2207.01780)."""

    name = "python_sandbox"

    class Params(Env.Params):
        max_turns: int = Field(3, ge=1, description="turn budget: model turns per episode (>= 1)")
        max_total_tokens: int = Field(512, ge=1, description="token budget: model + environment tokens "
                                      "after the prompt (>= 1)")
        system_prompt: str | None = Field(None, description="instructions; None = the built-in ones")
        code_blocks: bool = Field(True, description="run the turn's ```python``` block (false: the whole turn)")
        stop_when_passed: bool = Field(True, description="end the episode when the row's tests pass")
        timeout_s: float = Field(5.0, gt=0, description="wall-clock seconds per run")
        cpu_s: int = Field(5, ge=1, description="CPU seconds per run")
        memory_mb: int = Field(512, ge=32, description="memory per process, MiB: its address space plus /tmp")
        tmp_mb: int = Field(64, ge=1, description="size of the private /tmp (a tmpfs in host memory), MiB; part "
                            "of memory_mb (the address space gets memory_mb - tmp_mb)")
        max_procs: int = Field(8, ge=1, description="processes and threads the sandbox user may have (fork bombs "
                               "stop here)")
        max_output_chars: int = Field(2000, ge=1, description="stdout and stderr: at most N bytes each are kept "
                                      "while read (the head and the tail, with a marker saying how much was cut)")
        tool_role: str = Field("tool", description="chat role of the program's output")
        python: str | None = Field(None, description="interpreter inside the sandbox (None: /usr/bin/python3)")
        ro_paths: list[str] = Field(default_factory=list, description="extra host paths bound read-only inside "
                                    "(absolute; e.g. a venv with numpy); nothing else of the host is visible")

    def __init__(self, **params):
        super().__init__(**params)
        if self.params.tmp_mb >= self.params.memory_mb:
            raise SandboxError(f"env: {self.name}: tmp_mb", f"tmp_mb = {self.params.tmp_mb} must be smaller than "
                               f"memory_mb = {self.params.memory_mb} (/tmp is part of the memory budget)",
                               "lower tmp_mb or raise memory_mb")
        self.protections = check_sandbox(self.params.python, tuple(self.params.ro_paths))

    def notes(self) -> list[str]:
        p = self.params
        active = "; ".join(self.protections)
        b = memory_bound(p.memory_mb, p.tmp_mb, p.max_procs)
        return [f"env {self.name}: each program holds at most {b['process']} MiB in one process (address space "
                f"{p.memory_mb - p.tmp_mb} + /tmp {p.tmp_mb}) and {b['worst']} MiB if it forks up to max_procs = "
                f"{p.max_procs}; episodes run one at a time per rank, so a host with k ranks holds at most "
                f"k x {b['worst']} MiB of sandbox memory; read-only paths: the interpreter's (docs/security.md)"
                + (f" and ro_paths {p.ro_paths}" if p.ro_paths else ""),
                f"env {self.name} protections on this host: {active}"]

    def env(self, row):
        return CodeEpisode(row, self.params)


COMPONENTS = (PythonSandbox,)
