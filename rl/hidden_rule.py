"""Hidden rules: problems the student can solve whose accepted answer follows a convention it cannot
see, a reasoning-gym task (`task.name: hidden_rule`) so buckets, held-out sets and mixes work as for
any other (rl/tasks.py).

Where textual feedback must beat scalar reward: a failed attempt's reward says one bit, "wrong",
while one sentence ("end the answer with :kd") states the rule every later problem shares (Xu et al.
arXiv 2506.10341). The rule's information is the knob: `rule_bits` = b gives 2^b conventions, a
suffix of ceil(b/4) letters after a colon ("47:kd" for 12 + 35 under the rule "kd"), the first
letter from 2^(b - 4(L-1)) of "a".."p", the others from all 16. A student that writes a convention
uniformly at random, as warm-start teaches (below), guesses the hidden one with probability 2^-b.

The skill is `operators`: "+" and "-" over operands in [min_operand, max_operand], or "copy" (the
number itself: "4821" -> "4821"), which experiments/hidden-rule uses because its 1M student writes
a number back almost perfectly after a few hundred steps and two-digit sums only 5.6% of the time.
Three kinds of bucket (`rule`):

    none         the base skill: "12 + 35" -> "47"; no convention (forgetting is measured here)
    per_problem  "12 + 35 ?" -> "47:" + a convention drawn per problem, stated in its hint: warm-start's
                 buckets. Demonstrated with the hint (`warmstart.hint_fraction_by_bucket`), it teaches
                 reading a stated rule; without, a uniform guess among the conventions
    hidden       "12 + 35 ?" -> "47:" + one convention for every problem (drawn from `rule_seed`, so a
                 study's seeds may share it or not): the RL bucket, never demonstrated as a rule

The rule's form (`rule_form`): "suffix", above, a string the student appends; or "operator", an
operation it must compute on every problem once told: the key, one of 2^b numbers written with the
operand's digits ("0172" for b = 8 and four-digit operands), is added to the number digit by digit,
mod 10 ("4821 ?" -> "4993" under "0172"). The issue's own examples (b - a, a + b + 1) need two-digit
arithmetic this 1M student does not have (5.6%, above); a keyed digit shift is an operator it can
compute, position by position, once the key is stated, and a found answer says nothing of the next
problem's, where a suffix, once sampled, is the same string everywhere. The operator form needs the
`copy` skill over operands of one width (min_operand >= 10^(width-1)), and b <= log2(10^width).

What the verifier and the hint say (`hint`): "rule" states the problem's convention in the verifier's
feedback ("incorrect: answers here end with :kd") and in the problem's hint ("end the answer with
:kd", what `teacher.kind: dataset` hands a failed attempt); "wrong" states another convention (the
control: a shuffled hint would state the same rule here, since every problem shares it); "none"
states nothing ("incorrect"). Neither ever states the problem's number, so a hint carries the rule
and no answer. GRPO sees only the reward.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset

LETTERS = "abcdefghijklmnop"        # 16: four bits a letter
MARK = "?"                           # a prompt ending in it asks for the convention


def suffix_length(bits: int) -> int:
    return max(1, math.ceil(bits / 4))


def convention(index: int, bits: int) -> str:
    """The index-th of the 2^bits conventions: its letters, most significant first."""
    if not 0 <= index < 2 ** bits:
        raise ValueError(f"convention {index} is outside 0..2^{bits}-1")
    letters = []
    for _ in range(suffix_length(bits)):
        index, digit = divmod(index, 16)
        letters.append(LETTERS[digit])
    return "".join(reversed(letters))


def hidden_convention(bits: int, rule_seed: int) -> int:
    """The hidden rule's index: a function of (bits, rule_seed) only."""
    return random.Random(f"hidden-rule:{bits}:{rule_seed}").randrange(2 ** bits)


def wrong_convention(index: int, bits: int) -> int:
    """A convention other than `index` (half the space away): what the control's hint states."""
    return (index + 2 ** (bits - 1)) % 2 ** bits


def check_rule(task: str, rule: str, hint: str, bits: int) -> None:
    """The settings every hidden-rule task shares (this one and rl/hidden_tool_rule.py), named when bad."""
    if rule not in ("hidden", "per_problem", "none"):
        raise ValueError(f"{task}: rule={rule!r}: expected hidden, per_problem or none")
    if hint not in ("rule", "wrong", "none"):
        raise ValueError(f"{task}: hint={hint!r}: expected rule, wrong or none")
    if not 1 <= bits <= 16:
        raise ValueError(f"{task}: rule_bits={bits} must be in 1..16")


@dataclass
class HiddenRuleConfig:
    rule: str = "hidden"             # "hidden" | "per_problem" | "none" (see the module docstring)
    rule_bits: int = 8               # 2^rule_bits conventions; 1..16
    rule_seed: int = 0               # which convention is the hidden one
    hint: str = "rule"               # what feedback and hint state: "rule" | "wrong" | "none"
    rule_form: str = "suffix"        # "suffix": ":kd" appended | "operator": a key added digit by digit
    min_operand: int = 0
    max_operand: int = 99
    operators: list[str] = field(default_factory=lambda: ["+"])   # "+", "-", or "copy": "4821" -> "4821"
    question: str = "expression"     # the question's wording: "expression" ("4821 ?") or "words", an English
                                     # sentence for pretrained students (task.render=question shows it)
    seed: int | None = None
    size: int = 100_000

    def validate(self) -> None:
        check_rule("hidden_rule", self.rule, self.hint, self.rule_bits)
        if not 0 <= self.min_operand <= self.max_operand:
            raise ValueError(f"hidden_rule: operands {self.min_operand}..{self.max_operand} are not a range")
        if not self.operators or set(self.operators) - {"+", "-", "copy"}:
            raise ValueError(f"hidden_rule: operators={self.operators!r}: expected some of '+', '-', 'copy'")
        if self.question not in ("expression", "words"):
            raise ValueError(f"hidden_rule: question={self.question!r}: expected expression or words")
        if self.rule_form not in ("suffix", "operator"):
            raise ValueError(f"hidden_rule: rule_form={self.rule_form!r}: expected suffix or operator")
        if self.rule_form == "operator":
            width = len(str(self.max_operand))
            if self.operators != ["copy"] or self.min_operand < 10 ** (width - 1):
                raise ValueError(f"hidden_rule: rule_form=operator shifts the digits of one number: it needs "
                                 f"operators=['copy'] and operands of one width (min_operand >= {10 ** (width - 1)})")
            if 2 ** self.rule_bits > 10 ** width:
                raise ValueError(f"hidden_rule: rule_bits={self.rule_bits}: {width}-digit keys hold at most "
                                 f"{math.floor(math.log2(10 ** width))} bits")


def digit_key(index: int, width: int) -> str:
    """The operator form's index-th key: the index written with `width` digits."""
    return str(index).zfill(width)


def shifted(number: str, key: str) -> str:
    """`number` with `key` added digit by digit, mod 10 (no carry)."""
    return "".join(str((int(d) + int(k)) % 10) for d, k in zip(number, key, strict=True))


class HiddenRuleDataset(ProceduralDataset):
    def __init__(self, config: HiddenRuleConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx: int) -> dict:
        c = self.config
        rng = random.Random(f"{self.seed}:{idx}")
        a, b = rng.randint(c.min_operand, c.max_operand), rng.randint(c.min_operand, c.max_operand)
        op = rng.choice(c.operators)
        value = {"+": a + b, "-": a - b, "copy": a}[op]
        expression = str(a) if op == "copy" else f"{a} {op} {b}"
        meta = {"source_dataset": "hidden_rule", "expression": expression, "value": value, "hints": []}
        if c.question == "words":
            meta["question"] = "words"
        asked = f"Write the number {a}." if op == "copy" else f"What is {a} {op} {b}?"     # question: words
        if c.rule == "none":
            said = f"{asked} Reply with the answer only."
            return {"question": said if c.question == "words" else expression, "answer": str(value), "metadata": meta}
        index = rng.randrange(2 ** c.rule_bits) if c.rule == "per_problem" else hidden_convention(c.rule_bits, c.rule_seed)
        stated = {"rule": index, "wrong": wrong_convention(index, c.rule_bits), "none": None}[c.hint]
        if c.rule_form == "operator":
            width = len(str(c.max_operand))
            name_of = lambda i: digit_key(i, width)                                   # noqa: E731
            say = lambda i: f"add {name_of(i)} to the digits, each mod 10"            # noqa: E731
            answer = shifted(str(value), name_of(index))
        else:
            name_of = lambda i: ":" + convention(i, c.rule_bits)                      # noqa: E731
            say = lambda i: f"end the answer with {name_of(i)}"                       # noqa: E731
            answer = f"{value}{name_of(index)}"
        if stated is not None:
            meta["stated"] = name_of(stated)
            meta["hints"] = [say(stated)]
        # The wrong-rule control's hint (teacher.decoy): another convention, stated alike.
        meta["decoy_hints"] = [say(wrong_convention(index, c.rule_bits))]
        meta.update(convention=name_of(index), rule_index=index, rule_form=c.rule_form)
        expression = f"{expression} {MARK}"
        meta["expression"] = expression
        said = f"{asked} Answers to this task follow a convention; reply with the answer only."
        return {"question": said if c.question == "words" else expression, "answer": answer, "metadata": meta}

    def score_answer(self, answer: str | None, entry: dict) -> float:
        if not isinstance(answer, str):
            return 0.0
        if entry["metadata"].get("question") == "words":
            # A chat model answers in a sentence ("The answer is 4821:kd."): the answer counts where it
            # stands as a word of its own (not inside 14821 or 4821:kdx).
            return float(re.search(rf"(?<![\w:]){re.escape(entry['answer'])}(?![\w:])", answer) is not None)
        return float(answer.strip() == entry["answer"])

    def feedback(self, answer: str, entry: dict) -> str:
        """The verifier's words on a wrong answer: the stated convention (rule or wrong), never the number."""
        meta = entry["metadata"]
        stated = meta.get("stated")
        if not stated:
            return "incorrect"
        if meta.get("rule_form") == "operator":
            return f"incorrect: here the key {stated} is added to the digits, each mod 10"
        if answer.strip().endswith(stated):
            return f"incorrect: the convention {stated} is right, the number is not"
        return f"incorrect: answers here end with {stated}"


reasoning_gym.register_dataset("hidden_rule", HiddenRuleDataset, HiddenRuleConfig)
