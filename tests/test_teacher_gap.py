"""The teacher-gap measurement counts what it says, on a policy whose behaviour is scripted, and
runs end to end on a real (tiny) run folder."""
import json

import torch
from pytest import approx

from conftest import TINY, run_cli
from rl.config import TaskConfig
from rl.tasks import TaskSource
from rl.teacher_gap import measure
from student.policy import Rollout, Sampling
from student.tokenizer import ByteTokenizer
from teacher import TeacherConfig, build_teacher

SPACE = dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2, operators=["+"], allow_parentheses=False,
             allow_negation=False)


class ScriptedPolicy:
    """Answers `always` problems right, `sometimes` problems right on every 4th attempt, others wrong
    ("0"); with a hint in context, right when the hint fits the problem's answer (rule hints written
    for it, a stated correct answer), wrong otherwise."""
    device = torch.device("cpu")

    def __init__(self, tok, answers, always, sometimes):
        self.tok, self.answers, self.always, self.sometimes = tok, answers, always, sometimes

    def _answer(self, position, prompt_ids):
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
        if text in self.always or (text in self.sometimes and position % 4 == 0):
            return self.answers[text]
        return "0"

    def generate(self, prompts, sampling, turns=None):
        rows = [self.tok.render_answer(self._answer(i, p)) for i, p in enumerate(prompts)]
        for i, row in enumerate(rows if turns is not None else []):
            assert turns.after_message(i, row, ended=True) is None     # one-message episodes
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.tok.pad_id)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
        return Rollout(prompts, ids, ids != self.tok.pad_id, torch.zeros(ids.shape), None)


def test_gap_counts_rescues_per_hint_kind():
    tok = ByteTokenizer()
    tasks = TaskSource(TaskConfig(config=SPACE, render="expression", eval_size=12), seed=0)
    problems = [p for p in tasks.eval_problems if len(p.answer) >= 2][:12]
    always, sometimes = {problems[0].prompt, problems[1].prompt}, {problems[2].prompt, problems[3].prompt}
    policy = ScriptedPolicy(tok, {p.prompt: p.answer for p in problems}, always, sometimes)
    sampling = Sampling(max_new_tokens=6, eos_id=tok.eos_id, pad_id=tok.pad_id)
    r = measure(policy, problems, tasks, build_teacher(TeacherConfig()), tok, sampling, attempts=4)
    n = len(problems)
    assert r["plain"]["accuracy"] == approx((2 * 4 + 2 * 1) / (4 * n))
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
    assert set(result["hard"]) == {"plain", "rule", "feedback", "sibling", "shuffled"}
    assert "| hard |" in gap.stdout
