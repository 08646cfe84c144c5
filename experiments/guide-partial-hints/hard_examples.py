"""How many hard-bucket problems the student of this study saw, per seed: as warm-start
demonstrations, and as RL problems (times the attempts per problem: the hard attempts that
`guide` could regenerate under a hint).

Which bucket each position of the task stream draws from, and which prompts are skipped because
they are held out, are functions of the seed alone (`rl/tasks.py`), so replaying the stream counts
exactly what the trainer drew (no model is run): `warmstart.steps` batches of
`warmstart.batch_size` by `warmstart.mix`, then `trainer.steps` batches of
`rollout.prompts_per_step` by `task.mix`. Usage (under a minute):

    .venv/bin/python experiments/guide-partial-hints/hard_examples.py > experiments/guide-partial-hints/results/hard-examples.md
"""
import collections
import sys
from pathlib import Path

from rl.configure import load_config
from rl.tasks import TaskSource

HERE = Path(__file__).resolve().parent


def main(seeds: list[int]) -> None:
    print("# Hard-bucket problems seen by the student of guide-partial-hints\n")
    print("    .venv/bin/python experiments/guide-partial-hints/hard_examples.py\n")
    print("| seed | warm-start demonstrations: easy / hard | RL problems: easy / hard | RL hard attempts (x attempts per problem) |")
    print("|---|---|---|---|")
    for seed in seeds:
        cfg = load_config(HERE, [f"seed={seed}"])
        tasks = TaskSource(cfg.task, cfg.seed, cfg.eval)
        warm, rl = collections.Counter(), collections.Counter()
        for _ in range(cfg.warmstart.steps):
            warm.update(p.bucket for p in tasks.next_batch(cfg.warmstart.batch_size, dict(cfg.warmstart.mix) or None))
        for _ in range(cfg.trainer.steps):
            rl.update(p.bucket for p in tasks.next_batch(cfg.rollout.prompts_per_step))
        attempts = rl["hard"] * cfg.rollout.attempts_per_prompt
        print(f"| {seed} | {warm['easy']:,} / {warm['hard']:,} | {rl['easy']:,} / {rl['hard']:,} | {attempts:,} |")


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or [0, 1, 2])
