"""bench/profile_step.py: every torch op is charged to the phase it ran in, by self time."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import profile_step  # noqa: E402


def ev(name, start_us, end_us, self_us=0.0, thread=1):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start_us, end=end_us), thread=thread,
                           self_cpu_time_total=self_us)


def test_ops_are_charged_to_the_innermost_phase_on_their_thread():
    tag = profile_step.TAG
    events = [
        ev(tag + "rollout", 0, 1_000_000),                   # 1.0 s of rollout
        ev("aten::mm", 100_000, 400_000, 250_000),           # inside the rollout
        ev("aten::mm", 500_000, 600_000, 100_000),
        ev(tag + "sync", 2_000_000, 2_500_000),              # 0.5 s of sync ...
        ev(tag + "score", 2_100_000, 2_300_000),             # ... with a nested check scoring 0.2 s
        ev("aten::log_softmax", 2_150_000, 2_250_000, 80_000),  # charged to score, the innermost
        ev("aten::copy_", 2_400_000, 2_450_000, 40_000),     # charged to sync
        ev("aten::add", 2_050_000, 2_060_000, 5_000, thread=2),  # another thread: no phase
        ev("aten::mul", 3_000_000, 3_100_000, 70_000),       # outside every phase
    ]
    out = profile_step.charge(events)
    # wall time: the outermost ranges only (the nested score range is inside sync's 0.5 s)
    assert out["rollout"]["seconds"] == 1.0 and out["sync"]["seconds"] == 0.5
    assert out["score"]["seconds"] == 0.0
    # self times: mm 0.25 + 0.10 = 0.35 s in rollout; log_softmax 0.08 s in score; copy_ 0.04 s in sync
    assert dict(out["rollout"]["ops"]) == {"aten::mm": 0.35}
    assert dict(out["score"]["ops"]) == {"aten::log_softmax": 0.08}
    assert dict(out["sync"]["ops"]) == {"aten::copy_": 0.04}
    assert all("aten::add" not in p["ops"] and "aten::mul" not in p["ops"] for p in out.values())


def test_render_shows_the_share_in_ops_and_outside():
    prof = {"rollout": {"seconds": 2.0, "ops": {"aten::mm": 1.0, "aten::add": 0.5}}}
    text = profile_step.render({"rollout": 1.8}, prof, top=1, header="h")
    # in ops: (1.0 + 0.5) / 2.0 = 75 %, outside: 25 %; the top op: 1.0 / 2.0 = 50 %
    assert "| rollout | 1.80 | 2.00 | 75% | 25% | `aten::mm` 50% |" in text
    assert "aten::add" not in text


def test_decode_probe_compares_ids_and_logprobs_up_to_the_first_difference():
    import vllm_decode

    ref = {"ids": [[1, 2, 3], [4, 5, 6]], "logprobs": [[-0.1, -0.2, -0.3], [-1.0, -1.0, -1.0]]}
    other = {"ids": [[1, 2, 3], [4, 9, 6]], "logprobs": [[-0.1, -0.25, -0.3], [-1.0, -3.0, -1.0]]}
    out = vllm_decode.compare(ref, other)
    # row 1 has the same ids (|-0.2 - -0.25| = 0.05); row 2 differs at position 1, so only position 0
    # (difference 0) is compared and the -3.0 after the divergence is not counted
    assert out["rows_same_ids"] == 1
    assert abs(out["max_logprob_diff"] - 0.05) < 1e-12
