"""Hook overhead: the loss through the hooks vs the same math called directly on [B, T] tensors.

Through the hooks: ``policyzoo.assemble(algo)`` once, then per iteration ``micro_loss`` (ratio,
clip, kl, reduce dispatched by pluggy, plus the metric sums it reports) and ``backward``.
Directly: one plain torch function with the same math (asserted equal to the hooked loss and
gradient before timing), forward + backward. Also the bare pluggy dispatch cost (a hook with an
empty implementation). The difference is reported per call and as a fraction of one training step
(``--step-seconds``: the measured time of one GRPO step on this machine, see docs/benchmarks.md).

Run: ``python bench/hook_overhead.py [--algo grpo] [--B 64] [--T 512] [--repeats 200]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pluggy
import torch

import policyzoo
from policyzoo.contract import Rollout, StepBatch
from policyzoo.step import micro_loss, prepare, step_totals


def make_batch(b: int, t: int, g: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (b,), generator=gen)
    mask = torch.arange(t).expand(b, t) < lengths.unsqueeze(-1)
    lp = -torch.rand(b, t, generator=gen) * 3
    old = lp + 0.1 * torch.randn(b, t, generator=gen)
    ref = lp + 0.1 * torch.randn(b, t, generator=gen)
    rewards = (torch.rand(b, generator=gen) > 0.5).float()
    rollout = Rollout(prompt_ids=[[1]] * b, response_ids=torch.ones(b, t, dtype=torch.long), response_mask=mask,
                      rollout_logprobs=old.clone(), group_ids=torch.arange(b) // g,
                      truncated=torch.zeros(b, dtype=torch.bool))
    batch = StepBatch(rollout, rewards, old_logprobs=old, ref_logprobs=ref)
    return batch, lp


def direct_grpo(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    """GRPO's loss written out: PPO clip on the token ratio, k3 in the loss, per-sequence token mean."""
    ratio = torch.exp((lp - old).clamp(-20, 20))
    sur = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps))
    log_r = lp - ref
    k3 = torch.exp(-log_r.clamp(-20, 20)) - 1 + log_r
    per_token = torch.where(mask, sur + beta * k3, torch.zeros_like(sur))
    n = mask.sum(-1)
    return (per_token.sum(-1) / n.clamp(min=1)).sum() / (n > 0).sum()


def timeit(fn, repeats: int, device: str = "cpu") -> list[float]:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(max(3, repeats // 20)):
        fn()
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def dispatch_cost(repeats: int) -> float:
    """Seconds per call of a pluggy hook whose implementation does nothing."""
    mark, spec = pluggy.HookimplMarker("bench"), pluggy.HookspecMarker("bench")

    class Spec:
        @spec(firstresult=True)
        def clip(self, ratio, advantages):
            """empty"""

    class Impl:
        @mark
        def clip(self, ratio, advantages):
            return ratio

    pm = pluggy.PluginManager("bench")
    pm.add_hookspecs(Spec)
    pm.register(Impl())
    x = torch.zeros(1)
    n = repeats * 100
    t0 = time.perf_counter()
    for _ in range(n):
        pm.hook.clip(ratio=x, advantages=x)
    return (time.perf_counter() - t0) / n


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algo", default="grpo", choices=["grpo"], help="bundle (the direct version is GRPO's math)")
    ap.add_argument("--B", type=int, default=64, help="rows (P x G)")
    ap.add_argument("--T", type=int, default=512, help="response tokens")
    ap.add_argument("--G", type=int, default=8, help="samples per prompt")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (the loss tensors' device)")
    ap.add_argument("--step-seconds", type=float, default=None,
                    help="one measured training step (s) to express the overhead as a fraction of")
    a = ap.parse_args(argv)
    if a.B < 1 or a.T < 1 or a.G < 1 or a.B % a.G or a.repeats < 1:
        ap.error("need B, T, G, repeats >= 1 and B a multiple of G")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: torch sees no GPU on this machine")
    if not (a.device == "cpu" or a.device.startswith("cuda")):
        ap.error("--device must be cpu or cuda[:N]")
    torch.set_num_threads(a.threads)
    run = policyzoo.assemble({"base": a.algo, "sample": {"n": a.G}})
    batch, lp0 = make_batch(a.B, a.T, a.G)
    batch, _ = prepare(run, batch)
    totals = step_totals(batch)
    if a.device != "cpu":  # the loss runs where the trainer's log-probs live
        dev = a.device
        r = batch.rollout
        r.response_mask, r.rollout_logprobs = r.response_mask.to(dev), r.rollout_logprobs.to(dev)
        batch.old_logprobs, batch.ref_logprobs = batch.old_logprobs.to(dev), batch.ref_logprobs.to(dev)
        batch.advantages = batch.advantages.to(dev)
        lp0 = lp0.to(dev)
    mask, old, ref, adv = batch.response_mask, batch.old_logprobs, batch.ref_logprobs, batch.advantages

    def hooked():
        lp = lp0.clone().requires_grad_(True)
        loss, _ = micro_loss(run, batch, lp, totals)
        loss.backward()
        return loss, lp.grad

    def direct():
        lp = lp0.clone().requires_grad_(True)
        loss = direct_grpo(lp, old, ref, adv, mask)
        loss.backward()
        return loss, lp.grad

    def direct_metrics():  # direct, plus the four metric sums micro_loss reports
        lp = lp0.clone().requires_grad_(True)
        loss = direct_grpo(lp, old, ref, adv, mask)
        with torch.no_grad():
            r = torch.exp(lp - old)
            log_r = lp - ref
            k3 = torch.exp(-log_r) - 1 + log_r
            _ = [float(x) for x in (((r < 0.8) & (adv < 0) & mask).sum(), ((r > 1.2) & (adv > 0) & mask).sum(),
                                    (r * mask).sum(), (k3 * mask).sum())]
        loss.backward()
        return loss, lp.grad

    (lh, gh), (ld, gd) = hooked(), direct()
    assert torch.allclose(lh, ld, rtol=1e-5, atol=1e-7), (float(lh), float(ld))
    assert torch.allclose(gh, gd, rtol=1e-5, atol=1e-9), float((gh - gd).abs().max())
    th, td, tm = [], [], []
    for _ in range(5):  # interleave to share any drift in machine load
        th += timeit(hooked, a.repeats // 5, a.device)
        td += timeit(direct, a.repeats // 5, a.device)
        tm += timeit(direct_metrics, a.repeats // 5, a.device)
    mh, md, mm = statistics.median(th), statistics.median(td), statistics.median(tm)
    disp = dispatch_cost(a.repeats)
    res = dict(B=a.B, T=a.T, hooked_ms=mh * 1e3, direct_ms=md * 1e3, direct_metrics_ms=mm * 1e3,
               overhead_ms=(mh - md) * 1e3,
               overhead_frac_of_loss=(mh - md) / md, dispatch_us=disp * 1e6, dispatch_calls=4)
    print(f"algo {a.algo}, B={a.B}, T={a.T}, {a.device}, threads {a.threads}, torch {torch.__version__}, "
          f"median of {len(th)} forward+backward runs")
    print("| loss forward+backward | median ms |")
    print("|---|---|")
    print(f"| through the hooks (micro_loss, incl. its metric sums) | {mh * 1e3:.3f} |")
    print(f"| the same math called directly | {md * 1e3:.3f} |")
    print(f"| the same math directly, plus the same four metric sums | {mm * 1e3:.3f} |")
    print(f"| difference hooks - direct | {(mh - md) * 1e3:.3f} ({100 * (mh - md) / md:+.1f}% of the direct loss) |")
    print(f"| difference hooks - direct with metrics | {(mh - mm) * 1e3:.3f} |")
    print(f"| bare pluggy dispatch, one hook call | {disp * 1e3:.4f} "
          "(x 4 calls per micro-batch: ratio, clip, kl, reduce) |")
    if a.step_seconds:
        frac = (mh - md) / a.step_seconds
        res["overhead_frac_of_step"] = frac
        print(f"| difference as a fraction of one {a.step_seconds:.2f} s training step | {frac:.2e} |")
    return res


if __name__ == "__main__":
    main()
