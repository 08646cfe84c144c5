"""Hidden tool rules: the multi-message variant of rl/hidden_rule.py, a registered reasoning-gym task
(`task.name: hidden_tool_rule`) for the calculator environment (rl/environments/calculator.py).

The problems are `chain_sum` expressions ("15 - 43 + 7"), solved with one `calc` call per operator
and then the value. Where a rule applies the prompt ends in " ?" and the tool takes a `key` among
2^rule_bits (the conventions of rl/hidden_rule.py, ceil(bits/4) letters):

    calc{"a":15,"op":"-","b":43,"key":"kd"}   ->  tool: -28
    calc{"a":15,"op":"-","b":43,"key":"ab"}   ->  tool: error: refused

A refusal says nothing of the right key, so a reward, and the tool, give the student one bit per
attempt; the hint ("calls here take the key kd") states the rule where the first call breaks it, and
every later problem shares it. The calls after the first may copy the key from it: the first call is
the message the rule is about (the warm-start's hint sits before it, `hint_before`).

Buckets (`rule`), as in rl/hidden_rule.py: `none` (no key: the base skill, where forgetting is
read), `per_problem` (a key drawn per problem, stated in its hint: warm-start's), `hidden` (one key
for every problem, from `rule_seed`: RL's). `hint`: "rule" states the problem's key in the hint and
in the verifier's feedback, "wrong" another key (the control), "none" nothing.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset

from rl.hidden_rule import MARK, check_rule, convention, hidden_convention, wrong_convention


def key_hint(key: str) -> str:
    return f"calls here take the key {key}"


@dataclass
class HiddenToolRuleConfig:
    rule: str = "hidden"             # "hidden" | "per_problem" | "none"
    rule_bits: int = 8               # 2^rule_bits keys; 1..16
    rule_seed: int = 0
    hint: str = "rule"               # "rule" | "wrong" | "none"
    min_terms: int = 3               # chain_sum's knobs
    max_terms: int = 3
    min_digits: int = 1
    max_digits: int = 1
    seed: int | None = None
    size: int = 100_000

    def validate(self) -> None:
        check_rule("hidden_tool_rule", self.rule, self.hint, self.rule_bits)


class HiddenToolRuleDataset(ProceduralDataset):
    def __init__(self, config: HiddenToolRuleConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)
        c = config
        self.chains = reasoning_gym.create_dataset(
            "chain_sum", seed=config.seed, size=config.size, min_terms=c.min_terms, max_terms=c.max_terms,
            min_digits=c.min_digits, max_digits=c.max_digits)

    def __getitem__(self, idx: int) -> dict:
        c = self.config
        item = self.chains[idx]
        meta = {**item["metadata"], "source_dataset": "hidden_tool_rule", "hints": []}
        if c.rule == "none":
            return {"question": meta["expression"], "answer": item["answer"], "metadata": meta}
        rng = random.Random(f"{self.seed}:{idx}")
        index = rng.randrange(2 ** c.rule_bits) if c.rule == "per_problem" else hidden_convention(c.rule_bits, c.rule_seed)
        stated = {"rule": index, "wrong": wrong_convention(index, c.rule_bits), "none": None}[c.hint]
        if stated is not None:
            meta["stated"] = convention(stated, c.rule_bits)
            meta["hints"] = [key_hint(meta["stated"])]
        meta["decoy_hints"] = [key_hint(convention(wrong_convention(index, c.rule_bits), c.rule_bits))]
        meta.update(tool_key=convention(index, c.rule_bits), rule_index=index, hint_before=0,
                    expression=f"{meta['expression']} {MARK}")
        return {"question": meta["expression"], "answer": item["answer"], "metadata": meta}

    def score_answer(self, answer: str | None, entry: dict) -> float:
        return float(isinstance(answer, str) and answer.strip() == entry["answer"])


reasoning_gym.register_dataset("hidden_tool_rule", HiddenToolRuleDataset, HiddenToolRuleConfig)
