"""clip_cov and kl_cov: the covariance selection by hand, and exact across data-parallel ranks
(2 gloo processes with half the rows each equal one process with the whole batch)."""

import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from policyzoo.contract import LOCAL
from policyzoo.plugins.clip import ClipCov, KLCov

# Two rows of two tokens, A = +1 (row 0) and -1 (row 1), so mean A = 0.
ADV = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
MASK = torch.ones(2, 2, dtype=torch.bool)


def test_clip_cov_selects_from_the_band_and_cuts_the_gradient():
    # logprobs [[-0.1, -2.0], [-0.1, -2.0]]: mean -1.05; cov = (A - 0)(lp + 1.05) =
    # [[0.95, -0.95], [-0.95, 0.95]]. Band (0.5, 5): tokens (0, 0) and (1, 1).
    # select_frac 0.5 of N = 4 -> 2 tokens: both band tokens; 0.25 -> 1 token: one of them.
    lp = torch.tensor([[-0.1, -2.0], [-0.1, -2.0]], dtype=torch.float64, requires_grad=True)
    ratio = torch.exp(lp - lp.detach())
    out = ClipCov(select_frac=0.5, cov_low=0.5).clip(ratio, ADV, lp, MASK, LOCAL)
    assert out.loss.detach().tolist() == [[0.0, -1.0], [1.0, 0.0]]  # -A r elsewhere, r = 1
    out.loss.sum().backward()
    assert lp.grad.tolist() == [[0.0, -1.0], [1.0, 0.0]]
    assert out.clipped_high.tolist() == [[True, False], [False, False]]  # A > 0
    assert out.clipped_low.tolist() == [[False, False], [False, True]]   # A < 0
    one = ClipCov(select_frac=0.25, cov_low=0.5).clip(ratio, ADV, lp, MASK, LOCAL)
    cut = (one.clipped_low | one.clipped_high)
    assert int(cut.sum()) == 1 and bool(cut[0, 0] or cut[1, 1])


def test_clip_cov_leaves_out_tokens_ppo_already_clipped():
    # Token (0, 0) has r = 1.5 > 1.2 with A > 0: PPO's clip takes it (loss -1.2, no gradient) and the
    # covariance draw may not pick it, so with select_frac 0.5 only (1, 1) is drawn.
    lp = torch.tensor([[-0.1, -2.0], [-0.1, -2.0]], dtype=torch.float64)
    old = lp - torch.tensor([[math.log(1.5), 0.0], [0.0, 0.0]], dtype=torch.float64)
    out = ClipCov(select_frac=0.5, cov_low=0.5).clip(torch.exp(lp - old), ADV, lp, MASK, LOCAL)
    assert out.loss.flatten().tolist() == pytest.approx([-1.2, -1.0, 1.0, 0.0])
    assert out.clipped_low.tolist() == [[False, False], [False, True]]


def test_kl_cov_penalises_the_top_covariance_tokens():
    # logprobs [[-0.1, -2.0], [-0.3, -2.0]]: mean -1.1; cov = [[1.0, -0.9], [-0.8, 0.9]].
    # select_frac 0.25 -> top-1: (0, 0). log r there = 0.2 (old = lp - 0.2), elsewhere 0:
    # loss(0, 0) = -1 x e^0.2 + 1 x |0.2| = -1.2214028 + 0.2 = -1.0214028; gradient -e^0.2 + 1 = -0.2214028.
    lp = torch.tensor([[-0.1, -2.0], [-0.3, -2.0]], dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.tensor([[0.2, 0.0], [0.0, 0.0]], dtype=torch.float64)
    out = KLCov(select_frac=0.25).clip(torch.exp(lp - old), ADV, lp, old, MASK, LOCAL)
    assert out.loss.detach().flatten().tolist() == pytest.approx([-1.0214028, -1.0, 1.0, 1.0])
    out.loss.sum().backward()
    assert lp.grad.flatten().tolist() == pytest.approx([-0.2214028, -1.0, 1.0, 1.0])
    # select_frac 0.5 -> top-2: (0, 0) and (1, 1) (cov 0.9); a 0.3 log-ratio at (1, 1) adds 0.3
    old2 = lp.detach() - torch.tensor([[0.0, 0.0], [0.0, 0.3]], dtype=torch.float64)
    out2 = KLCov(select_frac=0.5).clip(torch.exp(lp.detach() - old2), ADV, lp.detach(), old2, MASK, LOCAL)
    assert out2.loss[1, 1].item() == pytest.approx(math.exp(0.3) + 0.3)  # -(-1) e^0.3 + 0.3


# ----------------------------------------------------------------------------- 2 ranks
def batch(seed=3):
    """B = 8 rows, T = 6, ragged (row 5 empty), per-row advantages, log-ratios ~ 0.3."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 2, 5, 1, 4, 0, 6, 3])
    mask = torch.arange(6)[None, :] < lengths[:, None]
    adv = torch.randn(8, 1, generator=g, dtype=torch.float64).expand(8, 6) * mask
    lp = -3 * torch.rand(8, 6, generator=g, dtype=torch.float64)
    old = lp + 0.3 * torch.randn(8, 6, generator=g, dtype=torch.float64)
    return adv, lp, old, mask


COMPONENTS = {"clip_cov": (ClipCov, {"select_frac": 0.3, "cov_low": 0.0, "cov_high": 100.0}),
              "kl_cov": (KLCov, {"select_frac": 0.3})}


def run(name, rows, collective):
    cls, params = COMPONENTS[name]
    adv, lp, old, mask = (x[rows] for x in batch())
    lp = lp.clone().requires_grad_(True)
    args = dict(ratio=torch.exp(lp - old), advantages=adv, logprobs=lp, response_mask=mask, collective=collective)
    if name == "kl_cov":
        args["old_logprobs"] = old
    out = cls(**params).clip(**args)
    out.loss.sum().backward()
    cut = torch.zeros_like(mask) if out.clipped_low is None else out.clipped_low | out.clipped_high
    return out.loss.detach(), lp.grad, cut


def _rank(rank, folder):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    torch.distributed.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    from policyzoo.engine.dist import DistCollective

    rows = torch.arange(4 * rank, 4 * rank + 4)
    torch.save({name: run(name, rows, DistCollective()) for name in COMPONENTS}, f"{folder}/{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks")
    mp.spawn(_rank, args=(str(folder),), nprocs=2, join=True)  # a file store: no port for another test to take
    return [torch.load(folder / f"{r}.pt") for r in range(2)]


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_two_ranks_equal_one_rank_with_the_whole_batch(name, two_ranks):
    whole = run(name, torch.arange(8), LOCAL)
    halves = [torch.cat([two_ranks[r][name][i] for r in range(2)]) for i in range(3)]
    assert torch.equal(halves[2], whole[2])                      # the same tokens selected
    assert torch.allclose(halves[0], whole[0], rtol=0, atol=1e-12)  # loss
    assert torch.allclose(halves[1], whole[1], rtol=0, atol=1e-12)  # gradient
    # each rank alone (its own means and count) would select differently: the test is not trivial
    alone = torch.cat([run(name, torch.arange(4 * r, 4 * r + 4), LOCAL)[0] for r in range(2)])
    assert not torch.allclose(alone, whole[0], rtol=0, atol=1e-12)
