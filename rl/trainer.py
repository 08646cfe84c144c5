"""The trainer: warm-start, then RL steps that read in data order.

    rollout -> verify -> teacher hints -> hinted scores -> advantages -> loss -> DeepSpeed step

One step = one optimizer update. Steps count warm-start steps too, so a run's curves show the
warm-start and the RL phase on one axis (`warmstart.steps` marks the boundary).

Many ranks: every rank reads the same global batch in data order and keeps its own slice (whole
prompt groups), samples with its own RNG stream (rank r > 0 reseeds with seed + r after the
identical model initialisation), and DeepSpeed averages gradients. Logged metrics are averaged
over ranks; rank 0 writes the run folder.
"""
from __future__ import annotations

import os
import random
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from rl import checkpoint
from rl.config import RunConfig, to_yaml
from rl import distributed as dist
from rl.engine import build_engine, call_through
from rl.evaluate import eval_metrics, evaluate
from rl.feedback import hint_failed_attempts, teacher_logprobs
from rl.losses import (distill_kl_loss, group_advantages, policy_gradient_loss,
                       sampled_distill_loss, sft_loss, span_to_first_divergence)
from rl.methods import get_method
from rl.rollout import generate, left_pad, right_pad, score
from rl.rollout_model import RolloutModel
from rl.runlog import RunLogger
from rl.tasks import TaskSource
from rl.warmstart import demonstrations
from student import ByteTokenizer, build_student, count_parameters
from student.lean import LeanForward, unsupported as lean_unsupported
from student.router_replay import RouterReplay
from teacher import LeakGuard, build_teacher


class NonFiniteLossError(RuntimeError):
    pass


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: Path):
        self.cfg, self.run_dir = cfg, run_dir
        world = int(os.environ.get("WORLD_SIZE", "1"))
        torch.set_num_threads(cfg.trainer.threads or max(1, (os.cpu_count() or 1) // world))
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.tok = ByteTokenizer()
        self.tasks = TaskSource(cfg.task, cfg.seed)
        self.teacher = build_teacher(cfg.teacher)
        self.guard = LeakGuard()
        self.method = get_method(cfg.method.name)
        self.engine, _, self.scheduler = build_engine(lambda: build_student(cfg.student, self.tok), cfg)
        self.model = self.engine.module
        self.rank, self.world = dist.rank(), dist.world_size()
        self.is_main = self.rank == 0
        if self.rank:
            torch.manual_seed(cfg.seed + self.rank)
        self.rng = random.Random(cfg.seed + self.rank)
        # What generates and scores without gradient: the module itself, or a synced full copy (ZeRO-3).
        self.rollout = RolloutModel(self.engine, lambda: build_student(cfg.student, self.tok))
        # Routes are recorded at every rollout (expert load); replayed only if configured.
        self.routers = RouterReplay(self.model)
        self.rollout_routers = (self.routers if self.rollout.module is self.model
                                else RouterReplay(self.rollout.module))
        self.lean_rollout, self.lean_train = self._lean_forwards()
        self.ckpt_dir = run_dir / "checkpoints"
        self.step, self.nonfinite_streak, resume_step = 0, 0, None
        if cfg.resume:
            self.step, self.tasks.cursor = checkpoint.load(self.engine, self.ckpt_dir, self.rng)
            resume_step = self.step
        self.log = RunLogger(run_dir, to_yaml(cfg), resume_step) if self.is_main else None
        self.n_params = count_parameters(self.rollout.module)

    def _lean_forwards(self) -> tuple[LeanForward | None, LeanForward | None]:
        """The lean forward (student/lean.py) for generation and scoring without gradient, and for
        the training forward when the engine's module is whole (not under ZeRO-3 or expert
        parallelism, where parameters are partitioned and DeepSpeed's own forward gathers them)."""
        if not self.cfg.student.lean_forward:
            return None, None
        reason = lean_unsupported(self.rollout.module)
        if reason is not None:
            if self.is_main:
                tqdm.write(f"[hintrl] student.lean_forward: {reason}; using the transformers forward")
            return None, None
        if self.rollout.module is not self.model:
            return LeanForward(self.rollout.module), None
        return LeanForward(self.model), LeanForward(self.model, runner=partial(call_through, self.engine))

    @property
    def total_steps(self) -> int:
        return self.cfg.warmstart.steps + self.cfg.trainer.steps

    # ------------------------------------------------------------------ the loop
    def train(self) -> dict[str, float]:
        cfg, last_eval = self.cfg, {}
        if self.step == 0:
            last_eval = self.evaluate()
            if self.is_main:
                self.log.log_metrics(0, last_eval)
        bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True,
                   desc=f"{cfg.experiment}/{cfg.method.name}", disable=not self.is_main)
        try:
            while self.step < self.total_steps:
                start = time.perf_counter()
                in_warmstart = self.step < cfg.warmstart.steps
                metrics = self.warmstart_step() if in_warmstart else self.rl_step()
                self.step += 1
                metrics["time/step_s"] = time.perf_counter() - start
                metrics = dist.mean_over_ranks(metrics)
                if self._eval_due(self.step):
                    last_eval = self.evaluate()
                    metrics.update(last_eval)
                if self.is_main:
                    self.log.log_metrics(self.step, metrics)
                if self.step % cfg.trainer.checkpoint_every == 0 or self.step == self.total_steps:
                    checkpoint.save(self.engine, self.ckpt_dir, self.step, self.tasks.cursor,
                                    self.rng, cfg.trainer.keep_checkpoints)
                bar.update(1)
                bar.set_postfix(phase="warm" if in_warmstart else "rl",
                                reward=f"{metrics.get('train/reward_mean', float('nan')):.2f}",
                                acc=f"{last_eval.get('eval/accuracy', float('nan')):.2f}")
        finally:
            bar.close()
            if self.is_main:
                self.log.close()
        return last_eval

    def _eval_due(self, s: int) -> bool:
        return (s % self.cfg.trainer.eval_every == 0 or s == self.cfg.warmstart.steps
                or s == self.total_steps)

    def evaluate(self) -> dict[str, float]:
        """Each rank answers its share of the held-out problems; counts are summed over ranks."""
        self.rollout.sync()
        self.rollout.module.eval()
        mine = self.tasks.eval_problems[self.rank::self.world]
        counts = evaluate(self.rollout.module, mine, self.tasks, self.teacher, self.tok,
                          self.cfg.rollout.max_new_tokens, lean=self.lean_rollout)
        return eval_metrics(dist.sum_over_ranks(counts))

    # ------------------------------------------------------------------ warm-start
    def warmstart_step(self) -> dict[str, float]:
        ws, tok = self.cfg.warmstart, self.tok
        problems = self._my_slice(self.tasks.next_batch(ws.batch_size))
        prompts, answers = demonstrations(problems, self.teacher, self.guard, tok, self.rng,
                                          ws.hint_fraction)
        answers_NC, mask_NC = right_pad(answers, tok.pad_id)
        self.engine.train()

        def loss_of(rows: slice):
            logp, _, aux = score(self.engine, prompts[rows], answers_NC[rows], pad_id=tok.pad_id,
                                 router_logits=True, lean=self.lean_train)
            return (*sft_loss(logp, mask_NC[rows]), aux)

        metrics = self._accumulate(len(prompts), loss_of)
        written, dropped = self.guard.take_counts()
        metrics["hint/leak_rate"] = dropped / max(1, written)
        return metrics

    # ------------------------------------------------------------------ one RL step
    def rl_step(self) -> dict[str, float]:
        cfg, tok, ro = self.cfg, self.tok, self.cfg.rollout
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[f"time/{name}_s"] = now - clock
            clock = now

        # 1. rollout: G attempts per problem, with the sampling policy's log-probs
        problems = self._my_slice(self.tasks.next_batch(ro.prompts_per_step))
        self.tasks.assert_disjoint(problems)
        group = [p for p in problems for _ in range(ro.attempts_per_prompt)]
        prompts = [tok.render_prompt(p.prompt) for p in group]
        self.rollout.sync()
        self.rollout.module.eval()
        # The lean forward returns its routes; the transformers forward's are recorded by hooks.
        with self.rollout_routers.record() if self.lean_rollout is None else nullcontext() as recording:
            roll = generate(self.rollout.module, prompts, max_new_tokens=ro.max_new_tokens, eos_id=tok.eos_id,
                            pad_id=tok.pad_id, temperature=ro.temperature, lean=self.lean_rollout)
        routes = roll.routes.per_row() if roll.routes is not None else recording.routes(batch_size=len(prompts))
        attempts = [tok.decode(row.tolist()) for row in roll.completion_ids_NC]
        lap("rollout")

        # 2. verify
        verdicts = [self.tasks.verify(p, a) for p, a in zip(group, attempts)]
        rewards_BG = torch.tensor([v.reward for v in verdicts]).view(len(problems), -1)
        lap("verify")

        # 3. teacher hints on failed attempts, 4. teacher scores under the hinted context
        hinted, teacher_NC, teacher_NCV = None, None, None
        full = cfg.method.distill_estimator == "full"
        if self.method.uses_teacher:
            hinted = hint_failed_attempts(self.teacher, self.guard, tok, group, attempts, verdicts)
            lap("teacher")
            if hinted.rows:
                teacher_NC, teacher_NCV = teacher_logprobs(
                    self.rollout.module, hinted, roll.completion_ids_NC, pad_id=tok.pad_id,
                    temperature=ro.temperature, lean=self.lean_rollout)
            lap("hinted_scoring")

        # 5. advantages, 6. loss and 7. DeepSpeed step, per gradient-accumulation micro-batch
        adv_N = group_advantages(rewards_BG, cfg.method.adv_std_norm).flatten()
        hint_pos = {row: h for h, row in enumerate(hinted.rows)} if teacher_NC is not None else {}
        prompt_width = max(len(p) for p in prompts)
        self.engine.train()

        def loss_of(rows: slice):
            mine = [i for i, row in enumerate(range(rows.start, rows.stop)) if row in hint_pos]
            kwargs = dict(pad_id=tok.pad_id, temperature=ro.temperature, full=full and bool(mine), router_logits=True)
            if self.lean_train is not None:     # routes as arguments; each distinct prompt forwarded once
                replay = cfg.student.router_replay
                logp_NC, logp_NCV, aux = score(self.engine, prompts[rows], roll.completion_ids_NC[rows],
                                               lean=self.lean_train, routes=roll.routes.select(rows) if replay else None,
                                               replay=self.routers if replay else None, **kwargs)
            else:
                # A micro-batch is left-padded to its own longest prompt: drop the routes' extra columns.
                shift = prompt_width - max(len(p) for p in prompts[rows])
                with self.routers.replay([r[rows, shift:] for r in routes]) if cfg.student.router_replay else nullcontext():
                    logp_NC, logp_NCV, aux = score(self.engine, prompts[rows], roll.completion_ids_NC[rows], **kwargs)
            loss, metrics = policy_gradient_loss(logp_NC, roll.logprobs_NC[rows], adv_N[rows],
                                                 roll.mask_NC[rows], cfg.method.clip_eps)
            if mine:
                h = [hint_pos[rows.start + i] for i in mine]
                distill, m = self._distill_term(logp_NC[mine], logp_NCV[mine] if full else None,
                                                teacher_NC[h], teacher_NCV[h],
                                                roll.completion_ids_NC[rows][mine], roll.mask_NC[rows][mine])
                loss = loss + distill
                metrics.update(m)
            return loss, metrics, aux

        metrics = self._accumulate(len(group), loss_of)

        if cfg.student.router_replay:
            # How often the training forward would have routed a token differently from rollout.
            metrics["router/replay_mismatch"] = self.routers.stats()["mismatch_rate"]
            self.routers.reset_stats()
        if self._eval_due(self.step + 1):
            metrics.update(self._expert_load(routes, prompts, roll.mask_NC))
        metrics.update(self._rl_stats(rewards_BG, roll, hinted))
        metrics.update(timings)
        self._log_rollouts(group, attempts, verdicts, hinted)
        return metrics

    # ------------------------------------------------------------------ helpers
    def _my_slice(self, batch: list) -> list:
        """This rank's contiguous share of a global batch (sizes are validated to divide)."""
        share = len(batch) // self.world
        return batch[self.rank * share:(self.rank + 1) * share]

    def _accumulate(self, n_rows: int, loss_of) -> dict[str, float]:
        """One optimizer update over this rank's n_rows, in `deepspeed.gradient_accumulation_steps`
        micro-batches of consecutive rows: forward + backward each (DeepSpeed scales each loss by
        1/GA and steps the optimizer at the last). loss_of(row slice) -> (loss, metrics, router aux).
        Metrics are averaged over micro-batches; times are summed."""
        ga = self.cfg.deepspeed.gradient_accumulation_steps
        size, parts = n_rows // ga, []
        lr = self.scheduler.get_last_lr()[0]            # the rate this update uses
        for k in range(ga):
            start = time.perf_counter()
            loss, metrics, aux = loss_of(slice(k * size, (k + 1) * size))
            if aux is not None and self.cfg.student.router_aux_loss_coef > 0:
                loss = loss + self.cfg.student.router_aux_loss_coef * aux
                metrics["loss/router_aux"] = aux.item()
            metrics["time/forward_s"] = time.perf_counter() - start
            # One verdict for all ranks: a rank that skips backward while others run it would hang them.
            if not dist.all_ranks(bool(torch.isfinite(loss))):
                return self._skip_nonfinite(metrics, accumulated=k)
            start = time.perf_counter()
            self.engine.backward(loss)
            metrics["time/backward_s"] = time.perf_counter() - start
            start = time.perf_counter()
            self.engine.step()          # applies the update only at the last micro-batch
            metrics["time/optimizer_s"] = time.perf_counter() - start   # clip + AdamW + schedule
            metrics["loss/total"] = loss.item()
            parts.append(metrics)
        self.nonfinite_streak = 0
        out = {k: sum(p[k] for p in parts if k in p) / sum(k in p for p in parts) for k in parts[-1]}
        out.update({k: sum(p[k] for p in parts) for k in parts[-1] if k.startswith("time/")})
        out["train/lr"] = lr
        return out

    def _skip_nonfinite(self, metrics: dict[str, float], accumulated: int) -> dict[str, float]:
        """Skip the update: a NaN would poison the weights and every checkpoint after it."""
        last = checkpoint.list_tags(self.ckpt_dir)
        resume = f"Last good checkpoint: {self.ckpt_dir / last[-1] if last else 'none'} (resume=true continues from it)"
        if accumulated:
            # Earlier micro-batches' gradients already sit in DeepSpeed's buffers; they cannot be
            # dropped safely at every ZeRO stage, so stop before any of them reaches the weights.
            raise NonFiniteLossError(f"loss was NaN/inf in gradient-accumulation micro-batch {accumulated + 1} "
                                     f"of step {self.step + 1}; stopped without updating. {resume}")
        self.nonfinite_streak += 1
        if self.nonfinite_streak >= self.cfg.trainer.max_nonfinite_steps:
            raise NonFiniteLossError(
                f"loss was NaN/inf for {self.nonfinite_streak} consecutive steps (step {self.step}); "
                f"stopped without updating. {resume}")
        return {**{k: v for k, v in metrics.items() if not k.startswith("loss/")},
                "train/nonfinite_skipped": 1.0, "train/lr": self.scheduler.get_last_lr()[0]}

    def _distill_term(self, logp_HC, logp_HCV, teacher_HC, teacher_HCV, completion_HC, mask_HC):
        """coef × KL toward the hinted teacher on H hinted rows; (loss term, metrics)."""
        m = self.cfg.method
        if m.distill_span == "first_divergence":
            mask_HC = span_to_first_divergence(teacher_HCV, completion_HC, mask_HC)
        if m.distill_estimator == "full":
            distill, metrics = distill_kl_loss(logp_HCV, teacher_HCV, mask_HC, m.distill_kl)
        else:
            distill, metrics = sampled_distill_loss(logp_HC, teacher_HC, mask_HC)
        metrics["hint/distill_tokens"] = mask_HC.sum().item() / len(mask_HC)
        return m.distill_coef * distill, metrics

    def _expert_load(self, routes, prompts, mask_NC) -> dict[str, float]:
        """Share of routed slots each expert took per layer, over the rollout's real tokens.

        Logged at eval steps as expert_load/layer<L>/expert<E> (notebooks/analyze_run.ipynb).
        """
        _, prompt_mask_NP = left_pad(prompts, self.tok.pad_id)
        real_NS = torch.cat([prompt_mask_NP.bool(), mask_NC], dim=1)
        num_experts, out = self.cfg.student.num_experts, {}
        for layer, ids_NSK in enumerate(routes):
            ids = ids_NSK[real_NS[:, :ids_NSK.shape[1]]].flatten()
            share = torch.bincount(ids, minlength=num_experts).float() / max(1, ids.numel())
            out.update({f"expert_load/layer{layer}/expert{e}": share[e].item() for e in range(num_experts)})
        return out

    def _rl_stats(self, rewards_BG, roll, hinted) -> dict[str, float]:
        stats = {
            "train/reward_mean": rewards_BG.mean().item(),
            "train/groups_without_signal": (rewards_BG.std(dim=1) == 0).float().mean().item(),
            "train/completion_tokens": roll.mask_NC.sum(1).float().mean().item(),
        }
        written, dropped = self.guard.take_counts()
        if hinted is not None:
            stats["hint/rate"] = len(hinted.rows) / max(1, hinted.requested)
            stats["hint/leak_rate"] = dropped / max(1, written)
            # Failed attempts left without a hint because the teacher failed (counts per step).
            stats["hint/malformed"] = hinted.count("malformed")
            stats["hint/teacher_errors"] = hinted.count("teacher_error")
        return stats

    def _log_rollouts(self, group, attempts, verdicts, hinted) -> None:
        hint_of = dict(zip(hinted.rows, hinted.hints)) if hinted else {}
        n = self.cfg.trainer.log_rollouts
        # The first n attempts, plus up to n more whose teacher reply was malformed (to read why).
        malformed = [i for i, e in (hinted.errors.items() if hinted else ()) if e == "malformed" and i >= n]
        records = []
        for i in list(range(min(n, len(group)))) + malformed[:n]:
            rec = {"prompt": group[i].prompt, "answer": group[i].answer, "attempt": attempts[i],
                   "reward": verdicts[i].reward, "feedback": verdicts[i].feedback, "hint": hint_of.get(i)}
            if hinted and i in hinted.replies:        # model teachers: the raw reply, and any failure
                rec.update(teacher_reply=hinted.replies[i], hint_error=hinted.errors.get(i))
            elif hinted and i in hinted.errors:
                rec["hint_error"] = hinted.errors[i]
            records.append(rec)
        # Logged under the step number this update will complete, like its metrics.
        if self.is_main:
            self.log.log_rollouts(self.step + 1, records)
