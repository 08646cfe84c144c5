"""The RL step as a pipeline: one normaliser for the whole step, so the update does not depend on
how the step is split into gradient-accumulation micro-batches."""
import copy

import pytest
import torch

from conftest import TINY


def _trainer(tmp_path, ga, *extra):
    from rl.configure import load_config
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    cfg = load_config("experiments/default", TINY + [
        f"output_dir={tmp_path}", f"run_name=ga{ga}", f"deepspeed.gradient_accumulation_steps={ga}",
        "warmstart.steps=0", "student.router_aux_loss_coef=0", *extra])
    return Trainer(cfg, resolve_run_dir(cfg))


@pytest.mark.parametrize("extra", [
    ["method.name=hint_distill"],                                       # full-vocabulary distillation
    ["method.name=hint_distill", "method.distill_estimator=sampled", "method.loss_norm=constant"],
    ["method.name=grpo", "method.adv_std_norm=true"],
    ["method.name=corrected_replay", "method.when=failed"],                 # corrections in their attempts' places
    ["method.name=corrected_replay", "method.when=failed", "method.place=join"],   # corrections as extra rows
    ["method.name=self_distill", "method.context=feedback", "method.teacher_weights=frozen"],   # top-k JSD
])
def test_one_update_whatever_the_gradient_accumulation(tmp_path, extra):
    one, four = _trainer(tmp_path, 1, *extra), _trainer(tmp_path, 4, *extra)
    before = [p.detach().clone() for p in one.model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, four.model.parameters()))
    batch, _ = one.collect()
    # A fresh student solves nothing (all advantages 0): random advantages exercise the policy gradient.
    gen = torch.Generator().manual_seed(0)
    batch.advantages_N = torch.randn(batch.n, generator=gen)
    # and rows of different lengths (as if they had ended early), so micro-batches differ in tokens
    lengths = torch.randint(1, batch.mask_NC.size(1) + 1, (batch.n,), generator=gen)
    batch.mask_NC &= torch.arange(batch.mask_NC.size(1))[None] < lengths[:, None]
    hinted = batch.targets.get("hinted")
    if "hint_distill" in extra[0]:
        # rows of varying hinted-ness per micro-batch, so a per-micro-batch mean would differ
        assert hinted is not None and 0 < len(hinted.rows)
    m1, m4 = one.update(copy.deepcopy(batch)), four.update(batch)
    assert four.engine.global_steps == one.engine.global_steps == 1
    moved = max((a - b).abs().max().item() for a, b in zip(one.model.parameters(), before))
    assert moved > 1e-6, "the update did nothing: the test would pass vacuously"
    for (name, a), b in zip(one.model.named_parameters(), four.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5, msg=name)
    # the logged loss terms are the step's objective, the same however it was split
    for key in [k for k in m1 if k.startswith("loss/")]:
        assert m1[key] == pytest.approx(m4[key], rel=1e-4, abs=1e-7), key


def test_a_per_micro_batch_mean_would_have_differed():
    """The property above is not automatic: normalising each micro-batch by its own token count
    gives one and four micro-batches different gradients."""
    from rl.batch import micro_batches
    from rl.losses import policy_gradient_loss

    gen = torch.Generator().manual_seed(0)
    n, c = 16, 4
    adv = torch.randn(n, generator=gen)
    mask = torch.arange(c)[None] < torch.randint(1, c + 1, (n,), generator=gen)[:, None]
    logp = torch.zeros(n, c, requires_grad=True)

    def grad(parts, norm_of):
        logp.grad = None
        for index in parts:
            sub = torch.tensor(index)
            loss, _ = policy_gradient_loss(logp[sub], torch.zeros(len(index), c), adv[sub], mask[sub], norm_of(sub))
            loss.backward()
        return logp.grad.clone()

    own = lambda sub: mask[sub].sum().item() * 4 / 4           # noqa: E731  each micro-batch its own count
    total = lambda sub: mask.sum().item()                      # noqa: E731  the step's count
    whole = grad(micro_batches(n, 1), total)
    assert torch.allclose(whole, grad(micro_batches(n, 4), total))
    per_micro = grad(micro_batches(n, 4), own) / 4             # DeepSpeed's 1/GA on each micro-batch
    assert not torch.allclose(whole, per_micro)


# -- one rank and two ranks: the same update on the same global batch ----------------------------
def _fixed_batch(trainer):
    """A global batch every rank builds identically: the first RL problems, sampled from one seed,
    random advantages (a fresh student solves nothing), the method's stages on top."""
    from rl.batch import Batch
    from rl.methods import StepContext

    cfg, tok, ro = trainer.cfg, trainer.tok, trainer.cfg.rollout
    problems = trainer.tasks.next_batch(ro.prompts_per_step)
    group = [p for p in problems for _ in range(ro.attempts_per_prompt)]
    prompts = [tok.render_prompt(p.prompt) for p in group]
    torch.manual_seed(0)
    roll = trainer.policy.generate(prompts, trainer.sampling)
    attempts = [tok.decode(r.tolist()) for r in roll.completion_ids_NC]
    verdicts = [trainer.tasks.verify(p, a) for p, a in zip(group, attempts)]
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, roll.mask_NC.size(1) + 1, (len(group),), generator=gen)
    batch = Batch(problems=group, prompt_ids=prompts, completion_ids_NC=roll.completion_ids_NC,
                  mask_NC=roll.mask_NC & (torch.arange(roll.mask_NC.size(1))[None] < lengths[:, None]),
                  old_logprobs_NC=roll.logprobs_NC, routes=roll.routes, attempts=attempts, verdicts=verdicts,
                  rewards_N=torch.zeros(len(group)), group_N=torch.arange(len(problems)).repeat_interleave(
                      ro.attempts_per_prompt), source=["rollout"] * len(group),
                  advantages_N=torch.randn(len(group), generator=gen))
    ctx = StepContext(policy=trainer.policy, teacher_policy=trainer.policy, diagnostic=trainer.policy,
                      teacher=trainer.teacher, guard=trainer.guard, tok=tok, tasks=trainer.tasks, cfg=cfg,
                      sampling=trainer.sampling, metered=lambda policy: policy, lap=lambda name: None)
    trainer.method.extend(batch, ctx)
    return batch


def _update_and_save(out_dir: str, ranks: int) -> None:
    """Runs in every rank: one update on this rank's half of the fixed batch; rank 0 saves the weights."""
    from pathlib import Path

    from rl import distributed as dist

    trainer = _trainer(Path(out_dir) / f"r{ranks}", 1, "method.name=hint_distill",
                       f"launcher.nproc_per_node={ranks}")
    batch = _fixed_batch(trainer)
    share = batch.n // trainer.world
    metrics = trainer.update(batch.select(list(range(trainer.rank * share, (trainer.rank + 1) * share))))
    loss = dist.sum_over_ranks({"loss": metrics["loss/total"]})["loss"]      # each rank's share of the objective
    if trainer.rank == 0:
        torch.save({"params": [p.detach() for p in trainer.model.parameters()], "loss": loss},
                   Path(out_dir) / f"ranks{ranks}.pt")


@pytest.mark.slow
def test_one_and_two_ranks_give_the_same_update(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from rl.distributed import free_port

    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    for ranks in (1, 2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_port", str(free_port()), __file__, str(tmp_path), str(ranks)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    one, two = torch.load(tmp_path / "ranks1.pt"), torch.load(tmp_path / "ranks2.pt")
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-5)
    for a, b in zip(one["params"], two["params"]):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)


if __name__ == "__main__":
    import sys
    _update_and_save(sys.argv[1], int(sys.argv[2]))
