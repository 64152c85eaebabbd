"""Where one training step's time goes: each phase's seconds and the torch ops inside it.

Runs a GRPO step on the embedded default (GSM8K, P = 2 prompts x G = 4 samples, 128 response tokens,
fp32, 2 threads; the settings of ``make bench``'s 128-token step) through the public
``policyzoo.Trainer``: one untimed step, ``--steps`` steps timed by the run's own phase timers
(``time_rollout``, ``time_reward``, ``time_train``, ``time_sync``: medians), then one step under
``torch.profiler``. Each engine call is marked as a phase (``rollout``: vLLM's generate;
``score``: log-probs of the policy and the reference, with or without gradient; ``backward``;
``optimizer``; ``sync``: the weight push into vLLM and its check), and every torch op is charged
to the phase it ran in, by self time. ``outside ops`` is a phase's time that no torch op accounts
for: Python, vLLM's scheduler and sampler bookkeeping, waits.

    python bench/profile_step.py                      # ~3 min on an idle 2-core machine
    python bench/profile_step.py --max-tokens 256 --out bench/results/profile_step_256.md

The profiler adds its own cost per op (the profiled step is slower than the timed ones): read the
profiled shares within a phase, and the timed medians for the phases' seconds. Timings are only
meaningful on an idle machine; the load before and after is printed with the machine's rates.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: LMPolicy method -> the phase it is charged to
PHASES = {"generate": "rollout", "generate_tokens": "rollout", "run_episodes": "rollout",
          "logprobs": "score", "ref_logprobs": "score", "values": "score", "sum_pi_squared": "score",
          "backward": "backward", "optimizer_step": "optimizer", "sync": "sync"}
TAG = "policyzoo:"


def mark_phases() -> None:
    """Wrap the engine's policy methods in ``torch.profiler.record_function`` ranges named by phase."""
    import torch

    from policyzoo.engine.lm_policy import LMPolicy

    for method, phase in PHASES.items():
        fn = getattr(LMPolicy, method)

        @functools.wraps(fn)
        def marked(*args, __fn=fn, __phase=phase, **kwargs):
            with torch.profiler.record_function(TAG + __phase):
                return __fn(*args, **kwargs)

        setattr(LMPolicy, method, marked)


def charge(events) -> dict[str, dict]:
    """Per phase: its wall seconds (summed over its ranges) and each op's self seconds inside it.

    An op is charged to the innermost phase range that encloses its start on the same thread."""
    ranges = sorted((e.time_range.start, e.time_range.end, e.thread, e.name[len(TAG):])
                    for e in events if e.name.startswith(TAG))
    out: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, "ops": defaultdict(float)})
    outer = []  # ranges not inside another: their lengths are the phase's wall time
    for r in ranges:
        if not any(o[0] <= r[0] and r[1] <= o[1] and o[2] == r[2] for o in outer):
            outer.append(r)
            out[r[3]]["seconds"] += (r[1] - r[0]) / 1e6
    for e in events:
        if e.name.startswith(TAG):
            continue
        t, th = e.time_range.start, e.thread
        inside = [r for r in ranges if r[0] <= t < r[1] and r[2] == th]
        if inside:
            phase = min(inside, key=lambda r: r[1] - r[0])[3]
            out[phase]["ops"][e.name] += e.self_cpu_time_total / 1e6
    return out


def render(timed: dict[str, float], prof: dict[str, dict], top: int, header: str) -> str:
    lines = [header, "", "| phase | s (timed median) | s (profiled) | in torch ops | outside ops "
             "| top ops by self time (share of the profiled phase) |", "|---|---|---|---|---|---|"]
    for phase in ("rollout", "score", "backward", "optimizer", "sync"):
        p = prof.get(phase)
        if p is None:
            continue
        in_ops = sum(p["ops"].values())
        ops = sorted(p["ops"].items(), key=lambda kv: -kv[1])[:top]
        shown = ", ".join(f"`{name}` {s / p['seconds']:.0%}" for name, s in ops)
        when = f"{timed[phase]:.2f}" if phase in timed else "(in train)"
        lines.append(f"| {phase} | {when} | {p['seconds']:.2f} | "
                     f"{in_ops / p['seconds']:.0%} | {1 - in_ops / p['seconds']:.0%} | {shown} |")
    return "\n".join(lines)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2, help="timed steps (after one untimed step)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=6, help="ops shown per phase")
    ap.add_argument("--out", default=str(HERE / "results" / "profile_step.md"))
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra policyzoo settings")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    import ceiling
    import summary as bench_summary
    import torch

    import policyzoo

    load_before = os.getloadavg()
    rates = ceiling.measure(a.threads, 10, 1024)
    mark_phases()
    settings = {"train.steps": a.steps + 2, "train.prompts_per_step": 2, "algorithm.sample.n": 4,
                "algorithm.sample.max_tokens": a.max_tokens, "data.name": "gsm8k", "engine.threads": a.threads,
                **dict(kv.split("=", 1) for kv in a.set)}
    with tempfile.TemporaryDirectory(prefix="policyzoo-profile-") as tmp:
        t = policyzoo.Trainer(algo="grpo", output_dir=os.path.join(tmp, "run"), **settings)
        t.step()  # untimed: first-call costs
        recs = [t.step() for _ in range(a.steps)]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            last = t.step()
        t.loop.part.tracker.close()
    timed = {"rollout": statistics.median(r["time_rollout"] for r in recs),
             "reward": statistics.median(r["time_reward"] for r in recs),
             "train (score + backward + optimizer)": statistics.median(r["time_train"] for r in recs),
             "sync": statistics.median(r["time_sync"] for r in recs),
             "step": statistics.median(r["time_step"] for r in recs)}
    phases = charge(prof.events())
    commit = bench_summary._commit()
    header = (f"One GRPO step, GSM8K, P = 2 x G = 4, {a.max_tokens} response tokens, fp32, {a.threads} threads "
              f"(`python bench/profile_step.py {' '.join(argv if argv is not None else sys.argv[1:])}`, commit "
              f"{commit}). Machine: fp32 matmul {rates[f'fp32 {ceiling.MODEL_SHAPE}'] / 1e9:.0f} GFLOP/s at the "
              f"model's shape, copy {rates['copy bandwidth'] / 1e9:.1f} GB/s; load {load_before[0]:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after, {os.cpu_count()} cores. Timed medians over {a.steps} steps: "
              + ", ".join(f"{k} {v:.2f} s" for k, v in timed.items())
              + f"; the profiled step took {last['time_step']:.2f} s"
              f" ({last.get('rollout_tokens', 0):.0f} response tokens).")
    text = render({"rollout": timed["rollout"], "sync": timed["sync"]}, phases, a.top, header)
    print(text)
    Path(a.out).write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
