"""A run's parts from its config, built in one place: the tokenizer, the task source (with the
eval sets it refuses to train on), the environment, the teacher and the sampling settings. The
trainer, the evaluation command, the teacher gap and mining all start from `run_parts`, so a
setting means the same to each of them (they had built these four times, and only two refused
the private eval sets). The policy is not here: the trainer builds a DeepSpeed engine, the tools
load a checkpoint (rl/load_policy.py)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rl.config import RunConfig
from rl.environments import Environment, build_environment
from rl.tasks import TaskSource
from student.policy import Sampling
from student.model import build_tokenizer
from student.tokenizer import Tokenizer
from teacher import Teacher, build_teacher


@dataclass
class RunParts:
    tok: Tokenizer
    tasks: TaskSource           # training stream, held-out sets, and the eval sets it refuses
    env: Environment
    teacher: Teacher
    sampling: Sampling          # rollout sampling (max_new_tokens per message, temperature)

    def warmstart_teacher(self, cfg: RunConfig) -> Teacher:
        """The teacher that writes warm-start's hints: `warmstart.teacher`, or the run's."""
        kind = cfg.warmstart.teacher or cfg.teacher.kind
        if kind == cfg.teacher.kind or cfg.warmstart.steps == 0:
            return self.teacher
        return build_teacher(dataclasses.replace(cfg.teacher, kind=kind))


def run_parts(cfg: RunConfig, tok: Tokenizer | None = None) -> RunParts:
    tok = tok or build_tokenizer(cfg.student)
    tasks = TaskSource(cfg.task, cfg.seed, cfg.eval)
    sampling = Sampling(max_new_tokens=cfg.rollout.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                        temperature=cfg.rollout.temperature)
    return RunParts(tok, tasks, build_environment(cfg.task.environment, tasks), build_teacher(cfg.teacher), sampling)
