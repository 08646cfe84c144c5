"""The oracle method (rl/methods/oracle.py): supervised steps on the RL problems' references, no rollouts."""
import json

import pytest
import torch

from conftest import TINY, run_cli


def _trainer(tmp_path, *extra):
    from rl.configure import load_config
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path}", "run_name=oracle", "warmstart.steps=0",
                                                     "method.name=oracle", *extra])
    return Trainer(cfg, resolve_run_dir(cfg))


def _mean_logp(trainer, rows) -> float:
    """Mean log p of the reference tokens under the student, per target token."""
    with torch.no_grad():
        scores = trainer.policy.score(rows.prompt_ids, rows.completion_ids_NC)
    return (scores.logprobs_NC[rows.mask_NC].sum() / rows.mask_NC.sum()).item()


def test_references_are_the_warmstart_demonstrations_g_times(tmp_path):
    from rl.warmstart import split_demonstration

    t = _trainer(tmp_path)
    problems = t.tasks.next_batch(3)
    rows = t.method.references([p for p in problems for _ in range(4)], t.tok, t.env)
    assert rows.n == 12 and rows.mask_NC.shape == rows.completion_ids_NC.shape
    for k, p in enumerate(problems):
        prompt, answer, mask = split_demonstration(t.tok, t.env.demonstration(p))
        for row in range(4 * k, 4 * k + 4):
            assert rows.prompt_ids[row] == prompt
            assert rows.completion_ids_NC[row, :len(answer)].tolist() == answer
            assert rows.mask_NC[row].tolist() == mask + [False] * (rows.mask_NC.size(1) - len(mask))
    assert t.tok.decode(rows.completion_ids_NC[0][rows.mask_NC[0]].tolist()).startswith(problems[0].answer)
    part = rows.select([1, 5])
    assert part.prompt_ids == [rows.prompt_ids[1], rows.prompt_ids[5]]
    assert torch.equal(part.completion_ids_NC, rows.completion_ids_NC[[1, 5]])


def test_oracle_steps_raise_the_log_probability_of_references_without_generating(tmp_path):
    t = _trainer(tmp_path, "trainer.lr=3e-3", "trainer.warmup_steps=0")
    from rl.tasks import TaskSource

    # Problems the steps do not train on (another seed's stream): the answer format and <eos> carry over.
    probe = TaskSource(t.cfg.task, seed=1234).next_batch(16)
    rows = t.method.references(probe, t.tok, t.env)
    before = _mean_logp(t, rows)
    generated = []
    for _ in range(4):
        metrics = t.rl_step()
        assert metrics["loss/sft"] > 0 and "train/reward_mean" not in metrics   # no rollout, no reward
        counts = t.budget.close_step()
        generated.append(counts["budget/generated_tokens"] + counts["budget/scored_tokens"])
        # G rows per problem, as a GRPO step: prompt and answer tokens of 4 problems x 4 copies
        assert counts["budget/trained_tokens"] > 16 * 2
    t.rollout.sync()
    after = _mean_logp(t, rows)
    assert generated == [0, 0, 0, 0]
    assert after > before + 0.25, (before, after)     # measured: -5.53 -> -4.99 nats per token


@pytest.mark.slow
def test_oracle_run_logs_like_every_run(tmp_path, tiny_overrides):
    out = run_cli(["experiments/default", *tiny_overrides, "method.name=oracle", "run_name=o"])
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs" / "default" / "o" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == list(range(8))
    warm = rows[3]["budget/generated_tokens_total"]
    assert rows[-1]["budget/generated_tokens_total"] == warm == 0                 # nothing generated, ever
    assert all(r["budget/trained_tokens"] > 0 and "loss/sft" in r for r in rows[4:])
    assert "eval/accuracy" in rows[-1]                                            # evaluated like every arm
