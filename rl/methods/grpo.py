"""GRPO as Dr. GRPO writes it: group-relative advantages, PPO-clip, no hints.

Advantages are r - mean of the group (`adv_std_norm` divides by the group's std as in the original
GRPO); the loss is PPO-clip on the sampled tokens with the step's normaliser (`loss_norm`).
"""
from __future__ import annotations

from rl.losses import policy_gradient_loss
from rl.config import MethodConfig
from rl.methods.base import Method


class GRPO(Method):
    name = "grpo"
    summary = "group-relative advantages (Dr. GRPO), PPO-clip, one normaliser per step; no hints"
    Config = MethodConfig

    def policy_gradient(self, micro, scores, norm):
        return policy_gradient_loss(scores.logprobs_NC, micro.old_logprobs_NC, micro.advantages_N, micro.mask_NC,
                                    norm, self.cfg.clip_eps, micro.weight_N)

    def loss(self, micro, scores, norm):
        return self.policy_gradient(micro, scores, norm)
