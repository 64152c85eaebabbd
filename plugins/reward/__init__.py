"""``reward`` components: rollout -> ``rewards [B]`` float (NaN = unscorable), one module per family.

The step multiplies each component's result by its ``weight`` parameter (declared by
:class:`policyzoo.contract.Reward`, default 1.0) and sums them. A component added to a module here
must be appended to ``COMPONENTS``.
"""

from policyzoo.data.answers import extract_number
from policyzoo.plugins.reward.answer_checks import AnswerMatch, MathVerify
from policyzoo.plugins.reward.env import EnvReward
from policyzoo.plugins.reward.function import Function, RewardFunctionError, load_function
from policyzoo.plugins.reward.gym import GymScore, GymScoreError
from policyzoo.plugins.reward.judge import GroupJudge, Judge
from policyzoo.plugins.reward.model import RewardModel
from policyzoo.plugins.reward.overlong import OverlongPenalty
from policyzoo.plugins.reward.remote import RemoteReward, RemoteRewardError

COMPONENTS = (OverlongPenalty, AnswerMatch, Function, MathVerify, RewardModel, EnvReward, RemoteReward, Judge,
              GroupJudge, GymScore)
__all__ = ["COMPONENTS", "AnswerMatch", "EnvReward", "Function", "GroupJudge", "GymScore", "GymScoreError", "Judge",
           "MathVerify", "OverlongPenalty",
           "RemoteReward", "RemoteRewardError", "RewardFunctionError", "RewardModel", "extract_number", "load_function"]
