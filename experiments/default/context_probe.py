"""How well the warm-started student answers with each kind of teacher context in its hint slot:
is the self-teacher of self_distill (the student shown a successful answer) a better policy?

    .venv/bin/python experiments/default/context_probe.py runs/compare/default/warmstart-s0

Exports the run's newest checkpoint (rl.export) to a temporary folder and answers the 200
held-out problems greedily, once per context. Prints one line per context: held-out accuracy.
"""
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

from rl.configure import load_config
from rl.export import export
from rl.tasks import TaskSource
from student import ByteTokenizer
from student.build import build_policy
from student.policy import Sampling
from teacher.rule import targeted_hint


def main(run_dir: str) -> None:
    cfg = load_config(run_dir)
    tok, tasks = ByteTokenizer(), TaskSource(cfg.task, cfg.seed)
    with tempfile.TemporaryDirectory() as folder:
        model = AutoModelForCausalLM.from_pretrained(export(run_dir, folder), dtype=torch.float32)
    policy = build_policy(model, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
    greedy = Sampling(max_new_tokens=cfg.rollout.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)
    problems = tasks.eval_problems

    def accuracy(contexts):
        out = policy.generate([tok.render_prompt(p.prompt, c) for p, c in zip(problems, contexts)], greedy)
        return sum(tasks.verify(p, tok.decode(r.tolist())).reward >= 1.0
                   for p, r in zip(problems, out.completion_ids_NC)) / len(problems)

    contexts = {
        "no context": [None] * len(problems),
        "self_distill solution: 'a correct answer: <answer>'": [f"a correct answer: {p.answer}" for p in problems],
        "self_distill feedback: 'feedback on your answer: incorrect: ...'":
            ["feedback on your answer: incorrect: '1' does not match the expected answer"] * len(problems),
        "rule teacher's hint for the attempt '1' (warm-start's format)": [targeted_hint("1", p.answer) for p in problems],
    }
    for name, ctx in contexts.items():
        print(f"{accuracy(ctx):.3f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
