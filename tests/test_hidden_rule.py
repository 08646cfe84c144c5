"""experiments/hidden-rule's task (rl/hidden_rule.py) and what its regime needed from warm-start,
evaluation and studies: per-bucket hint fractions, a decaying warm-start rate, the decoy-hint
control, the frozen teacher's with-hint accuracy, the study's gate."""
import random
from collections import Counter

import pytest
import reasoning_gym

from conftest import ROOT
from rl.config import ConfigError, TaskConfig
from rl.configure import load_config
from rl.engine import lr_at
from rl.hidden_rule import convention, digit_key, hidden_convention, shifted, wrong_convention
from rl.study import GateError, check_gate, load_study
from rl.tasks import TaskSource
from rl.warmstart import demonstrations
from student.tokenizer import ByteTokenizer
from teacher import LeakGuard, TeacherConfig, build_teacher

TOK = ByteTokenizer()
BUCKETS = {"base": {"rule": "none"}, "stated": {"rule": "per_problem"}, "hidden": {"rule": "hidden"}}


def source(bits: int = 8, eval_size: int = 50, **config) -> TaskSource:
    return TaskSource(TaskConfig(name="hidden_rule", render="expression", eval_size=eval_size,
                                 config={"rule_bits": bits, **config}, buckets=BUCKETS), seed=0)


@pytest.mark.parametrize("bits", [1, 4, 8, 12, 16])
def test_there_are_two_to_the_bits_conventions_and_a_distinct_wrong_one(bits):
    sample = range(2 ** bits) if bits <= 12 else random.Random(0).sample(range(2 ** bits), 5000)
    names = {convention(i, bits) for i in sample}
    assert len(names) == len(sample)
    assert all(len(n) == max(1, -(-bits // 4)) and set(n) <= set("abcdefghijklmnop") for n in names)
    rule = hidden_convention(bits, 0)
    assert wrong_convention(rule, bits) != rule
    with pytest.raises(ValueError):
        convention(2 ** bits, bits)


def test_the_hidden_bucket_shares_one_convention_the_stated_bucket_draws_them_uniformly():
    tasks = source(bits=4, eval_size=10)
    by_bucket = {b: [p for p in tasks.next_batch(600, {b: 1})] for b in BUCKETS}
    hidden = {p.answer.split(":")[1] for p in by_bucket["hidden"]}
    assert hidden == {convention(hidden_convention(4, 0), 4)}
    drawn = Counter(p.answer.split(":")[1] for p in by_bucket["stated"])
    assert len(drawn) == 16 and min(drawn.values()) > 600 / 16 / 3       # all 16, none rare
    assert all(":" not in p.answer and not p.prompt.endswith("?") for p in by_bucket["base"])
    # Another rule_seed hides another convention (for bits large enough that a clash is unlikely).
    assert hidden_convention(16, 0) != hidden_convention(16, 1)


def test_verdicts_and_hints_state_the_convention_never_the_number():
    tasks = source()
    p = tasks.next_batch(1, {"hidden": 1})[0]
    number, rule = p.answer.split(":")
    assert tasks.verify(p, p.answer).reward == 1.0
    assert tasks.verify(p, number).reward == 0.0                     # no partial credit for the number alone
    words = tasks.verify(p, number + ":zz").feedback
    assert f":{rule}" in words and number not in words
    assert "number is not" in tasks.verify(p, f"{int(number) + 1}:{rule}").feedback
    hint, = p.entry["metadata"]["hints"]
    decoy, = p.entry["metadata"]["decoy_hints"]
    assert hint.endswith(f":{rule}") and not decoy.endswith(f":{rule}") and number not in hint + decoy
    assert LeakGuard().filter(hint, p.answer, p.prompt) == hint      # the leak guard keeps it: no answer in it
    # The dataset teacher hands out the hint, or under teacher.decoy the wrong rule.
    from rl.hints import request_for
    request = request_for(p, number, tasks.verify(p, number))
    assert build_teacher(TeacherConfig(kind="dataset")).write_hints([request])[0].text == hint
    assert build_teacher(TeacherConfig(kind="dataset", decoy=True)).write_hints([request])[0].text == decoy


OPERATOR = {"rule_form": "operator", "operators": ["copy"], "min_operand": 1000, "max_operand": 9999}


def test_the_operator_form_adds_one_key_digit_by_digit_and_states_it_never_the_answer():
    assert shifted("4821", "0172") == "4993" and shifted("9999", "1234") == "0123"   # mod 10, no carry
    tasks = source(bits=8, **OPERATOR)
    key = digit_key(hidden_convention(8, 0), 4)
    hidden = tasks.next_batch(200, {"hidden": 1})
    for p in hidden:
        number = p.prompt.split()[0].split(">")[-1]
        assert p.entry["metadata"]["expression"] == f"{number} ?"
        assert p.answer == shifted(number, key) and tasks.verify(p, p.answer).reward == 1.0
        assert tasks.verify(p, number).reward == 0.0 or key == "0000"
    p = hidden[0]
    hint, = p.entry["metadata"]["hints"]
    decoy, = p.entry["metadata"]["decoy_hints"]
    assert key in hint and key not in decoy and p.answer not in hint + decoy
    assert key in tasks.verify(p, "0000").feedback and p.answer not in tasks.verify(p, "0000").feedback
    assert LeakGuard().filter(hint, p.answer, p.prompt) == hint
    # The stated bucket draws its keys among the 2^8: a different operator for most problems.
    keys = {p.entry["metadata"]["convention"] for p in tasks.next_batch(400, {"stated": 1})}
    assert len(keys) > 150 and all(int(k) < 2 ** 8 for k in keys)


@pytest.mark.parametrize("config, message", [
    ({"operators": ["+"]}, "operators=\\['copy'\\]"),
    ({"min_operand": 0}, "min_operand >= 1000"),
    ({"rule_bits": 14}, "at most 13 bits"),
    ({"rule_form": "prefix"}, "rule_form='prefix'"),
])
def test_bad_operator_settings_are_named(config, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        source(bits=config.pop("rule_bits", 8), **{**OPERATOR, **config})


def test_the_question_in_words_asks_the_same_problem_in_english():
    """question=words (for pretrained students): the same draws, answers and hints; only the wording."""
    settings = dict(seed=3, size=5, operators=["copy"], min_operand=1000, max_operand=9999)
    for rule in ("none", "per_problem", "hidden"):
        plain = reasoning_gym.create_dataset("hidden_rule", rule=rule, **settings)
        words = reasoning_gym.create_dataset("hidden_rule", rule=rule, question="words", **settings)
        for a, b in zip(plain, words):
            assert (a["answer"], a["metadata"]["hints"]) == (b["answer"], b["metadata"]["hints"])
            number = a["metadata"]["expression"].split()[0]
            assert b["question"].startswith(f"Write the number {number}.") and b["question"].endswith("answer only.")
            assert ("convention" in b["question"]) == (rule != "none")
    sums = reasoning_gym.create_dataset("hidden_rule", seed=0, size=1, operators=["-"], question="words", rule="none")
    assert sums[0]["question"].startswith(f"What is {sums[0]['metadata']['expression']}?")
    # A chat model answers in a sentence: the answer counts where it stands as a word of its own.
    entry = reasoning_gym.create_dataset("hidden_rule", rule="hidden", question="words", **settings)[0]
    answer, number = entry["answer"], entry["answer"].split(":")[0]
    scores = {text: words.score_answer(text, entry) for text in
              (f"The answer is {answer}.", answer, f"1{answer}", f"{answer}x", number, f"{number}:zz")}
    assert list(scores.values()) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0], scores
    assert plain.score_answer(f"The answer is {answer}.", plain[0]) == 0.0          # expression: exact
    with pytest.raises(ValueError, match="question='poem'"):
        reasoning_gym.create_dataset("hidden_rule", seed=0, size=1, question="poem")


def test_held_out_problems_differ_per_bucket_and_never_reach_training():
    tasks = source(eval_size=100)
    heldout = {b: [p.prompt for p in ps] for b, ps in tasks.eval_by_bucket.items()}
    assert heldout["stated"] != heldout["hidden"]                      # not the same draws in the same order
    train = tasks.next_batch(3000, {"stated": 1, "hidden": 1})
    tasks.assert_disjoint(train)


def test_warmstart_hint_fraction_per_bucket():
    tasks = source()
    problems = tasks.next_batch(200, {"base": 1, "stated": 1})
    teacher = build_teacher(TeacherConfig(kind="dataset"))
    prompts, _, _ = demonstrations(problems, teacher, LeakGuard(), TOK, random.Random(0), 0.0,
                                   _env(tasks), by_bucket={"stated": 1.0})
    for problem, has_hint in zip(problems, [TOK.hint_id in row for row in prompts]):
        assert has_hint == (problem.bucket == "stated")


def _env(tasks):
    from rl.environments.answer import AnswerEnvironment
    return AnswerEnvironment(tasks)


def test_warmstart_rate_decays_to_its_floor_then_rl_starts_its_own():
    cfg = load_config(ROOT / "experiments/hidden-rule")
    ws = cfg.warmstart
    rates = [lr_at(s, cfg) for s in range(ws.steps + 3)]
    assert rates[ws.warmup_steps - 1] == pytest.approx(ws.lr)
    assert all(a >= b for a, b in zip(rates[ws.warmup_steps:ws.steps], rates[ws.warmup_steps + 1:ws.steps]))
    assert rates[ws.steps - 1] == pytest.approx(ws.lr * ws.min_lr_ratio)
    assert rates[ws.steps] == pytest.approx(cfg.trainer.lr / cfg.trainer.warmup_steps)
    flat = load_config(ROOT / "experiments/hidden-rule", ["warmstart.decay=none"])
    assert lr_at(ws.steps - 1, flat) == ws.lr


@pytest.mark.parametrize("override, message", [
    ("warmstart.hint_fraction_by_bucket={nope: 1.0}", "not buckets of the task"),
    ("warmstart.hint_fraction_by_bucket={stated: 2.0}", "fractions in"),
    ("warmstart.decay=step", "warmstart.decay"),
    ("teacher.kind=rule", None),
    ("task.buckets.hidden.rule_bits=17", "rule_bits=17"),
    ("task.buckets.hidden.rule=maybe", "rule='maybe'"),
])
def test_bad_hidden_rule_settings_are_named(override, message):
    if message is None:         # decoy belongs to the dataset teacher
        with pytest.raises(ConfigError, match="teacher.decoy"):
            load_config(ROOT / "experiments/hidden-rule", [override, "teacher.decoy=true"])
        return
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(ROOT / "experiments/hidden-rule", [override])


def test_the_study_gate_passes_or_names_what_fell_short():
    study = load_study(ROOT / "experiments/hidden-rule")
    assert study.gate == {"bucket": "hidden", "kind": "rule", "min_over_none": 0.3}
    gap = {"hidden": {"rule": {"over_none": {"mean": 0.5}}}}
    check_gate(study.gate, gap, "seed 0")
    gap["hidden"]["rule"]["over_none"]["mean"] = 0.1
    with pytest.raises(GateError, match="seed 0.*0.1 < gate.min_over_none=0.3: the warm-started student does not"):
        check_gate(study.gate, gap, "seed 0")
    # A plain retry that already solves 0.75 leaves a hint at most +0.25: the gate is what is wrong.
    gap["hidden"]["none"] = {"accuracy": 0.75}
    with pytest.raises(GateError, match="by more than 0.250 here: lower gate.min_over_none"):
        check_gate(study.gate, gap, "seed 0")


def test_the_gate_may_measure_on_a_subset_of_the_held_out_problems(tmp_path):
    import shutil
    folder = tmp_path / "hr"
    shutil.copytree(ROOT / "experiments/hidden-rule", folder, ignore=shutil.ignore_patterns("results*", "*.png"))
    text = (folder / "study.yaml").read_text()
    gate = "gate: {bucket: hidden, kind: rule, min_over_none: 0.3}"
    (folder / "study.yaml").write_text(text.replace(gate, gate[:-1] + ", problems: 50}"))
    assert load_study(folder).gate["problems"] == 50
    for bad in ("problems: 0}", "problems: 2.5}", "samples: 5}"):
        (folder / "study.yaml").write_text(text.replace(gate, gate[:-1] + ", " + bad))
        with pytest.raises(ConfigError, match="gate"):
            load_study(folder)


def test_the_generator_is_a_registered_reasoning_gym_task():
    data = reasoning_gym.create_dataset("hidden_rule", seed=5, size=3, rule="hidden", rule_bits=8)
    assert data[0] == reasoning_gym.create_dataset("hidden_rule", seed=5, size=3, rule="hidden", rule_bits=8)[0]
    assert data[0]["answer"].endswith(":" + convention(hidden_convention(8, 0), 8))


@pytest.mark.slow
def test_a_tiny_hidden_rule_study_runs_past_its_gate_or_stops_at_it(tmp_path):
    """The generator through a whole two-step study; the gate stops the arms of a warm-start that
    does not read hints (a tiny one cannot) and names the shortfall."""
    import json
    import subprocess
    import sys

    from rl.study import BEGIN, END
    study = tmp_path / "tiny"
    study.mkdir()
    (study / "config.yaml").write_text(f"""base: {ROOT / 'experiments/hidden-rule'}
task: {{eval_size: 6, config: {{max_operand: 99}}}}
student: {{hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, num_experts: 4, expert_width: 16}}
rollout: {{prompts_per_step: 2, attempts_per_prompt: 4}}
warmstart: {{steps: 4, batch_size: 8}}
trainer: {{steps: 2, eval_every: 2, checkpoint_every: 2}}
""")
    arms = """arms:
  grpo: [method.name=grpo]
  wrong_rule: [method.name=hint_distill, method.teacher_weights=frozen, teacher.decoy=true]
  oracle: {kind: oracle}
"""
    (study / "study.yaml").write_text("seeds: [0]\ntarget: {bucket: hidden, arm: grpo}\n"
                                      "gate: {bucket: hidden, kind: rule, min_over_none: 0.3}\n" + arms)
    (study / "README.md").write_text(f"# tiny\n\n{BEGIN}\n{END}\n")
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "rl.study", str(study), "--output_dir", str(out)]
    stopped = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert stopped.returncode != 0 and "gate.min_over_none=0.3" in stopped.stderr, stopped.stderr[-3000:]
    assert not (out / "tiny" / "grpo-s0").exists()
    (study / "study.yaml").write_text("seeds: [0]\ntarget: {bucket: hidden, arm: grpo}\n"
                                      "gate: {bucket: hidden, kind: rule, min_over_none: -1}\n" + arms)
    ran = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((study / "results" / "summary.json").read_text())
    assert set(summary["arms"]) == {"grpo", "wrong_rule", "oracle"}
    assert set(summary["arms"]["grpo"]["final"]) == {"base", "stated", "guess", "hidden"}


def test_the_summary_reports_every_seeds_gate_and_averages_the_seeds_it_let_through(tmp_path):
    import json

    from rl.study import summarize
    from rl.study_tables import results_markdown
    study = load_study(ROOT / "experiments/hidden-rule", seeds=[0, 1])
    base = tmp_path / "hidden-rule"
    base.mkdir()
    row = {"accuracy": 0.0, "pass@G": 0.0, "all_fail": 1.0, "gap": 0.0, "rescued_all_fail": 0.0}
    for seed, over in ((0, 0.8), (1, -0.01)):
        gap = {b: {"plain": dict(row), "none": dict(row), "rule": {**row, "over_none": {"mean": over}}}
               for b in ("base", "stated", "guess", "hidden")}
        (base / f"teacher_gap-s{seed}.json").write_text(json.dumps(gap))
    summary = json.loads(json.dumps(summarize(study, tmp_path)))     # as summary.json reads back
    assert summary["gate"]["seeds"] == {"0": {"over_none": 0.8, "passed": True},
                                        "1": {"over_none": -0.01, "passed": False}}
    assert list(summary["teacher_gap"]) == ["0"]
    table = results_markdown(summary)
    assert "Passed: seeds 0 (+0.800); stopped: seeds 1 (-0.010) (their arms did not run)." in table
    assert "mean over 1 seed(s)" in table
