"""The eval registry (`eval.suites`; `scripts/eval.sh MODEL --suite NAME`): one file per suite.

    heldout    greedy accuracy on each bucket's held-out set, no teacher         eval/accuracy[/<bucket>]
    hinted     + one retry with the teacher's hint, and the self-teacher's        eval/accuracy_hinted, hint_rate,
               accuracy with it: the teacher gap (rl/evals/greedy.py)                 accuracy_with_hint, teacher_gap
    private    greedy accuracy on each private set (`eval.private`, e.g. mined)   eval/private/<name>/accuracy
    behaviour  answer format, length, <eos> rate, hint text echoed in answers     eval/behaviour/*
    reference_logprob
               log pi(reference answer | prompt) per problem and per token, and   eval/reference_logprob[_per_token],
               pass@k of eval.pass_k sampled episodes: continuous signals on      eval/pass@k, sampled_accuracy
               the held-out sets and the private ones                             [/<bucket>], eval/private/<name>/*

A suite names the problem sets it reads (`sets`) and turns one shard of a set into counts
(`counts`: sums, so the ranks holding shards add them up); `report` turns every set's summed counts
into metrics. `run_suites` does the sharding and summing: the trainer's periodic evaluation and
rl/eval.py (the command line) both call it. A new suite is a file here and one line in the registry,
`SUITES` in rl/evals/base.py.

Every set a suite reads is an eval set of the run: its prompts' hashes keep it out of training
(rl/tasks.py, rl/contamination.py).
"""
from rl.evals.base import SUITES, EvalContext, Suite, metrics_of, run_suites, suites_to_run

__all__ = ["SUITES", "EvalContext", "Suite", "metrics_of", "run_suites", "suites_to_run"]
