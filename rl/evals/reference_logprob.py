"""`reference_logprob`: continuous eval signals beside greedy accuracy, which on 200 problems moves
in steps of half a point.

    eval/reference_logprob[/<bucket>]            mean over problems of log pi(reference | prompt),
                                                 summed over the reference's tokens, <eos> included
    eval/reference_logprob_per_token[/<bucket>]  the same log-probs summed over all problems, divided
                                                 by all their reference tokens (token-weighted)
    eval/pass@k[/<bucket>]                       share of problems with >= 1 correct of k sampled episodes
    eval/sampled_accuracy[/<bucket>]             share of all k x problems sampled episodes that are correct
    eval/private/<name>/{reference_logprob, reference_logprob_per_token, pass@k, sampled_accuracy}

over each bucket's held-out set (per bucket when there are several, as `heldout` names them) and
each private set of `eval.private`. k is `eval.pass_k` (default 8; the metric name keeps the
literal `pass@k`); 0 leaves the two sampled metrics out.

The reference is the problem's demonstration exactly as warm-start renders it (rl/warmstart.py:
`env.demonstration` through `split_demonstration`): for the one-message `answer` environment,
`tok.render_answer(problem.answer)` (the answer and <eos>) after the rendered prompt. In a
multi-message environment (calculator, chain) one answer is not one completion, and its final
message alone would be scored after a context the student did not write; the reference there is the
environment's whole canonical episode, teacher-forced: the log-prob of every assistant message's
tokens, the environment's replies between them being context (what warm-start trains on). That is
one correct episode of several the verifier accepts (so is a reference answer: " 42" is correct
too), so it is a lower bound on log pi(correct), comparable across evaluations of one run.
Scored at temperature 1 (the model's own distribution, banned ids removed), in batches of `ROWS`.

pass@k samples at the run's `rollout.temperature` (`EvalContext.temperature`) and verifies each
episode as `heldout` does (rl/episodes.py: the environment's verdict, correct at reward >= 1).
Each problem's k episodes are one generation seeded from (`EvalContext.seed`, the prompt's hash),
inside `torch.random.fork_rng`: an evaluation is reproducible, the same problem meets the same noise
at every evaluation of a run (so changes between evaluations are the model's), the counts do not
depend on how problems are sharded over ranks (tests/test_eval_reference_logprob.py), and the training
RNG stream is left as it was (a resumed run stays bit-identical). Batching problems would tie each
row's draws to the batch it sits in (student/policy.py draws one uniform per row and step).

Cost, experiments/default (200 problems, max_new_tokens 6, k=8), trainer.threads=1 on a shared
2-core CPU, one evaluation, untrained student / after 300 warm-start steps:
    eval.suites [hinted]                                 0.25 s / 0.17 s
    [hinted, reference_logprob], eval.pass_k=8           3.2 s  / 2.0 s
    [hinted, reference_logprob], eval.pass_k=0           0.27 s / 0.23 s   (the scoring pass: 0.07 s)
The 200 one-problem generations are the cost; all 1600 rows in one generation took ~0.3 s instead,
at the price of the per-problem seeding above. eval.pass_k=0 keeps the log-prob signal nearly free.
"""
from __future__ import annotations

import hashlib

import torch

from rl.contamination import prompt_hash
from rl.episodes import Episodes
from rl.evals.base import EvalContext, Suite
from rl.tasks import Problem
from rl.warmstart import right_pad, split_demonstration
from student.policy import Sampling

ROWS = 64               # reference rows per scoring forward: bounds its activations
PRIVATE = "private/"    # set names of private sets; held-out sets are named by their bucket


def reference_logprobs(ctx: EvalContext, problems: list[Problem]) -> tuple[list[float], list[int]]:
    """Per problem: (log pi of its reference's scored tokens, summed; how many tokens that is)."""
    logps, tokens = [], []
    for start in range(0, len(problems), ROWS):
        parts = [split_demonstration(ctx.tok, ctx.env.demonstration(p)) for p in problems[start:start + ROWS]]
        ids_NC, mask_NC = right_pad([c for _, c, _ in parts], ctx.tok.pad_id, ctx.policy.device,
                                    [m for _, _, m in parts])
        logp_NC = ctx.policy.score([p for p, _, _ in parts], ids_NC).logprobs_NC
        # a select, not a product: padding and the environment's <assistant> markers are banned
        # ids, log p = -inf, and -inf * 0 is NaN
        logps += torch.where(mask_NC, logp_NC, torch.zeros_like(logp_NC)).sum(-1).tolist()
        tokens += mask_NC.sum(-1).tolist()
    return logps, tokens


def problem_seed(seed: int, problem: Problem) -> int:
    """The seed of a problem's samples: a function of the run's seed and the prompt only (63 bits)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{prompt_hash(problem.prompt)}".encode()).digest()[:8], "big") >> 1


def sampled_correct(ctx: EvalContext, problems: list[Problem]) -> list[int]:
    """Per problem: how many of its `ctx.pass_k` sampled episodes the environment verifies correct.
    The caller's torch RNG state is restored afterwards."""
    sampling = Sampling(max_new_tokens=ctx.max_new_tokens, eos_id=ctx.tok.eos_id, pad_id=ctx.tok.pad_id,
                        temperature=ctx.temperature)
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    out = []
    with torch.random.fork_rng(devices=cuda):
        for problem in problems:
            episodes = Episodes(ctx.env, ctx.tok, [problem] * ctx.pass_k, ctx.max_turns, ctx.max_new_tokens)
            torch.manual_seed(problem_seed(ctx.seed, problem))
            ctx.policy.generate(episodes.prompts, sampling, episodes)
            out.append(sum(v.reward >= 1.0 for v in episodes.verdicts()))
    return out


def rates(c: dict[str, float], prefix: str, suffix: str = "") -> dict[str, float]:
    n = max(1, c["n"])
    out = {f"{prefix}/reference_logprob{suffix}": c["logprob"] / n,
           f"{prefix}/reference_logprob_per_token{suffix}": c["logprob"] / max(1, c["tokens"])}
    if "attempts" in c:
        out.update({f"{prefix}/pass@k{suffix}": c["passed"] / n,
                    f"{prefix}/sampled_accuracy{suffix}": c["correct"] / max(1, c["attempts"])})
    return out


class ReferenceLogprob(Suite):
    name = "reference_logprob"
    summary = "log-prob of the reference answers, pass@k and sampled accuracy (eval.pass_k samples)"

    def sets(self, tasks):
        return {**tasks.eval_by_bucket, **{PRIVATE + name: problems for name, problems in tasks.private.items()}}

    @torch.no_grad()
    def counts(self, ctx: EvalContext, problems):
        logps, tokens = reference_logprobs(ctx, problems)
        out = {"n": len(problems), "logprob": sum(logps), "tokens": sum(tokens)}
        if ctx.pass_k > 0:
            correct = sampled_correct(ctx, problems)
            out.update(attempts=ctx.pass_k * len(problems), correct=sum(correct), passed=sum(c > 0 for c in correct))
        return out

    def report(self, per_set):
        held = {s: c for s, c in per_set.items() if not s.startswith(PRIVATE)}
        metrics = rates({k: sum(c[k] for c in held.values()) for k in next(iter(held.values()))}, "eval")
        if len(held) > 1:
            for bucket, c in held.items():
                metrics.update(rates(c, "eval", f"/{bucket}"))
        for s, c in per_set.items():
            if s.startswith(PRIVATE):
                metrics.update(rates(c, f"eval/{s}"))
        return metrics
