"""The trainer: warm-start, then RL steps that read in data order.

    rollout -> verify -> advantages -> the method's stages (e.g. hints, teacher scores)
            -> per micro-batch: score -> the method's loss terms -> backward -> DeepSpeed step

Everything the step knows sits in one `Batch` (rl/batch.py); a method (rl/methods/) adds stages
and loss terms without the step changing. Generation and scoring go through the policy interface
(student/policy.py): `self.policy` (no gradient: rollouts, teacher scores, evaluation) and
`self.train_policy` (the training forward, through the DeepSpeed engine). A distilling method's
self-teacher runs on `self.teacher_weights` (the live student, an EMA of it, or its weights when RL
began: rl/teacher_weights.py). Every step's generated, scored and trained tokens are counted
(rl/budget.py), so runs can be compared at equal compute.

One step = one optimizer update. Steps count warm-start steps too, so a run's curves show the
warm-start and the RL phase on one axis (`warmstart.steps` marks the boundary).

Many ranks: every rank reads the same global batch in data order and keeps its own slice (whole
prompt groups), samples with its own RNG stream (rank r > 0 reseeds with seed + r after the
identical model initialisation), and DeepSpeed averages gradients. Logged metrics are averaged
over ranks; rank 0 writes the run folder.
"""
from __future__ import annotations

import errno
import hashlib
import os
import random
import time
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from rl import checkpoint
from rl.assembly import run_parts
from rl.batch import Batch, micro_batches
from rl.budget import Budget, Metered
from rl.config import RunConfig, to_yaml
from rl import distributed as dist
from rl.engine import build_engine, call_through
from rl.episodes import Episodes
from rl.contamination import prompt_hash
from rl.evals import EvalContext, metrics_of, run_suites
from rl.losses import group_advantages, normaliser, sft_loss
from rl.methods import StepContext, get_method
from rl.rollout_model import RolloutModel
from rl.runlog import RunLogger
from rl.teacher_weights import TeacherWeights
from rl.warmstart import demonstrations, right_pad
from student import build_student, count_parameters
from student.build import build_policy
from student.policy import left_pad
from student.rollout_engine import ROLLOUT_ENGINES, EngineRequest
from teacher import LeakGuard


class NonFiniteLossError(RuntimeError):
    pass


def engine_agreement(gap: torch.Tensor) -> dict[str, float]:
    """How far the training forward's log-probs of the sampled tokens sit from the ones the rollout
    engine reported, before the update (so the same weights): |log pi_train - log pi_rollout|, and
    the spread of the importance ratio pi_train / pi_rollout it puts into the loss."""
    if gap.numel() == 0:
        return {}
    gap = gap.float()
    return {"rollout/logprob_mismatch_mean": gap.abs().mean().item(),
            "rollout/logprob_mismatch_max": gap.abs().max().item(),
            "rollout/ratio_std": gap.exp().std(unbiased=False).item()}


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: Path):
        self.cfg, self.run_dir = cfg, run_dir
        world = int(os.environ.get("WORLD_SIZE", "1"))
        torch.set_num_threads(cfg.trainer.threads or max(1, (os.cpu_count() or 1) // world))
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        parts = run_parts(cfg)
        self.tok, self.tasks, self.env, self.teacher, self.sampling = (parts.tok, parts.tasks, parts.env,
                                                                       parts.teacher, parts.sampling)
        self.warmstart_teacher = parts.warmstart_teacher(cfg)
        self.guard = LeakGuard()
        self.method = get_method(cfg.method.name)(cfg.method)
        self.engine, _, self.scheduler = build_engine(lambda: build_student(cfg.student, self.tok), cfg)
        self.model = self.engine.module
        self.rank, self.world = dist.rank(), dist.world_size()
        self.is_main = self.rank == 0
        if self.rank:
            torch.manual_seed(cfg.seed + self.rank)
        self.rng = random.Random(cfg.seed + self.rank)
        # What generates and scores without gradient: the module itself, or a synced full copy (ZeRO-3).
        self.rollout = RolloutModel(self.engine, lambda: build_student(cfg.student, self.tok))
        self.policy, self.train_policy = self._policies()
        self.rollout_engine = ROLLOUT_ENGINES[cfg.rollout.engine](EngineRequest(
            self.rollout.module, self.policy, cfg.rollout, run_dir / f"{cfg.rollout.engine}-engine-rank{self.rank}.log",
            dtype=cfg.student.dtype, seed=cfg.seed + self.rank, pad_id=self.tok.pad_id,
            banned_ids=self.tok.never_sampled))
        self.policy = self.rollout_engine.policy
        self._pushed_step, self._sync_seconds = None, 0.0
        mode, ema_rate = self.method.teacher_weights()
        self.teacher_weights = TeacherWeights(
            mode, ema_rate, self.rollout, lambda: build_student(cfg.student, self.tok),
            lambda module: build_policy(module, lean=cfg.student.lean_forward, pad_id=self.tok.pad_id,
                                        banned_ids=self.tok.never_sampled), self.policy)
        self.budget = Budget()
        self.ckpt_dir = run_dir / "checkpoints"
        self.step, self.nonfinite_streak, resume_step = 0, 0, None
        restored = checkpoint.load(self.engine, self.ckpt_dir, self.rng) if cfg.resume else None
        if restored is not None:
            self.step, self.tasks.cursor, state, path = restored
            self.budget.load(state.get("budget"))
            self.teacher_weights.load(path)
            resume_step = self.step
        elif cfg.resume:
            # Killed before its first checkpoint was complete: nothing to continue, so the run starts
            # over (resume_step -1 clears what it had logged).
            resume_step = -1
            if self.is_main:
                tqdm.write(f"[checkpoint] {self.ckpt_dir}: no complete checkpoint; starting the run over")
        config_yaml = to_yaml(cfg)
        self.log = RunLogger(run_dir, config_yaml, resume_step) if self.is_main else None
        self.config_hash = hashlib.sha256(config_yaml.encode()).hexdigest()[:16]
        self.n_params = count_parameters(self.rollout.module)
        if self.is_main:
            self.log.write_json("eval_sets.json", {name: sorted(hashes) for name, hashes in self.tasks.eval_sets.items()})
            for name, refused in self.tasks.refused_at_load.items():
                if refused:
                    tqdm.write(f"[contamination] task.files.{name}: {refused} problem(s) are in an eval set this run "
                               "reports; not trained on")

    def _policies(self):
        """The no-gradient policy over the rollout model and the training policy over the engine.
        The lean forward (student.lean_forward) serves the training forward only when the engine's
        module is whole (not under ZeRO-3 or expert parallelism, whose forwards gather parameters)."""
        tok, lean = self.tok, self.cfg.student.lean_forward
        common = dict(pad_id=tok.pad_id, banned_ids=tok.never_sampled)
        policy = build_policy(self.rollout.module, lean=lean, warn=tqdm.write if self.is_main else None, **common)
        whole = self.rollout.module is self.model
        train = build_policy(self.model, lean=lean and whole, forward=self.engine,
                             runner=partial(call_through, self.engine), **common)
        return policy, train

    def _sync_rollout(self) -> None:
        """Bring what generates up to the trained weights: the rollout model (ZeRO-3 / EP copy) and
        a rollout engine with weights of its own (pushed once per optimizer step, before its next
        use; the seconds it took are logged with the step as time/weight_sync_s)."""
        self.rollout.sync()
        self.rollout.module.eval()
        if not self.rollout_engine.pushes_weights or self._pushed_step == self.engine.global_steps:
            return
        self._sync_seconds += self.rollout_engine.push_weights(self.rollout.module, f"step {self.engine.global_steps}")
        self._pushed_step = self.engine.global_steps

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
                start, refused = time.perf_counter(), self.tasks.skipped
                in_warmstart = self.step < cfg.warmstart.steps
                metrics = self.warmstart_step() if in_warmstart else self.rl_step()
                # training problems drawn this step and refused: their prompt is in an eval set
                metrics["data/refused_eval_overlap"] = self.tasks.skipped - refused
                self.step += 1
                metrics["time/step_s"] = time.perf_counter() - start
                metrics.update(self.budget.close_step())
                metrics = dist.mean_over_ranks(metrics)
                if self._eval_due(self.step):
                    last_eval = self.evaluate()
                    metrics.update(last_eval)
                if self.rollout_engine.pushes_weights:
                    metrics["time/weight_sync_s"], self._sync_seconds = self._sync_seconds, 0.0
                if not self.run_dir.is_dir():
                    # deleted under us: appending would quietly start a new, partial run folder
                    raise FileNotFoundError(errno.ENOENT, "the run folder is gone", str(self.run_dir))
                if self.is_main:
                    self.log.log_metrics(self.step, metrics)
                if self.step % cfg.trainer.checkpoint_every == 0 or self.step == self.total_steps:
                    checkpoint.save(self.engine, self.ckpt_dir, self.step, self.tasks.cursor,
                                    self.rng, cfg.trainer.keep_checkpoints, state={"budget": self.budget.state()},
                                    write=self.teacher_weights.save, meta={"config_sha256": self.config_hash})
                bar.update(1)
                bar.set_postfix(phase="warm" if in_warmstart else "rl",
                                reward=f"{metrics.get('train/reward_mean', float('nan')):.2f}",
                                acc=f"{last_eval.get('eval/accuracy', float('nan')):.2f}")
        finally:
            bar.close()
            if self.is_main:
                self.log.close()
            self.rollout_engine.close()
        return last_eval

    def _eval_due(self, s: int) -> bool:
        return (s % self.cfg.trainer.eval_every == 0 or s == self.cfg.warmstart.steps
                or s == self.total_steps or s - self.cfg.warmstart.steps in self.cfg.trainer.eval_at)

    def evaluate(self) -> dict[str, float]:
        """The suites of `eval.suites` (rl/evals/): each rank answers its share of every eval set;
        counts are summed over ranks. With difficulty buckets, each bucket's metrics are also logged
        under eval/<metric>/<bucket>."""
        self._sync_rollout()
        teacher = self.teacher_weights.policy() if self.teacher_weights.started else self.policy
        ctx = EvalContext(policy=self.policy, tasks=self.tasks, teacher=self.teacher, tok=self.tok, env=self.env,
                          max_new_tokens=self.cfg.rollout.max_new_tokens, max_turns=self.cfg.rollout.max_turns,
                          teacher_policy=teacher, temperature=self.cfg.rollout.temperature,
                          pass_k=self.cfg.eval.pass_k, seed=self.cfg.seed)
        return metrics_of(run_suites(self.cfg.eval.suites, ctx, self.rank, self.world, dist.sum_over_ranks))

    # ------------------------------------------------------------------ warm-start
    def warmstart_step(self) -> dict[str, float]:
        ws, tok = self.cfg.warmstart, self.tok
        problems = self._my_slice(self.tasks.next_batch(ws.batch_size, ws.mix or None))
        prompts, answers, masks = demonstrations(problems, self.warmstart_teacher, self.guard, tok, self.rng,
                                                 ws.hint_fraction, self.env, ws.hint_fraction_by_bucket)
        answers_NC, mask_NC = right_pad(answers, tok.pad_id, self.policy.device, masks)
        norm = self._normaliser("token", mask_NC, len(prompts))
        self.budget.add_sequences("trained", prompts, mask_NC)
        self.engine.train()

        def loss_of(index: list[int]):
            scores = self.train_policy.score([prompts[i] for i in index], answers_NC[index], router_aux=True)
            return (*sft_loss(scores.logprobs_NC, mask_NC[index], norm), scores.aux_loss)

        metrics = self._accumulate(len(prompts), loss_of)
        written, dropped = self.guard.take_counts()
        metrics["hint/leak_rate"] = dropped / max(1, written)
        return metrics

    # ------------------------------------------------------------------ one RL step
    def rl_step(self) -> dict[str, float]:
        if not self.method.generates:
            return self.reference_step()
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[f"time/{name}_s"] = now - clock
            clock = now

        batch, metrics = self.collect(lap)
        metrics.update(self.update(batch))
        self.teacher_weights.update()        # ema: one step toward the updated student
        if self._eval_due(self.step + 1):
            metrics.update(self._expert_load(batch))
        metrics.update(self._rl_stats(batch, self.cfg.rollout.attempts_per_prompt))
        metrics.update(timings)
        self._log_rollouts(batch)
        return metrics

    def reference_step(self) -> dict[str, float]:
        """The RL step of a method that generates nothing (`Method.generates` False: the oracle,
        rl/methods/oracle.py): the problems a rollout would draw, G rows each as the method renders
        them (reference answers), its loss over the step's one normaliser. The budget counts trained
        tokens only: nothing is generated or scored."""
        ro = self.cfg.rollout
        problems = self._my_slice(self.tasks.next_batch(ro.prompts_per_step))
        self.tasks.assert_disjoint(problems)
        rows = self.method.references([p for p in problems for _ in range(ro.attempts_per_prompt)], self.tok,
                                      self.env, self.policy.device)
        norm = self._normaliser(self.cfg.method.loss_norm, rows.mask_NC, rows.n)
        self.budget.add_sequences("trained", rows.prompt_ids, rows.mask_NC)
        self.engine.train()

        def loss_of(index: list[int]):
            micro = rows.select(index)
            scores = self.train_policy.score(micro.prompt_ids, micro.completion_ids_NC, router_aux=True)
            return (*self.method.loss(micro, scores, norm), scores.aux_loss)

        return self._accumulate(rows.n, loss_of)

    def collect(self, lap=lambda name: None) -> tuple[Batch, dict[str, float]]:
        """The step's batch: rollout, verification, advantages, then the method's own stages."""
        cfg, tok, ro = self.cfg, self.tok, self.cfg.rollout
        self.teacher_weights.start()         # ema / frozen: the student's weights when RL begins (once)
        # 1. rollout: G attempts per problem, with the sampling distribution's log-probs and routes
        problems = self._my_slice(self.tasks.next_batch(ro.prompts_per_step))
        self.tasks.assert_disjoint(problems)
        group = [p for p in problems for _ in range(ro.attempts_per_prompt)]
        # Each row is an episode with the task's environment (one message for `answer`).
        episodes = Episodes(self.env, tok, group, ro.max_turns, ro.max_new_tokens)
        prompts = episodes.prompts
        self._sync_rollout()
        policy = self._metered(self.policy)
        roll = policy.generate(prompts, self.sampling, episodes)
        transcripts = episodes.transcripts(roll.mask_NC)
        attempts = [t.final_text() for t in transcripts]
        lap("rollout")

        # 2. verify, 3. group-relative advantages
        verdicts = episodes.verdicts()
        dev = roll.completion_ids_NC.device
        batch = Batch(problems=group, prompt_ids=prompts, completion_ids_NC=roll.completion_ids_NC,
                      mask_NC=roll.mask_NC, old_logprobs_NC=roll.logprobs_NC, routes=roll.routes,
                      attempts=attempts, verdicts=verdicts,
                      rewards_N=torch.tensor([v.reward for v in verdicts], device=dev),
                      group_N=torch.arange(len(problems), device=dev).repeat_interleave(ro.attempts_per_prompt),
                      source=["rollout"] * len(group), transcripts=transcripts)
        batch.advantages_N = group_advantages(batch.rewards_N, batch.group_N, cfg.method.adv_std_norm)
        lap("verify")

        # 4. the method's own stages (hints, teacher scores, extra rows)
        ctx = StepContext(policy=policy, teacher_policy=self._metered(self.teacher_weights.policy()),
                          diagnostic=self.policy, teacher=self.teacher, guard=self.guard, tok=tok, tasks=self.tasks,
                          cfg=cfg, sampling=self.sampling, metered=self._metered, lap=lap, env=self.env)
        metrics = self.method.extend(batch, ctx)
        if ro.max_turns > 1:
            metrics.update(episodes.stats())
        return batch, metrics

    def update(self, batch: Batch) -> dict[str, float]:
        """One optimizer update on the batch's trained rows (`Batch.trained`): per gradient-accumulation
        micro-batch, the training forward (what the method needs, the rollout's routes replayed), the
        method's loss terms over the step's one normaliser, backward; the optimizer step after the last."""
        cfg = self.cfg
        batch = batch.trained()
        norm = self._normaliser(cfg.method.loss_norm, batch.mask_NC, batch.n)
        self.budget.add_sequences("trained", batch.prompt_ids, batch.mask_NC)
        replay = cfg.student.router_replay
        self.engine.train()
        gaps = []      # new - old log-prob of each sampled rollout token, before the update

        def loss_of(index: list[int]):
            micro = batch.select(index)
            scores = self.train_policy.score(micro.prompt_ids, micro.completion_ids_NC,
                                             temperature=cfg.rollout.temperature, need=self.method.train_need(micro),
                                             routes=micro.routes if replay else None, router_aux=True)
            rows = [i for i, source in enumerate(micro.source) if source == "rollout"]
            gaps.append((scores.logprobs_NC.detach()[rows] - micro.old_logprobs_NC[rows])[micro.mask_NC[rows]])
            return (*self.method.loss(micro, scores, norm), scores.aux_loss)

        metrics = self._accumulate(batch.n, loss_of)
        metrics.update(engine_agreement(torch.cat(gaps)))
        if replay:
            # How often the training forward would have routed a token differently from rollout.
            metrics["router/replay_mismatch"] = self.train_policy.take_replay_mismatch()
        return metrics

    # ------------------------------------------------------------------ helpers
    def _metered(self, policy):
        return Metered(policy, self.budget, self.tok.pad_id)

    def _my_slice(self, batch: list) -> list:
        """This rank's contiguous share of a global batch (sizes are validated to divide)."""
        share = len(batch) // self.world
        return batch[self.rank * share:(self.rank + 1) * share]

    def _normaliser(self, kind: str, mask_NC: torch.Tensor, rows: int) -> float:
        """The step's loss divisor (rl/losses.py::normaliser), over every rank's rows."""
        total = dist.sum_over_ranks({"tokens": mask_NC.sum().item(), "rows": rows})
        return normaliser(kind, int(total["tokens"]), int(total["rows"]), self.cfg.rollout.max_new_tokens)

    def _accumulate(self, n_rows: int, loss_of) -> dict[str, float]:
        """One optimizer update over this rank's n_rows, in `deepspeed.gradient_accumulation_steps`
        micro-batches of consecutive rows: forward + backward each, the optimizer at the last.

        loss_of(row indices) -> (loss, metrics, router aux loss). The loss is that micro-batch's
        share of the step's objective (sums over the step's one normaliser); DeepSpeed divides each
        backward by GA and averages gradients over ranks, so the backward is scaled by GA x ranks
        and the update is the gradient of the objective however the step is split. The router aux
        loss is a per-forward mean (transformers' definition), averaged over micro-batches.
        Metrics: loss/* are added up (over micro-batches here, over ranks when logged), time/*
        summed, the rest averaged."""
        ga = self.cfg.deepspeed.gradient_accumulation_steps
        scale = ga * self.world
        parts = []
        lr = self.scheduler.get_last_lr()[0]            # the rate this update uses
        for k, index in enumerate(micro_batches(n_rows, ga)):
            start = time.perf_counter()
            loss, metrics, aux = loss_of(index)
            metrics["loss/total"] = loss.item()
            loss = loss * scale
            if aux is not None and self.cfg.student.router_aux_loss_coef > 0:
                loss = loss + self.cfg.student.router_aux_loss_coef * aux
                metrics["router/aux_loss"] = aux.item()
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
            parts.append(metrics)
        self.nonfinite_streak = 0
        keys = set().union(*parts)
        out = {k: sum(p[k] for p in parts if k in p) / sum(k in p for p in parts) for k in keys}
        out.update({k: sum(p[k] for p in parts if k in p) for k in keys if k.startswith(("time/", "loss/"))})
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

    def _expert_load(self, batch: Batch) -> dict[str, float]:
        """Share of routed slots each expert took per layer, over the rollout's real tokens.

        Logged at eval steps as expert_load/layer<L>/expert<E> (notebooks/analyze_run.ipynb).
        """
        _, prompt_mask_NP = left_pad(batch.prompt_ids, self.tok.pad_id, batch.mask_NC.device)
        real_NS = torch.cat([prompt_mask_NP.bool(), batch.mask_NC], dim=1)
        num_experts, out = self.cfg.student.num_experts, {}
        for layer, ids_NSK in enumerate(batch.routes.per_row()):
            ids = ids_NSK[real_NS[:, :ids_NSK.shape[1]]].flatten()
            ids = ids[ids >= 0]                 # free slots (rows a method added) were not routed at rollout
            share = torch.bincount(ids, minlength=num_experts).float() / max(1, ids.numel())
            out.update({f"expert_load/layer{layer}/expert{e}": share[e].item() for e in range(num_experts)})
        return out

    def _rl_stats(self, batch: Batch, group_size: int) -> dict[str, float]:
        rollout = [i for i, src in enumerate(batch.source) if src == "rollout"]
        rewards_BG = batch.rewards_N[rollout].view(-1, group_size)
        stats = {
            "train/reward_mean": rewards_BG.mean().item(),
            "train/groups_without_signal": (rewards_BG.std(dim=1) == 0).float().mean().item(),
            "train/completion_tokens": batch.mask_NC[rollout].sum(1).float().mean().item(),
        }
        written, dropped = self.guard.take_counts()
        hinted = batch.hinted
        if hinted is not None:
            stats["hint/rate"] = len(hinted.rows) / max(1, hinted.requested)
            stats["hint/leak_rate"] = dropped / max(1, written)
            # Failed attempts left without a hint because the teacher failed (counts per step).
            stats["hint/malformed"] = hinted.count("malformed")
            stats["hint/teacher_errors"] = hinted.count("teacher_error")
            if self.cfg.teacher.kind == "openai":   # the backend whose requests fail in named ways
                stats.update(hinted.fault_counts())
        return stats

    def _log_rollouts(self, batch: Batch) -> None:
        group, attempts, verdicts, hinted = batch.problems, batch.attempts, batch.verdicts, batch.hinted
        hint_of = dict(zip(hinted.rows, hinted.hints)) if hinted else {}
        target_of = dict(zip(hinted.rows, hinted.targets)) if hinted else {}
        n = self.cfg.trainer.log_rollouts
        # The first n attempts, plus up to n more whose teacher reply was malformed (to read why).
        malformed = [i for i, e in (hinted.errors.items() if hinted else ()) if e == "malformed" and i >= n]
        # and up to n rows a method added (e.g. corrected attempts), marked with their source
        added = [i for i, source in enumerate(batch.source) if source != "rollout"][:n]
        records = []
        for i in list(range(min(n, len(group)))) + malformed[:n] + added:
            rec = {"prompt": group[i].prompt, "answer": group[i].answer, "attempt": attempts[i],
                   "reward": verdicts[i].reward, "feedback": verdicts[i].feedback, "hint": hint_of.get(i)}
            if batch.source[i] != "rollout":
                rec["source"] = batch.source[i]
            if batch.transcripts is not None and len(batch.transcripts[i].messages) > 2:
                # a multi-message episode: the whole chat, and which message the hint was about
                rec["messages"] = batch.transcripts[i].messages
                if i in target_of:
                    rec["hint_target"] = target_of[i]
            if hinted and i in hinted.replies:        # model teachers: the raw reply, and any failure
                rec.update(teacher_reply=hinted.replies[i], hint_error=hinted.errors.get(i))
            elif hinted and i in hinted.errors:
                rec["hint_error"] = hinted.errors[i]
            records.append(rec)
        # Logged under the step number this update will complete, like its metrics.
        if self.is_main:
            self.log.log_rollouts(self.step + 1, records)
            if self.cfg.trainer.log_problems:
                self.log.log_problems(self.step + 1, self._problem_records(batch, hint_of))

    def _problem_records(self, batch: Batch, hint_of: dict[int, str]) -> list[dict]:
        """Each problem of this rank's step with every attempt, verdict and hint (rl.mine reads them)."""
        rows_of: dict[int, list[int]] = {}
        for i, (group, source) in enumerate(zip(batch.group_N.tolist(), batch.source)):
            if source == "rollout":
                rows_of.setdefault(group, []).append(i)
        records = []
        for rows in rows_of.values():
            problem = batch.problems[rows[0]]
            records.append({"prompt": problem.prompt, "answer": problem.answer, "bucket": problem.bucket,
                            "hash": prompt_hash(problem.prompt), "entry": problem.entry,
                            "rewards": [batch.verdicts[i].reward for i in rows],
                            "attempts": [batch.attempts[i] for i in rows],
                            "feedback": [batch.verdicts[i].feedback for i in rows],
                            "hints": [hint_of.get(i) for i in rows]})
        return records
