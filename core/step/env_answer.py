"""The environment's answer to one model turn of an episode, under the env's ``on_error`` (``stop``,
``retry(k)``, ``drop_group``) and ``step_timeout`` (see :mod:`policyzoo.step.episodes`)."""

from __future__ import annotations

import re
import threading

from policyzoo.contract import Episode, Observation
from policyzoo.errors import ComponentError, UserError


class StepTimeout(Exception):
    """An ``Episode.step`` call ran past the env's ``step_timeout``."""


def call_step(episode: Episode, text: str, ids: list[int], timeout: float | None):
    """``episode.step(text, ids)``; with ``timeout`` in a daemon thread, raising :class:`StepTimeout`
    when it has not returned after ``timeout`` seconds (the thread is left behind)."""
    if timeout is None:
        return episode.step(text, ids)
    box: dict = {}

    def target():
        try:
            box["obs"] = episode.step(text, ids)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True, name="policyzoo-episode-step")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise StepTimeout(f"Episode.step did not return within step_timeout = {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["obs"]


def env_answer(env, trace, text: str, ids: list[int]) -> Observation | None:
    """The env's answer (an :class:`Observation`) to the model turn ``text`` / ``ids`` of the episode ``trace``
    (``trace.episode``), applying ``on_error`` (:mod:`policyzoo.step.episodes`); None when the episode ended
    by a failure (``drop_group``: ``trace.stop`` is then ``error`` or ``timeout``). Raises
    :class:`ComponentError` naming the env when the step fails under ``stop`` / after ``retry(k)``, or
    returns no Observation; a :class:`UserError` raised by the step passes unchanged."""
    policy = getattr(env.params, "on_error", "stop")
    retry = re.fullmatch(r"retry\((\d+)\)", policy)
    tries = 1 + (int(retry.group(1)) if retry else 0)
    for attempt in range(tries):
        try:
            obs = call_step(trace.episode, text, ids, getattr(env.params, "step_timeout", None))
            break
        except UserError:
            raise
        except Exception as e:  # name the environment, keep the cause chained
            if attempt + 1 < tries:
                continue
            if policy == "drop_group":
                trace.stop = "timeout" if isinstance(e, StepTimeout) else "error"
                return None
            what = str(e) if isinstance(e, StepTimeout) else f"Episode.step raised {type(e).__name__}: {e}"
            after = f" ({tries} attempts, on_error: {policy})" if tries > 1 else ""
            raise ComponentError(f"env component {env!r}", what + after,
                                 "fix the environment, or set on_error: retry(k) or drop_group (and step_timeout) "
                                 "on the env; rerun with POLICYZOO_TRACE=1 to see the hook calls") from e
    if not isinstance(obs, Observation):
        raise ComponentError(f"env component {env!r}", f"Episode.step returned {type(obs).__name__}, "
                             "not an Observation", "return policyzoo.Observation(messages=[...]) or done=True")
    return obs
