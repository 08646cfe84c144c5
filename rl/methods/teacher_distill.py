"""On-policy distillation from a separate, frozen teacher model (GKD, Agarwal et al. 2023,
arXiv 2306.13649; Thinking Machines' on-policy distillation, 2025).

The teacher is any folder `scripts/export.sh` wrote (loaded with transformers'
AutoModelForCausalLM), sharing the student's tokenizer. It scores every token the student sampled,
in the same hint-free context; the loss is the per-token reverse KL from the student to it
(`distill_estimator: sampled`, the on-policy distillation estimator, by default; `full` or `top_k`
as in rl/methods/distill.py), over every completion token (`distill_span: all`), plus
`pg_coef` x the GRPO term (0 by default: distillation alone, as GKD and Thinking Machines).

`experiments/teacher` trains a larger student for longer and exports it where
`experiments/teacher-distill` looks for it (their READMEs).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rl.batch import RowTargets
from rl.methods.distill import DistillConfig, Distilling, score_teacher


@dataclass
class TeacherDistillConfig(DistillConfig):
    teacher_path: str = ""                   # exported model folder; relative = to the experiment folder
    pg_coef: float = 0.0                     # GKD / on-policy distillation: distillation alone
    distill_estimator: str = "sampled"
    distill_span: str = "all"

    PATHS: ClassVar[tuple[str, ...]] = ("teacher_path",)

    def check(self) -> list[str]:
        problems = super().check()
        if not self.teacher_path:
            problems.append("method.teacher_path is required: a model folder scripts/export.sh wrote")
        elif not (Path(self.teacher_path) / "config.json").is_file():
            problems.append(f"method.teacher_path={self.teacher_path!r} is not a model folder (no config.json): "
                            "export a run with scripts/export.sh RUN_DIR OUT_DIR, or train and export the "
                            "default teacher with scripts/train.sh experiments/teacher")
        return problems


def load_teacher(path: str, device, vocab_size: int):
    """The exported teacher as a frozen fp32 model on `device`; refuses another vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if model.get_output_embeddings().weight.size(0) != vocab_size:
        raise ValueError(f"method.teacher_path={path!r}: the teacher's vocabulary has "
                         f"{model.get_output_embeddings().weight.size(0)} tokens, the student's {vocab_size}; "
                         "the teacher must use the student's tokenizer")
    return model.requires_grad_(False).to(device).eval()


class TeacherDistill(Distilling):
    name = "teacher_distill"
    summary = ("on-policy distillation (GKD): a separate frozen teacher model scores the student's sampled tokens; "
               "per-token reverse KL, optionally + GRPO")
    Config = TeacherDistillConfig
    target, prefix = "teacher", "teacher"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.teacher_policy = None            # built at the first step, on the student's device

    def _teacher(self, ctx):
        if self.teacher_policy is None:
            from student.build import build_policy

            model = load_teacher(self.cfg.teacher_path, ctx.policy.device, ctx.tok.vocab_size)
            self.teacher_policy = build_policy(model, pad_id=ctx.tok.pad_id, banned_ids=ctx.tok.never_sampled)
        return self.teacher_policy

    def extend(self, batch, ctx):
        teacher = ctx.metered(self._teacher(ctx))
        rows = list(range(batch.n))
        scores = score_teacher(teacher, self.cfg, batch.prompt_ids, batch.completion_ids_NC, ctx.cfg.rollout.temperature)
        batch.targets[self.target] = RowTargets(rows, scores)
        ctx.lap("teacher_scoring")
        return {}
