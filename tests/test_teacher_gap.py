"""The teacher-gap measurement counts what it says, on a policy whose behaviour is scripted, and
runs end to end on a real (tiny) run folder."""
import json

import torch
from pytest import approx

from conftest import TINY, run_cli
from rl.config import TaskConfig
from rl.tasks import TaskSource
from rl.teacher_gap import measure, table
from student.policy import Rollout, Sampling
from student.tokenizer import ByteTokenizer
from teacher import TeacherConfig, build_teacher

SPACE = dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2, operators=["+"], allow_parentheses=False,
             allow_negation=False)


class ScriptedPolicy:
    """Answers `always` problems right, `sometimes` problems right every 4th time it is asked them
    without a hint (the 1st, 5th, ...), others wrong ("0"); with a hint in context, right when the
    hint fits the problem's answer (rule hints written for it, a stated correct answer), wrong
    otherwise. `calls` keeps every generate call's prompts."""
    device = torch.device("cpu")

    def __init__(self, tok, answers, always, sometimes):
        self.tok, self.answers, self.always, self.sometimes = tok, answers, always, sometimes
        self.asked, self.calls = {}, []

    def _answer(self, prompt_ids):
        text = bytes(i for i in prompt_ids if i < 256).decode()
        if self.tok.hint_id in prompt_ids:
            at = prompt_ids.index(self.tok.hint_id)
            problem = bytes(i for i in prompt_ids[:at] if i < 256).decode()
            hint = bytes(i for i in prompt_ids[at:] if i < 256).decode()
            answer = self.answers[problem]
            fits = ((hint.startswith("starts with ") and answer.startswith(hint[12:]))
                    or (hint.startswith("ends with ") and answer.endswith(hint[10:]))
                    or hint == f"a correct answer: {answer}")
            return answer if fits else "0"
        asked = self.asked[text] = self.asked.get(text, -1) + 1
        if text in self.always or (text in self.sometimes and asked % 4 == 0):
            return self.answers[text]
        return "0"

    def generate(self, prompts, sampling, turns=None):
        self.calls.append([list(p) for p in prompts])
        rows = [self.tok.render_answer(self._answer(p)) for p in prompts]
        for i, row in enumerate(rows if turns is not None else []):
            assert turns.after_message(i, row, ended=True) is None     # one-message episodes
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.tok.pad_id)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
        return Rollout(prompts, ids, ids != self.tok.pad_id, torch.zeros(ids.shape), None)


def scripted_case(**measure_args):
    """12 two-digit-answer problems, G = 4: 2 always solved, 2 solved on 1 of 4 plain tries, 8 never
    without a hint. Returns (problems, policy, measure's result)."""
    tok = ByteTokenizer()
    tasks = TaskSource(TaskConfig(config=SPACE, render="expression", eval_size=12), seed=0)
    problems = [p for p in tasks.eval_problems if len(p.answer) >= 2][:12]
    always, sometimes = {problems[0].prompt, problems[1].prompt}, {problems[2].prompt, problems[3].prompt}
    policy = ScriptedPolicy(tok, {p.prompt: p.answer for p in problems}, always, sometimes)
    sampling = Sampling(max_new_tokens=6, eos_id=tok.eos_id, pad_id=tok.pad_id)
    r = measure(policy, problems, tasks, build_teacher(TeacherConfig()), tok, sampling, attempts=4, **measure_args)
    return problems, policy, r


def test_gap_counts_rescues_per_hint_kind():
    problems, _, r = scripted_case()
    n = len(problems)
    assert list(r) == ["plain", "none", "rule", "feedback", "sibling", "shuffled"]
    assert r["plain"]["accuracy"] == approx((2 * 4 + 2 * 1) / (4 * n)) and r["plain"]["n"] == n
    assert r["plain"]["pass@G"] == approx(4 / n) and r["plain"]["all_fail"] == approx((n - 4) / n)
    # the rule hint fits every problem: every failed attempt is rescued, and every all-fail problem
    assert r["rule"]["accuracy"] == 1.0 and r["rule"]["rescued_all_fail"] == 1.0
    assert r["rule"]["gap"] == approx(1.0 - r["plain"]["accuracy"])
    # a sibling's success exists only in the `sometimes` groups: 3 failed attempts each
    assert r["sibling"]["hinted"] == 6 / (4 * n - 10) and r["sibling"]["rescued_all_fail"] == 0.0
    assert r["sibling"]["accuracy"] == approx((2 * 4 + 2 * 4) / (4 * n))
    assert r["feedback"]["gap"] == 0.0
    # another problem's hint rarely fits this one
    assert r["shuffled"]["hinted"] == 1.0 and r["shuffled"]["gap"] < 0.5 * r["rule"]["gap"]


def test_none_retries_exactly_the_failed_attempts_without_context():
    problems, policy, r = scripted_case()
    plain_prompts, none_prompts = policy.calls[0], policy.calls[1]
    failed = [i for i in range(len(plain_prompts)) if not _was_right(policy, problems, i)]
    assert len(failed) == 4 * len(problems) - 10
    # the second call is the none retry: one row per failed attempt, its first prompt as it was
    assert none_prompts == [plain_prompts[i] for i in failed]
    assert all(policy.tok.hint_id not in p for p in none_prompts)
    assert r["none"]["hinted"] == 1.0 and "over_none" not in r["none"]
    # a `sometimes` problem is asked a 5th time by the none retry and answers it: one rescue each
    assert r["none"]["accuracy"] == approx((2 * 4 + 2 * 2) / (4 * len(problems)))
    assert r["none"]["rescued_all_fail"] == 0.0


def _was_right(policy, problems, i):
    """Whether plain attempt i was answered right: `always` problems, and a `sometimes` problem's first try."""
    prompt = problems[i // 4].prompt
    return prompt in policy.always or (prompt in policy.sometimes and i % 4 == 0)


def test_over_none_is_the_per_problem_difference_with_an_interval():
    problems, _, r = scripted_case()
    n = len(problems)
    # per-problem accuracies (always x2, sometimes x2, never x8) by hand
    plain = [1, 1, 0.25, 0.25] + [0] * 8
    none = [1, 1, 0.5, 0.5] + [0] * 8
    rule = [1] * n
    sibling = [1, 1, 1, 1] + [0] * 8
    feedback = plain
    for kind, acc in (("rule", rule), ("sibling", sibling), ("feedback", feedback)):
        over = r[kind]["over_none"]
        assert over["mean"] == approx(sum(a - b for a, b in zip(acc, none)) / n) and over["n"] == n
        assert r[kind]["gap_interval"]["mean"] == approx(sum(a - b for a, b in zip(acc, plain)) / n)
        assert r[kind]["gap_interval"]["mean"] == approx(r[kind]["gap"])
    assert r["rule"]["over_none"]["mean"] == approx(9 / 12) and r["sibling"]["over_none"]["mean"] == approx(1 / 12)
    assert r["none"]["gap_interval"]["mean"] == approx(r["none"]["gap"]) == approx(0.5 / 12)
    for kind in ("none", "rule", "feedback", "sibling", "shuffled"):
        for key in ("gap_interval", "over_none") if kind != "none" else ("gap_interval",):
            d = r[kind][key]
            assert d["low"] <= d["mean"] <= d["high"], (kind, key, d)
    # the rule hint rescues 8 problems outright: the interval is clear of zero, and wide of a point
    assert 0 < r["rule"]["over_none"]["low"] < r["rule"]["over_none"]["high"] <= 1
    # feedback never rescues, and the none retry rescues the `sometimes` problems: strictly worse than a plain retry
    assert r["feedback"]["over_none"]["high"] <= 0 and r["feedback"]["over_none"]["low"] < 0
    assert r["feedback"]["over_none"]["mean"] == approx(-0.5 / 12)


def test_none_is_measured_when_a_subset_of_kinds_is_asked():
    problems, policy, r = scripted_case(kinds=("rule",))
    assert list(r) == ["plain", "none", "rule"] and len(policy.calls) == 3
    assert r["rule"]["over_none"]["mean"] == approx(9 / 12)
    text = table({"easy": r})
    assert "none: gap" in text and "rule: over none" in text and "feedback" not in text
    assert f"| easy | {len(problems)} |" in text and f"{r['rule']['over_none']['mean']:+.3f} [" in text


def test_cli_measures_a_run_folder_per_bucket(tmp_path):
    buckets = "task.buckets={easy: {min_digits: 1, max_digits: 1}, hard: {min_digits: 3, max_digits: 3}}"
    out = run_cli(["experiments/default", *TINY, f"output_dir={tmp_path}", "run_name=w", "trainer.steps=0", buckets])
    assert out.returncode == 0, out.stderr[-2000:]
    import subprocess
    import sys

    from conftest import ROOT
    gap = subprocess.run([sys.executable, "-m", "rl.teacher_gap", str(tmp_path / "default" / "w"), "--attempts", "2",
                          "--out", str(tmp_path / "gap.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert gap.returncode == 0, gap.stderr[-2000:]
    result = json.loads((tmp_path / "gap.json").read_text())
    assert list(result) == ["easy", "hard"]
    assert list(result["hard"]) == ["plain", "none", "rule", "feedback", "sibling", "shuffled"]
    assert set(result["hard"]["rule"]["over_none"]) == {"mean", "low", "high", "n"}
    assert result["hard"]["rule"]["over_none"]["n"] == result["hard"]["plain"]["n"]
    assert "| hard |" in gap.stdout and "over none" in gap.stdout
