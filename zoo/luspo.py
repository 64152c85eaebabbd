"""LUSPO: length-unbiased sequence policy optimisation.

GSPO's sequence ratio and clip, but each response's term is summed over its tokens instead of
averaged (the per-sequence objective times |y_i|), which removes GSPO's bias towards short
responses (arXiv:2602.05261); averaged over responses. TRL ``loss_type="luspo"`` with
``importance_sampling_level="sequence"``. Parent: gspo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="luspo",
    parent="gspo",
    paper="LUSPO, Length-Unbiased Sequence Policy Optimization (arXiv:2602.05261)",
    summary="GSPO's sequence ratio and clip, sequence terms summed over tokens (length-weighted)",
    reduce=use("seq_mean_token_sum"),
)
