"""TRL contenders for the RL benchmark (benchmarks/rl.py): GRPOTrainer and SDPOTrainer with hints.

Both get the workload exactly as ours does: the saved initial-weights folder (TRL builds models
from a path), a Hugging Face tokenizer with the same byte ids and specials as
`student.ByteTokenizer`, prompts rendered in our chat layout (so token ids match ours one for
one), the same problems in the same order (no shuffling), and reasoning-gym's own verifier as the
reward function. The losses are set to match ours: Dr. GRPO advantages (`scale_rewards="none"`),
token-level mean (`loss_type="dapo"`), PPO-clip 0.2, one optimisation epoch, no reference model.

SDPO gets our per-attempt hints through a subclass of its teacher-context builder: for every
failed attempt, the rule teacher (behind our leak guard) writes a hint about that attempt, and the
teacher context is our hinted prompt; the teacher is the live policy (`teacher_model_kind="live"`),
and the KL is reverse, full vocabulary (`distillation_alpha=1`, `full_logits`), as in ours.
"""
from __future__ import annotations

import time

import torch

from student.tokenizer import ByteTokenizer

def hf_tokenizer(tok: ByteTokenizer):
    """A transformers tokenizer whose ids equal ByteTokenizer's (the one exports ship), left-padded
    for TRL's batched generation."""
    hf = tok.to_transformers()
    hf.padding_side = "left"
    return hf


def prompt_text(prompt: str, hint: str | None = None) -> str:
    """Our chat layout as text; the HF tokenizer turns it into `ByteTokenizer.render_prompt` ids."""
    return "<bos>" + prompt + (f"<hint>{hint}" if hint else "") + "<assistant>"


class StepClock:
    """A TrainerCallback recording the wall time of every optimizer step and the logged metrics.

    Step k's time runs from the end of step k-1 (or the start of training) to the end of step k,
    so it includes everything the trainer does per step: data, generation, reward, loss, update
    and its per-step logging.
    """

    def __init__(self, on_step=None):
        from transformers import TrainerCallback

        clock = self

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                clock.last, clock.last_cpu = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kw):
                now, cpu = time.perf_counter(), time.process_time()
                clock.step_s.append(now - clock.last)
                clock.cpu_s.append(cpu - clock.last_cpu)
                clock.last, clock.last_cpu = now, cpu

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "completions/mean_length" in logs:
                    clock.logs.append(dict(logs))
                    if on_step:
                        on_step(len(clock.logs), clock.step_s[-1] if clock.step_s else 0.0)

        self.step_s: list[float] = []
        self.cpu_s: list[float] = []          # process CPU time (all threads) per step
        self.logs: list[dict] = []
        self.last, self.last_cpu = time.perf_counter(), time.process_time()
        self.callback = _Callback()


def _common_args(w, out_dir: str) -> dict:
    return dict(
        output_dir=out_dir, seed=w.seed, use_cpu=True, bf16=False, report_to="none",
        per_device_train_batch_size=w.prompts * w.samples, gradient_accumulation_steps=1,
        num_generations=w.samples, max_completion_length=w.max_new_tokens, temperature=1.0,
        max_steps=w.steps, learning_rate=w.lr, lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=1.0, logging_steps=1, save_strategy="no", disable_tqdm=True,
        # TRL defaults to activation checkpointing (a second forward inside backward, to save
        # memory); ours does not checkpoint, so TRL runs without it too: its faster setting.
        gradient_checkpointing=False,
        shuffle_dataset=False, scale_rewards="none", loss_type="dapo", epsilon=0.2, beta=0.0,
        dataloader_num_workers=0,
    )


def _dataset(problems):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [prompt_text(p.prompt) for p in problems],
                              "index": list(range(len(problems)))})


def _reward_fn(problems, verifier):
    def reasoning_gym_score(prompts, completions, index, **_):
        # binary, as our trainer's task.reward default: 1 only for a fully correct answer
        # verifier: the task's sources by bucket (rl.tasks.TaskSource.train); a problem is scored by its own
        return [float(verifier[problems[i].bucket].score_answer(c, problems[i].entry) >= 1.0)
                for c, i in zip(completions, index)]
    return reasoning_gym_score


def run_trl(kind: str, w, init_dir: str, problems, verifier, out_dir: str, on_step=None) -> dict:
    """kind: "grpo" / "grpo_gc" (GRPOTrainer without / with activation checkpointing) or "sdpo"
    (SDPOTrainer fed our hints). Returns raw per-step data."""
    tok = ByteTokenizer()
    clock = StepClock(on_step)
    common = dict(model=init_dir, reward_funcs=_reward_fn(problems, verifier),
                  train_dataset=_dataset(problems), processing_class=hf_tokenizer(tok),
                  callbacks=[clock.callback])
    if kind in ("grpo", "grpo_gc"):
        from trl import GRPOConfig, GRPOTrainer

        args = _common_args(w, out_dir) | {"gradient_checkpointing": kind == "grpo_gc"}
        trainer = GRPOTrainer(args=GRPOConfig(**args), **common)
    else:
        from trl.experimental.sdpo import SDPOConfig, SDPOTrainer

        args = SDPOConfig(**_common_args(w, out_dir), distillation_weight=0.5,
                          distillation_mode="full_logits", distillation_alpha=1.0,
                          teacher_model_kind="live", use_successful_as_teacher=False,
                          diagnostics_warning_interval=0)   # its warnings are about successful-rollout teachers
        trainer = SDPOTrainer(args=args, **common)
        trainer.teacher_context_builder = _hint_builder(trainer, problems, tok)
    model = trainer.model
    trainer.train()
    tokens = [log["completions/mean_length"] * w.prompts * w.samples for log in clock.logs]
    reward_key = "self_distillation/reward_mean" if kind == "sdpo" else "reward"
    return {"step_s": clock.step_s, "cpu_s": clock.cpu_s, "tokens": tokens,
            "reward_mean": [log[reward_key] for log in clock.logs],
            "hint_rate": [log.get("self_distillation/reprompt_sample_fraction", 0.0) for log in clock.logs],
            "gradient_checkpointing": trainer.args.gradient_checkpointing,
            "experts_implementation": model.config._experts_implementation,
            "attn_implementation": model.config._attn_implementation}


def _hint_builder(trainer, problems, tok: ByteTokenizer):
    """SDPO's teacher-context builder, subclassed for per-attempt feedback: our rule teacher's hints."""
    from trl.experimental.sdpo.sdpo_trainer import SuccessfulRolloutTeacherContextBuilder

    from rl.hints import hint_failed_attempts
    from rl.tasks import Verdict
    from teacher import LeakGuard, TeacherConfig, build_teacher

    by_prompt = {prompt_text(p.prompt): p for p in problems}

    class HintContextBuilder(SuccessfulRolloutTeacherContextBuilder):
        teacher, guard = build_teacher(TeacherConfig(kind="rule")), LeakGuard()

        def build(self, output, prompts, rewards, feedbacks=None):
            completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
            group = [by_prompt[p] for p in prompts]
            attempts = [tok.decode(row.tolist()) for row in completion_ids]
            verdicts = [Verdict(float(r), "") for r in rewards.tolist()]   # the rule teacher reads the reference
            hinted = hint_failed_attempts(self.teacher, self.guard, tok, group, attempts, verdicts)
            hint_of = dict(zip(hinted.rows, hinted.hints))
            texts = [prompt_text(p.prompt, hint_of.get(i)) for i, p in enumerate(group)]
            teacher = self._tokenize_teacher_messages(texts)
            mask = torch.zeros(len(group))
            mask[hinted.rows] = 1.0
            self.last_metrics = {"self_distillation/reprompt_sample_fraction": mask.mean().item()}
            return {"teacher_input_ids": torch.cat([teacher["prompt_ids"], completion_ids], dim=1),
                    "teacher_attention_mask": torch.cat([teacher["prompt_mask"], completion_mask], dim=1),
                    "self_distillation_mask": mask}

    return HintContextBuilder(trainer)
