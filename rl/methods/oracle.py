"""The oracle: supervised learning on the reference answers of the RL phase's own problems.

What a study's `oracle` arm shows (`name: {kind: oracle}` in study.yaml, rl/study.py): whether the
regime is learnable at all by this student within this budget. It sees the problems RL sees (the
same task mix, `rollout.prompts_per_step` problems per step, the same steps) and trains on each
problem's reference answer, rendered as warm-start demonstrations render it (rl/warmstart.py's
`split_demonstration`, never with a hint), repeated `rollout.attempts_per_prompt` times: a step
trains on as many rows as a GRPO step, and about as many tokens (an answer is about as long as an
attempt), with every row correct. An RL arm that ends below the oracle has room left to learn; an
oracle that does not move the held-out accuracy says the budget, not the method, is the limit.

It generates nothing (`generates = False`): the trainer's RL step skips rollout, verify, advantages
and `extend`, asks `references` for the step's rows and trains on them with `loss`
(rl/trainer.py::reference_step). Its budget counters read 0 generated and 0 scored tokens; trained
tokens are the answers' tokens.

    loss = -(1 / norm) * sum over rows n, tokens c of mask_NC * log pi(y_nc | prompt_n, y_n<c)

norm is the step's one normaliser (`method.loss_norm`: the step's answer tokens, or rows x
rollout.max_new_tokens), as for the other methods (rl/losses.py::sft_loss).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.config import MethodConfig
from rl.losses import sft_loss
from rl.methods.base import Method
from rl.warmstart import right_pad, split_demonstration


@dataclass
class References:
    """The rows of a step without rollouts. Shapes: N rows, C completion tokens."""
    prompt_ids: list[list[int]]          # through the first <assistant>
    completion_ids_NC: torch.Tensor      # the reference episode from there on, right-padded
    mask_NC: torch.Tensor                # bool: the assistant messages' own tokens (the targets)

    @property
    def n(self) -> int:
        return len(self.prompt_ids)

    def select(self, index: list[int]) -> "References":
        idx = torch.tensor(index, dtype=torch.long, device=self.completion_ids_NC.device)
        return References([self.prompt_ids[i] for i in index], self.completion_ids_NC[idx], self.mask_NC[idx])


class Oracle(Method):
    name = "oracle"
    summary = "supervised on the reference answers of the RL problems, G copies each; no rollouts (upper bound)"
    Config = MethodConfig
    generates = False

    def references(self, group: list, tok, env, device=None) -> References:
        """One row per entry of `group` (each problem repeated G times by the trainer): its
        demonstration episode (`env.demonstration`), split into prompt and targets."""
        rendered = {}
        for problem in group:           # the G copies of a problem render alike: once each
            if id(problem) not in rendered:
                rendered[id(problem)] = split_demonstration(tok, env.demonstration(problem))
        prompts, answers, masks = zip(*(rendered[id(p)] for p in group))
        answers_NC, mask_NC = right_pad(list(answers), tok.pad_id, device, list(masks))
        return References(list(prompts), answers_NC, mask_NC)

    def loss(self, micro: References, scores, norm):
        return sft_loss(scores.logprobs_NC, micro.mask_NC, norm)
