"""The teacher gap before RL: how much better the student answers with each kind of hint in context.

    python -m rl.teacher_gap RUN_DIR [key=value ...] [--step N] [--attempts 8] [--out FILE.json]
    python -m rl.teacher_gap EXPERIMENT_DIR [key=value ...]   the student the experiment starts from
                                                              (its student.checkpoint), before any training

A distilling method can move the student at most as far as its hinted distribution is ahead, and
corrected replay learns only from hinted regenerations that succeed, so this gap, measured on the
warm-started student before any RL, predicts what the hint methods can gain (arXiv 2605.30070
reports the gain linear in it). Per difficulty bucket, on the held-out problems, the run's
checkpoint samples G attempts per problem as RL does (`rollout.temperature`); then each failed
attempt is retried once, sampled, with a context of each kind:

    none      no context at all: the same hint-free start as the first attempt, sampled afresh. The
              reference: a second sample alone rescues some attempts (about +0.1 accuracy at p = 0.3),
              so a hint helps only by what it adds over this. Always measured, and first.
    rule      the experiment's teacher (`teacher.kind`) on that attempt: what the hint methods use
    feedback  the verifier's words ("feedback on your answer: incorrect: ..."): self_distill's feedback context
    sibling   "a correct answer: <a successful attempt of the same problem>": self_distill's solution
              context; there is none where all G attempts failed
    shuffled  the rule hint written for another problem (teacher/shuffled.py): the control

Reported per bucket: `plain` accuracy (share of attempts correct), pass@G, the share of problems
whose G attempts all failed, and n (problems); per kind `accuracy` (an attempt counts once correct,
plainly or on its retry), `gap` = accuracy - plain, `gap_interval`, `pass@G`, `rescued_all_fail`
(share of all-fail problems with a correct retry: where GRPO has no signal and a hint method has
some) and `hinted` (share of failed attempts that got a context of that kind; 1 for none); per kind
but none `over_none`, its rescue over the plain retry: the mean over problems of (the problem's
accuracy with this kind's retry - its accuracy with the none retry).

Intervals ({"mean", "low", "high", "n"}) are 95% percentile-bootstrap intervals over problems
(rl/stats.py `bootstrap_interval`: problems resampled, n = problems) of the per-problem differences:
vs plain for `gap_interval`, vs none for `over_none`. The none retry and each hinted retry are
independent samples (not one shared draw), so an interval covers both which problems were drawn and
the retries' sampling noise.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from rl.environments import Environment
from rl.environments.answer import AnswerEnvironment
from rl.episodes import Episodes
from rl.hints import hint_failed_attempts
from rl.methods.self_distill import teacher_context
from rl.stats import bootstrap_interval, fmt_interval
from rl.tasks import Problem, TaskSource
from student.policy import Policy, Sampling
from student.tokenizer import Tokenizer
from teacher import LeakGuard, ShuffledTeacher, Teacher

KINDS = ("none", "rule", "feedback", "sibling", "shuffled")


@torch.no_grad()
def measure(policy: Policy, problems: list[Problem], tasks: TaskSource, teacher: Teacher, tok: Tokenizer,
            sampling: Sampling, attempts: int, kinds=KINDS, env: Environment | None = None,
            max_turns: int = 1, tick=lambda: None) -> dict[str, dict]:
    """With a multi-message `env`, an attempt is an episode; a rule (or shuffled) hint's retry
    continues it from the hint's target message, the other contexts' retries start it again.
    `none` is measured whatever `kinds` names: every other kind's `over_none` is read against it.
    `tick()` is called after each sampling pass (the plain attempts, then each kind's retries)."""
    env = AnswerEnvironment(tasks) if env is None else env
    group = [p for p in problems for _ in range(attempts)]
    plain = Episodes(env, tok, group, max_turns, sampling.max_new_tokens)
    out = policy.generate(plain.prompts, sampling, plain)
    tick()
    transcripts = plain.transcripts(out.mask_NC)
    texts = [t.final_text() for t in transcripts]
    verdicts = plain.verdicts()
    episodes = list(zip(transcripts, out.completion_ids_NC.tolist()))
    ok_PG = torch.tensor([v.reward >= 1.0 for v in verdicts]).view(len(problems), attempts)
    result = {"plain": {"accuracy": ok_PG.float().mean().item(), "pass@G": ok_PG.any(1).float().mean().item(),
                        "all_fail": (~ok_PG.any(1)).float().mean().item(), "n": len(problems)}}
    failed = [i for i, v in enumerate(verdicts) if v.reward < 1.0]
    siblings = [list(range(i - i % attempts, i - i % attempts + attempts)) for i in range(len(group))]
    accuracy_P = {}                       # kind -> per-problem accuracy after its retry, for the intervals
    for kind in ("none", *(k for k in kinds if k != "none")):
        if kind == "none":
            # The start the first attempt had (Episodes' default), so only the second sample differs.
            rows, histories, prompts = failed, None, None
        elif kind in ("rule", "shuffled"):
            hinted = hint_failed_attempts(ShuffledTeacher(teacher) if kind == "shuffled" else teacher, LeakGuard(),
                                          tok, group, texts, verdicts, episodes=episodes)
            rows, prompts = hinted.rows, hinted.prompt_ids
            histories = [transcripts[i].messages[:target] for i, target in zip(rows, hinted.targets)]
        else:
            context = {"feedback": "feedback", "sibling": "solution"}[kind]
            texts_of = {i: teacher_context(i, texts, verdicts, siblings[i], context) for i in failed}
            rows = [i for i in failed if texts_of[i] is not None]
            prompts = [tok.render_prompt(group[i].prompt, texts_of[i]) for i in rows]
            histories = [env.start(group[i]) for i in rows]
        fixed = ok_PG.clone().flatten()
        if rows:
            retry = Episodes(env, tok, [group[i] for i in rows], max_turns, sampling.max_new_tokens, histories, prompts)
            policy.generate(retry.prompts, sampling, retry)
            for i, verdict in zip(rows, retry.verdicts()):
                fixed[i] = verdict.reward >= 1.0
        tick()
        result[kind] = summary(fixed.view_as(ok_PG), ok_PG, len(rows) / max(1, len(failed)))
        accuracy_P[kind] = fixed.view_as(ok_PG).float().mean(1)
        if kind != "none":
            result[kind]["over_none"] = bootstrap_interval((accuracy_P[kind] - accuracy_P["none"]).tolist())
    return result


def summary(fixed_PG: torch.Tensor, ok_PG: torch.Tensor, hinted: float) -> dict:
    """One kind's numbers from its attempts' correctness after the retry (`fixed_PG`) and before it
    (`ok_PG`), both [problems, G] bool; the interval of the gap is over problems."""
    all_fail_P = ~ok_PG.any(1)
    accuracy, plain = fixed_PG.float().mean().item(), ok_PG.float().mean().item()
    return {"accuracy": accuracy, "gap": accuracy - plain,
            "gap_interval": bootstrap_interval((fixed_PG.float().mean(1) - ok_PG.float().mean(1)).tolist()),
            "pass@G": fixed_PG.any(1).float().mean().item(),
            "rescued_all_fail": (fixed_PG.any(1) & all_fail_P).sum().item() / max(1, all_fail_P.sum().item()),
            "hinted": hinted}


def teacher_gap(run_dir: str | Path, step: int | None = None, attempts: int = 8, seed: int = 0,
                kinds=KINDS, overrides: list[str] = ()) -> dict:
    """The gap of the run's checkpoint (newest, or `step`), per bucket: {bucket: {kind: {...}}}.
    `overrides` change the run's config for the measurement, e.g. ["teacher.reveal=all_but_last"]."""
    from rl.assembly import run_parts
    from rl.load_policy import PolicyLoadError, load_policy

    from rl.configure import load_config
    from rl.runlog import is_run_folder

    run_dir = Path(run_dir)
    # On the CPU: sampling draws other numbers on another device, and the committed gaps were drawn here.
    if (run_dir / "config.yaml").is_file() and not is_run_folder(run_dir):     # an experiment folder
        checkpoint = load_config(run_dir, list(overrides)).student.checkpoint
        if not checkpoint:
            raise PolicyLoadError(f"{run_dir}: an experiment whose student starts from scratch (no "
                                  "student.checkpoint) has no student to measure before a run")
        loaded = load_policy(checkpoint, experiment=run_dir, overrides=overrides, device="cpu")
    else:
        loaded = load_policy(run_dir if step is None else run_dir / "checkpoints" / f"step_{step:07d}",
                             overrides=overrides, device="cpu")
    cfg = loaded.cfg
    parts = run_parts(cfg, loaded.tok)
    from tqdm import tqdm

    torch.manual_seed(seed)
    passes = len(parts.tasks.eval_by_bucket) * (1 + len({"none", *kinds}))
    with tqdm(total=passes, desc="teacher gap: sampling passes", file=sys.stderr, disable=None) as bar:
        return {bucket: measure(loaded.policy, problems, parts.tasks, parts.teacher, parts.tok, parts.sampling,
                                attempts, kinds, parts.env, cfg.rollout.max_turns, tick=bar.update)
                for bucket, problems in parts.tasks.eval_by_bucket.items()}


def table(gap: dict) -> str:
    """Markdown: per bucket the plain numbers, none's gap over plain, then each kind's rescue over none."""
    kinds = [k for k in KINDS if k in next(iter(gap.values())) and k != "none"]
    cell = lambda d: fmt_interval(d, show_n=False)
    lines = ["| bucket | n | plain | pass@G | all-fail | none: gap (rescued all-fail) | "
             + " | ".join(f"{k}: over none (rescued all-fail)" for k in kinds) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(kinds)]
    for bucket, r in gap.items():
        p = r["plain"]
        lines.append(f"| {bucket} | {p['n']} | {p['accuracy']:.3f} | {p['pass@G']:.3f} | "
                     f"{p['all_fail']:.3f} | {cell(r['none']['gap_interval'])} ({r['none']['rescued_all_fail']:.2f}) | "
                     + " | ".join(f"{cell(r[k]['over_none'])} ({r[k]['rescued_all_fail']:.2f})" for k in kinds) + " |")
    lines += ["", "n: held-out problems; plain: share of the G sampled attempts correct; none: accuracy gained when "
              "each failed attempt is sampled once more with no context, minus plain; each other kind: accuracy "
              "with its retry minus accuracy with the none retry (what the context adds over another try). "
              "Brackets [ ]: 95% bootstrap interval over problems; ( ): share of all-fail problems that kind's "
              "retry solves."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.teacher_gap", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("overrides", nargs="*", help="config changes for the measurement, e.g. teacher.reveal=all_but_last")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    parser.add_argument("--attempts", type=int, default=8, help="sampled attempts per problem (G)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    from rl.config import ConfigError
    from rl.load_policy import PolicyLoadError
    try:
        gap = teacher_gap(args.run_dir, args.step, args.attempts, args.seed, overrides=args.overrides)
    except (PolicyLoadError, ConfigError) as err:
        print(f"teacher_gap error: {err}", file=sys.stderr)
        return 1
    if args.out:
        Path(args.out).write_text(json.dumps(gap, indent=1) + "\n")
    print(table(gap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
