"""bench/train_floor.py and bench/decode_kernel.py: the ceilings and bounds they divide by, by hand."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import ceiling  # noqa: E402
import decode_kernel  # noqa: E402
import train_floor  # noqa: E402


def test_one_decode_step_multiplies_every_weight_matrix_once():
    # SmolLM2-135M: 30 layers x (QKV 960x576, O 576x576, gate/up 3072x576, down 576x1536) + head 49152x576
    shapes = decode_kernel.shapes(ceiling.SMOLLM2_135M)
    assert len(shapes) == 30 * 4 + 1 == 121
    assert shapes[:4] == [(960, 576), (576, 576), (3072, 576), (576, 1536)] and shapes[-1] == (49152, 576)
    # per layer 552,960 + 331,776 + 1,769,472 + 884,736 = 3,538,944; x 30 = 106,168,320; + 28,311,552 (head)
    assert sum(n * k for n, k in shapes) == 134_479_872


def test_each_training_path_is_divided_by_its_own_flops():
    args = SimpleNamespace(P=2, G=4, prompt_len=100, response_len=128)
    got = train_floor.ceilings(args, rate=1e11, bandwidth=1e10)
    # optimizer: 7 passes x 4 bytes x 134,515,008 params (134,479,872 matmul + 61 norms x 576) / 1e10 B/s
    opt = 7 * 4 * 134_515_008 / 1e10  # 0.3766 s
    # layers only, 8 rows of 228 positions, forward + backward = 3 forwards:
    # 2 x 106,168,320 x 228 = 48,412,753,920; attention 4 x 30 x 576 x (228 x 229 / 2 = 26,106) = 1,804,446,720
    layers = 3 * 8 * (48_412_753_920 + 1_804_446_720) / 1e11  # 12.05 s
    # per row (the plain loop): + head 2 x 28,311,552 x 128 = 7,247,757,312 a row; forward+backward + reference = 4
    per_row = 4 * 8 * (48_412_753_920 + 7_247_757_312 + 1_804_446_720) / 1e11 + opt  # 18.77 s
    assert got["layers only"] == pytest.approx(layers, rel=1e-12)
    assert got["transformers + torch"] == pytest.approx(per_row, rel=1e-12)
    # the shared prompt scores the prompt once per group: fewer FLOPs than per row
    assert opt < got["policyzoo"] < got["transformers + torch"]


def test_the_floor_table_states_the_ratio_of_the_two_trainers():
    args = SimpleNamespace(P=2, G=4, prompt_len=100, response_len=128, threads=2, reps=2)
    res = {"median_s": {"policyzoo": 12.5, "transformers + torch": 13.6, "layers only": 8.0},
           "times": {p: [1.0, 2.0] for p in train_floor.PATHS},
           "ceiling_s": {"policyzoo": 5.0, "transformers + torch": 7.2, "layers only": 4.6},
           "over_ceiling": {"policyzoo": 2.5, "transformers + torch": 13.6 / 7.2, "layers only": 8.0 / 4.6},
           "gflops_fp32": (250.0, 260.0), "copy_gbs": (24.0, 23.0), "load_before": (1.0, 1.0, 1.0),
           "load_after": (1.0, 1.0, 1.0)}
    text = train_floor.table(res, args)
    assert "| layers only | 8.00 | 1.00, 2.00 | 4.60 | 1.74 |" in text  # 8.0 / 4.6 = 1.739
    assert text.endswith("= 0.919")  # 12.5 / 13.6 = 0.9191


def test_length_groups_masks_each_row_to_its_length_and_tables_the_ratio_to_the_best():
    import length_groups
    import torch

    from policyzoo.contract import Rollout

    roll = Rollout(prompt_ids=[[1, 2]] * 2, response_ids=torch.ones(2, 4, dtype=torch.long),
                   response_mask=torch.ones(2, 4, dtype=torch.bool), rollout_logprobs=torch.zeros(2, 4),
                   group_ids=torch.tensor([0, 0]), truncated=torch.zeros(2, dtype=torch.bool))
    length_groups.with_lengths(roll, [3, 1])
    assert roll.response_mask.tolist() == [[True, True, True, False], [True, False, False, False]]
    res = {"times": {"close": {16: [12.0, 11.9, 12.1], 128: [10.0, 10.1, 9.9]}},
           "groups": {"close": {16: [[0], [1]], 128: [[0, 1]]}},
           "gflops_fp32": (250.0, 240.0), "load_before": (1.0, 1.0, 1.0), "load_after": (1.0, 1.0, 1.0)}
    text = length_groups.table(res, SimpleNamespace(threads=2, reps=3))
    assert "| close | 16 | {128} {120} | 12.00 | 12.00, 11.90, 12.10 | 1.20 |" in text  # 12.0 / 10.0
    assert "| close | 128 | {128,120} | 10.00 | 10.00, 10.10, 9.90 | 1.00 |" in text
