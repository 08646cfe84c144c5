"""Does the pretrained student read a stated rule at all, and does the wording matter?

    .venv/bin/python experiments/smol-moe/hint_probe.py [--problems 50] [--attempts 4]

The teacher gap (`python -m rl.teacher_gap experiments/smol-moe`) measures the hint as the methods
place it: its own user turn, "Hint: end the answer with :kd". This probe asks the same student the
`stated` bucket's held-out problems (each its own convention) with the same rule placed and worded
otherwise, none of which states the problem's answer:

    none            no hint
    turn            the layout's hint turn (what the methods use)
    same_message    the hint appended to the problem's own user message
    system          the hint as a system message before the problem
    example         the rule shown on another number: "For example, 1234 is answered 1234:kd."
    wrong_example   the example with another convention: the control (it should not help)

and reports, per context, the share of sampled attempts (temperature 1, the rollout's) and of greedy
answers that are correct, and the share of attempts that write the convention at all (":kd" anywhere).
Writes results/hint_probe.json and prints its table (`--table` prints it from the JSON alone).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from rl.assembly import run_parts  # noqa: E402
from rl.configure import load_config  # noqa: E402
from rl.hidden_rule import convention, wrong_convention  # noqa: E402
from rl.load_policy import load_policy  # noqa: E402
from student.policy import Sampling  # noqa: E402

CONTEXTS = ("none", "turn", "same_message", "system", "example", "wrong_example")


def prompt_ids(tok, question: str, rule: str, wrong: str, context: str) -> list[int]:
    hint = f"end the answer with {rule}"
    if context == "none":
        return tok.render_prompt(question)
    if context == "turn":
        return tok.render_prompt(question, hint)
    if context == "same_message":
        return tok.render_messages([{"role": "user", "content": f"{question} Hint: {hint}."}], True)
    if context == "system":
        return tok.render_messages([{"role": "system", "content": f"Hint: {hint}."},
                                    {"role": "user", "content": question}], True)
    shown = rule if context == "example" else wrong
    return tok.render_messages([{"role": "user", "content": f"{question} For example, 1234 is answered 1234{shown}."}],
                               True)


def table(result: dict) -> str:
    lines = [f"| context ({result['problems']} problems) | sampled: correct | sampled: convention written | "
             "greedy: correct | greedy: convention written | a greedy reply |", "|---|---|---|---|---|---|"]
    for context, rows in result["contexts"].items():
        s, g = rows["sampled"], rows["greedy"]
        lines.append(f"| {context} | {s['accuracy']:.3f} | {s['wrote_convention']:.3f} | {g['accuracy']:.3f} | "
                     f"{g['wrote_convention']:.3f} | {g['examples'][0]!r} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=50)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "results" / "hint_probe.json"))
    parser.add_argument("--table", action="store_true", help="print the table of --out and stop")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.out).read_text())))
        return 0
    cfg = load_config(HERE)
    loaded = load_policy(cfg.student.checkpoint, experiment=HERE, device="cpu")
    tok, parts = loaded.tok, run_parts(loaded.cfg, loaded.tok)
    problems = parts.tasks.eval_by_bucket["stated"][:args.problems]
    bits = cfg.task.config["rule_bits"]
    result = {"problems": len(problems), "attempts": args.attempts, "student": Path(cfg.student.checkpoint).name,
              "contexts": {}}
    sampled = Sampling(max_new_tokens=cfg.rollout.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                       temperature=cfg.rollout.temperature)
    greedy = Sampling(max_new_tokens=cfg.rollout.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)
    for context in CONTEXTS:
        prompts, rules = [], []
        for p in problems:
            meta = p.entry["metadata"]
            rule = meta["convention"]
            wrong = ":" + convention(wrong_convention(meta["rule_index"], bits), bits)
            prompts.append(prompt_ids(tok, p.prompt, rule, wrong, context))
            rules.append(rule)
        torch.manual_seed(args.seed)
        rows = {}
        for name, sampling, g in (("sampled", sampled, args.attempts), ("greedy", greedy, 1)):
            with torch.no_grad():
                out = loaded.policy.generate([q for q in prompts for _ in range(g)], sampling)
            texts = [tok.decode(r) for r in out.completion_ids_NC.tolist()]
            owners = [i for i in range(len(problems)) for _ in range(g)]
            correct = [parts.tasks.verify(problems[i], t).reward >= 1.0 for i, t in zip(owners, texts)]
            wrote = [rules[i] in t for i, t in zip(owners, texts)]
            rows[name] = {"accuracy": sum(correct) / len(correct), "wrote_convention": sum(wrote) / len(wrote)}
            if name == "greedy":
                rows["greedy"]["examples"] = texts[:3]
        result["contexts"][context] = rows
        print(f"{context:>14}: sampled {rows['sampled']['accuracy']:.3f} (convention written "
              f"{rows['sampled']['wrote_convention']:.3f}), greedy {rows['greedy']['accuracy']:.3f} "
              f"(written {rows['greedy']['wrote_convention']:.3f}); e.g. {rows['greedy']['examples'][0]!r}",
              flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
