"""The `reference_logprob` suite (rl/evals/reference_logprob.py) on a tiny MoE student: its log-prob
is policy.score's on the rendered reference, it rises when the student is trained on the
references, pass@k is consistent with the sampled accuracy and with greedy at a cold temperature,
sampling is reproducible and leaves the caller's RNG alone, and sharded counts add up."""
import json
import math

import pytest
import torch

from rl.config import EvalConfig, TaskConfig
from rl.environments import build_environment
from rl.evals import EvalContext, run_suites
from rl.losses import sft_loss
from rl.tasks import TaskSource
from rl.warmstart import right_pad
from student import ByteTokenizer, StudentConfig, build_student
from student.lean_policy import LeanPolicy
from student.tokenizer import assistant_text
from teacher import TeacherConfig, build_teacher

TOK = ByteTokenizer()
SPACE = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}
SUITE = ["reference_logprob"]


def tiny(seed=0):
    torch.manual_seed(seed)
    model = build_student(StudentConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, num_experts=4,
                                        expert_width=16), TOK)
    return model, LeanPolicy(model, pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)


def context(policy, tasks, pass_k=0, temperature=1.0, environment="answer", max_turns=1, max_new_tokens=4):
    return EvalContext(policy=policy, tasks=tasks, teacher=build_teacher(TeacherConfig()), tok=TOK,
                       env=build_environment(environment, tasks), max_new_tokens=max_new_tokens, max_turns=max_turns,
                       temperature=temperature, pass_k=pass_k, seed=0)


def metrics(ctx, names=SUITE):
    return {k: v for r in run_suites(names, ctx).values() for k, v in r["metrics"].items()}


def sft(model, policy, problems, steps, lr=1e-2):
    """Supervised steps on the problems' references, as warm-start trains (rl/warmstart.py)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    prompts = [TOK.render_prompt(p.prompt) for p in problems]
    ids_NC, mask_NC = right_pad([TOK.render_answer(p.answer) for p in problems], TOK.pad_id)
    for _ in range(steps):
        loss, _ = sft_loss(policy.score(prompts, ids_NC).logprobs_NC, mask_NC, int(mask_NC.sum()))
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_reference_logprob_is_the_scored_reference_answer():
    """Two problems, each scored alone by hand: log p(answer + <eos> | rendered prompt), summed over
    the answer's tokens; the suite reports their mean and the token-weighted mean. With pass_k=0 the
    sampled metrics are absent."""
    tasks = TaskSource(TaskConfig(config=SPACE, render="expression", eval_size=2), seed=0)
    _, policy = tiny()
    with torch.no_grad():
        by_hand = [policy.score([TOK.render_prompt(p.prompt)], torch.tensor([TOK.render_answer(p.answer)]))
                   .logprobs_NC[0] for p in tasks.eval_problems]
    got = metrics(context(policy, tasks))
    assert set(got) == {"eval/reference_logprob", "eval/reference_logprob_per_token"}
    assert got["eval/reference_logprob"] == pytest.approx(sum(s.sum().item() for s in by_hand) / 2, rel=1e-5)
    assert got["eval/reference_logprob_per_token"] == pytest.approx(
        sum(s.sum().item() for s in by_hand) / sum(len(s) for s in by_hand), rel=1e-5)
    # an untrained student: about log(1/257) per token (257 allowed tokens), not NaN from the padding
    assert -7.5 < got["eval/reference_logprob_per_token"] < -4.0


def test_reference_logprob_rises_when_trained_on_the_references():
    tasks = TaskSource(TaskConfig(config=SPACE, render="expression", eval_size=16), seed=0)
    model, policy = tiny()
    before = metrics(context(policy, tasks))["eval/reference_logprob"]
    sft(model, policy, tasks.eval_problems, steps=10)
    after = metrics(context(policy, tasks))["eval/reference_logprob"]
    # ~2.6 tokens a reference: from ~-14.6 nats (log 1/257 a token) to about -5.6
    assert after > before + 6, (before, after)


def test_pass_at_k_against_sampled_and_greedy_accuracy():
    """A student trained part way (some answers right, some not): pass@k >= sampled accuracy; at a
    cold temperature every sample is the greedy answer, so both equal heldout's greedy accuracy
    (the same verifier path). Sampling is reproducible and leaves the caller's RNG where it was."""
    tasks = TaskSource(TaskConfig(config=SPACE, render="expression", eval_size=16), seed=0)
    model, policy = tiny()
    sft(model, policy, tasks.eval_problems, steps=40)     # greedy gets 6 of 16 right
    torch.manual_seed(123)
    state = torch.get_rng_state()
    warm = metrics(context(policy, tasks, pass_k=4))
    assert torch.equal(torch.get_rng_state(), state), "the evaluation moved the caller's RNG"
    assert warm == metrics(context(policy, tasks, pass_k=4)), "the same evaluation twice differs"
    assert 0 < warm["eval/sampled_accuracy"] < 1, warm
    assert warm["eval/pass@k"] >= warm["eval/sampled_accuracy"]
    cold = metrics(context(policy, tasks, pass_k=3, temperature=1e-4), ["heldout", *SUITE])
    assert 0 < cold["eval/accuracy"] < 1, cold
    assert cold["eval/pass@k"] == cold["eval/sampled_accuracy"] == cold["eval/accuracy"]
    assert "eval/pass@k" not in metrics(context(policy, tasks, pass_k=0))


def test_two_shards_add_up_to_one(tmp_path):
    """run_suites with world=2, each rank's counts summed (what sum_over_ranks does): the counts of
    world=1, on two buckets (an odd one, so one shard is longer) and a private set; the metric names
    per bucket and per private set."""
    private = tmp_path / "mine.jsonl"
    private.write_text("".join(json.dumps({"prompt": f"{a} + {a + 1}", "answer": str(2 * a + 1)}) + "\n"
                               for a in range(5)))
    cfg = TaskConfig(config=SPACE, render="expression", eval_size=7,
                     buckets={"one": {}, "two": {"min_digits": 2, "max_digits": 2}})
    tasks = TaskSource(cfg, seed=0, eval_cfg=EvalConfig(private={"mine": str(private)}))
    _, policy = tiny()
    ctx = context(policy, tasks, pass_k=3)
    whole = run_suites(SUITE, ctx)["reference_logprob"]
    shards = [run_suites(SUITE, ctx, rank, 2)["reference_logprob"]["counts"] for rank in (0, 1)]
    assert set(whole["counts"]) == {"one", "two", "private/mine"}
    for name, counts in whole["counts"].items():
        summed = {k: shards[0][name][k] + shards[1][name][k] for k in counts}
        assert summed["n"] == counts["n"] == (5 if name == "private/mine" else 7)
        assert {k: summed[k] for k in ("n", "tokens", "attempts", "correct", "passed")} == \
            {k: counts[k] for k in ("n", "tokens", "attempts", "correct", "passed")}, name
        assert summed["logprob"] == pytest.approx(counts["logprob"], rel=1e-5)
    names = set(whole["metrics"])
    for metric in ("reference_logprob", "reference_logprob_per_token", "pass@k", "sampled_accuracy"):
        assert {f"eval/{metric}", f"eval/{metric}/one", f"eval/{metric}/two", f"eval/private/mine/{metric}"} <= names
    assert all(math.isfinite(v) for v in whole["metrics"].values())


def test_multi_message_episodes_score_the_reference_episode():
    """Calculator episodes: the reference is the environment's canonical episode, its assistant
    messages scored (each message's text and <eos>), the tool replies context; pass@k runs the
    episodes through the environment."""
    tasks = TaskSource(TaskConfig(name="chain_sum", render="expression", eval_size=3, environment="calculator",
                                  config={"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2}), seed=0)
    _, policy = tiny()
    ctx = context(policy, tasks, pass_k=2, environment="calculator", max_turns=4, max_new_tokens=24)
    result = run_suites(SUITE, ctx)["reference_logprob"]
    env = ctx.env
    said = [m for p in tasks.eval_problems for m in env.demonstration(p) if m["role"] == "assistant"]
    assert len(said) == 9       # two calls and the answer each
    assert result["counts"]["all"]["tokens"] == sum(len(TOK.render_answer(assistant_text(m))) for m in said)
    assert all(math.isfinite(v) for v in result["metrics"].values())
    assert {"eval/pass@k", "eval/sampled_accuracy"} <= set(result["metrics"])


def test_a_run_and_rl_eval_report_the_same_numbers(tmp_path):
    """The trainer's periodic evaluation and `python -m rl.eval` fill the context alike (rollout
    temperature, eval.pass_k, the run's seed): on the same weights, the same pass@k. A negative
    eval.pass_k is a config error naming the key."""
    from conftest import TINY
    from rl.config import ConfigError
    from rl.configure import load_config
    from rl.eval import evaluate_model
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    with pytest.raises(ConfigError, match="eval.pass_k"):
        load_config("experiments/default", TINY + ["eval.pass_k=-1"])
    cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path}", "run_name=r", "warmstart.steps=2",
                                                     "trainer.steps=0", "eval.pass_k=2"])
    assert cfg.eval.suites == ["hinted", "reference_logprob"]
    run_dir = resolve_run_dir(cfg)
    final = Trainer(cfg, run_dir).train()
    report = evaluate_model(run_dir, ["reference_logprob"])["suites"]["reference_logprob"]["metrics"]
    assert {"eval/reference_logprob", "eval/pass@k", "eval/sampled_accuracy"} <= set(report)
    for key, value in report.items():
        assert value == pytest.approx(final[key], rel=1e-6), key
