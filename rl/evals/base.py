"""What an eval suite is (`Suite`: the sets it reads, counts per shard, the report), what it may use
(`EvalContext`), the registry of suites (`SUITES`) and `run_suites`, which shards the sets over
ranks and sums the counts. The package's __init__ says what each suite reports."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

from rl.environments import Environment
from rl.tasks import Problem, TaskSource
from student.policy import Policy
from student.tokenizer import Tokenizer
from student.registry import Registry
from teacher import Teacher


@dataclass
class EvalContext:
    """What a suite may use: the policy under test (greedy), the self-teacher's weights, the task,
    the teacher that writes hints, the run's rollout shape, and what sampled suites draw with."""
    policy: Policy
    tasks: TaskSource
    teacher: Teacher
    tok: Tokenizer
    env: Environment
    max_new_tokens: int
    max_turns: int = 1
    teacher_policy: Policy | None = None          # None: the policy itself (a live self-teacher)
    temperature: float = 1.0                      # sampled suites: rollout.temperature
    pass_k: int = 0                               # sampled attempts per problem (eval.pass_k); 0: none
    seed: int = 0                                 # sampled suites seed their draws from it (the run's seed)


class Suite:
    name: ClassVar[str]
    summary: ClassVar[str]
    subsumed_by: ClassVar[str | None] = None      # a suite whose metrics include this one's (it is skipped then)

    def sets(self, tasks: TaskSource) -> dict[str, list[Problem]]:
        raise NotImplementedError

    def counts(self, ctx: EvalContext, problems: list[Problem]) -> dict[str, float]:
        """Counts over one shard of a set; the same keys for an empty shard."""
        raise NotImplementedError

    def report(self, per_set: dict[str, dict[str, float]]) -> dict[str, float]:
        raise NotImplementedError


# eval.suites -> the class (student/registry.py): a new suite is its file and one line here
SUITES: Registry[type[Suite]] = Registry("eval.suites", {
    "heldout": "rl.evals.heldout:HeldOut",
    "hinted": "rl.evals.hinted:Hinted",
    "private": "rl.evals.private:Private",
    "behaviour": "rl.evals.behaviour:Behaviour",
    "reference_logprob": "rl.evals.reference_logprob:ReferenceLogprob",
})


def suites_to_run(names: list[str]) -> list[str]:
    """The listed suites in order, without one whose metrics another listed suite reports too."""
    for name in names:
        SUITES.check(name)
    names = list(dict.fromkeys(names))
    return [n for n in names if SUITES[n].subsumed_by not in names]


def run_suites(names: list[str], ctx: EvalContext, rank: int = 0, world: int = 1,
               sum_over_ranks: Callable[[dict], dict] = dict) -> dict[str, dict]:
    """suite name -> {"metrics": {...}, "counts": {set: summed counts}, "sets": {set: problems}}. Each rank evaluates every
    world-th problem of every set; `sum_over_ranks` adds the counts up (identity on one rank)."""
    out = {}
    for name in suites_to_run(names):
        suite = SUITES[name]()
        sets = suite.sets(ctx.tasks)
        per_set = {s: sum_over_ranks(suite.counts(ctx, problems[rank::world])) for s, problems in sets.items()}
        out[name] = {"metrics": suite.report(per_set), "counts": per_set, "sets": sets}
    return out


def metrics_of(results: dict[str, dict]) -> dict[str, float]:
    return {k: v for r in results.values() for k, v in r["metrics"].items()}
