"""REINFORCE++: REINFORCE with PPO's clip and global batch whitening, no critic.

Hu 2025, "REINFORCE++" (arXiv:2501.03262), Sec. 3: per-token k1 KL penalty in the reward, returns
summed to the end of the response (gamma 1), advantages whitened over every token of the batch.
One sample per prompt. Parent: ppo (the same sampling, clip, KL and reduce; no critic).
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="reinforce_pp",
    parent="ppo",
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262), Sec. 3",
    summary="batch-whitened returns, PPO clip, token k1 KL in the reward",
    baseline=use("batch_whiten", gamma=1.0),
)
