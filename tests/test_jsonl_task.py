"""Bring-your-own problems (`task.source: jsonl`): file checks, held-out split, verification, a run."""
import json

import pytest

from conftest import ROOT, run_cli
from rl.config import ConfigError
from rl.configure import load_config
from rl.jsonl_task import JsonlError, load_problems

DEFAULT = ROOT / "experiments" / "default"


def write_problems(path, n=40, buckets=("easy", "hard")):
    """n problems per bucket: sums whose answers are plain numbers, and halves written as fractions."""
    with path.open("w") as f:
        for b, bucket in enumerate(buckets):
            for i in range(n):
                a, c = i + 1, (b + 1) * 100 + i
                record = {"prompt": f"{a} + {c}", "answer": str(a + c), "bucket": bucket}
                if i % 4 == 0:
                    record = {"prompt": f"half of {c}", "answer": f"\\frac{{{c}}}{{2}}", "bucket": bucket,
                              "hints": ["Divide by two."], "solution": f"{c} / 2"}
                f.write(json.dumps(record) + "\n")
    return path


def source(tmp_path, *overrides):
    from rl.tasks import TaskSource

    path = write_problems(tmp_path / "problems.jsonl")
    cfg = load_config(DEFAULT, ["task.source=jsonl", f"task.path={path}", "task.render=question",
                                "task.eval_size=10", *overrides])
    return TaskSource(cfg.task, cfg.seed), cfg


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "1 + 1"', "problems.jsonl:2: not a JSON object"),
    ('["1 + 1", "2"]', "problems.jsonl:2: not a JSON object (got list)"),
    ('{"prompt": "1 + 1"}', "problems.jsonl:2: missing 'answer'"),
    ('{"prompt": "1 + 1", "answer": 2}', "problems.jsonl:2: 'answer' must be a str, got int"),
    ('{"prompt": "1 + 1", "answer": "2", "hints": "add"}', "problems.jsonl:2: 'hints' must be a list"),
    ('{"prompt": "1 + 1", "answer": "2", "hints": [3]}', "problems.jsonl:2: 'hints' must be a list of strings"),
    ('{"prompt": " ", "answer": "2"}', "problems.jsonl:2: 'prompt' is empty"),
])
def test_a_bad_line_is_named(tmp_path, line, message):
    path = tmp_path / "problems.jsonl"
    path.write_text('{"prompt": "2 + 2", "answer": "4"}\n' + line + "\n")
    with pytest.raises(JsonlError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_problems(path)


def test_bad_files_are_config_errors_before_any_compute(tmp_path):
    bad = tmp_path / "problems.jsonl"
    bad.write_text('{"prompt": "2 + 2", "answer": "4"}\n\n{"prompt": "x"}\n')
    base = ["task.source=jsonl", "task.render=question"]
    with pytest.raises(ConfigError, match="problems.jsonl:3: missing 'answer'"):
        load_config(DEFAULT, [*base, f"task.path={bad}"])
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(DEFAULT, [*base, f"task.path={tmp_path / 'absent.jsonl'}"])
    with pytest.raises(ConfigError, match="needs task.path"):
        load_config(DEFAULT, base)
    good = write_problems(tmp_path / "good.jsonl", n=12)
    with pytest.raises(ConfigError, match="a bucket has only 12 problems"):
        load_config(DEFAULT, [*base, f"task.path={good}", "task.eval_size=12"])
    with pytest.raises(ConfigError, match=r"task.mix names \['medium'\], not buckets of the task \(\['easy', 'hard'\]\)"):
        load_config(DEFAULT, [*base, f"task.path={good}", "task.eval_size=4", "task.mix={medium: 1}"])
    with pytest.raises(ConfigError, match="remove task.buckets"):
        load_config(DEFAULT, [*base, f"task.path={good}", "task.eval_size=4", "task.buckets={a: {}}"])
    with pytest.raises(ConfigError, match="task.match='fuzzy' is not valid"):
        load_config(DEFAULT, [*base, f"task.path={good}", "task.eval_size=4", "task.match=fuzzy"])


def test_a_relative_path_is_the_experiment_folders(tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    write_problems(folder / "problems.jsonl")
    (folder / "config.yaml").write_text("task:\n  source: jsonl\n  path: problems.jsonl\n  render: question\n"
                                        "  eval_size: 10\n")
    cfg = load_config(folder, [])
    assert cfg.task.path == str((folder / "problems.jsonl").resolve())


def test_held_out_problems_never_reach_training_and_the_stream_is_per_seed(tmp_path):
    tasks, cfg = source(tmp_path)
    assert tasks.buckets == ["easy", "hard"]
    assert {b: len(p) for b, p in tasks.eval_by_bucket.items()} == {"easy": 10, "hard": 10}
    # Many times the 60 training problems: the stream cycles (a bucket's file order is reshuffled
    # each pass; which bucket a position draws is random, so a pass may repeat or miss a problem).
    batch = tasks.next_batch(400)
    tasks.assert_disjoint(batch)
    assert {p.bucket for p in batch} == {"easy", "hard"}
    assert len({p.prompt for p in batch}) == 60        # every training problem, none held out
    again, _ = source(tmp_path)
    assert [p.prompt for p in again.next_batch(400)] == [p.prompt for p in batch]
    other, _ = source(tmp_path, "seed=1")
    assert [p.prompt for p in other.next_batch(30)] != [p.prompt for p in batch[:30]]
    assert [p.prompt for p in other.eval_problems] == [p.prompt for p in tasks.eval_problems]
    easy_only = tasks.next_batch(20, mix={"easy": 1})
    assert {p.bucket for p in easy_only} == {"easy"}
    assert easy_only[0].entry["metadata"]["source_dataset"] == "jsonl"


def test_math_verify_accepts_equal_values_and_exact_does_not(tmp_path):
    tasks, _ = source(tmp_path)
    half = next(p for p in tasks.eval_problems if p.prompt.startswith("half of"))
    value = int(half.prompt.split()[-1]) / 2
    assert tasks.verify(half, str(value)).reward == 1.0           # "1.5" against \frac{3}{2}
    assert tasks.verify(half, str(value + 1)).reward == 0.0
    assert tasks.verify(half, "").feedback == "no answer was given"
    total = next(p for p in tasks.eval_problems if "+" in p.prompt)
    assert tasks.verify(total, f" {total.answer} ").reward == 1.0
    exact, _ = source(tmp_path, "task.match=exact")
    half = next(p for p in exact.eval_problems if p.prompt.startswith("half of"))
    assert exact.verify(half, str(int(half.prompt.split()[-1]) / 2)).reward == 0.0
    assert exact.verify(half, half.answer).reward == 1.0


def test_champ_converts_to_a_problem_file_whose_answers_verify(tmp_path):
    from rl.champ import main
    from rl.tasks import TaskSource

    path = tmp_path / "champ.jsonl"
    assert main([str(path)]) == 0
    problems = load_problems(path)
    assert len(problems) == 270 and sum(bool(p["hints"]) for p in problems) > 200
    cfg = load_config(DEFAULT, ["task.source=jsonl", f"task.path={path}", "task.render=question", "task.eval_size=5"])
    tasks = TaskSource(cfg.task, cfg.seed)
    assert tasks.buckets == ["Combinatorics", "Inequality", "Number-Theory", "Polynomial", "Sequence"]
    assert len(tasks.eval_problems) == 25
    for problem in tasks.eval_problems:       # the reference verifies against itself; another answer does not
        assert tasks.verify(problem, problem.answer).reward == 1.0, problem.answer
    wrong = next(p for p in tasks.eval_problems if p.answer.isdigit())
    assert tasks.verify(wrong, str(int(wrong.answer) + 1)).reward == 0.0


@pytest.mark.slow
def test_a_run_trains_on_a_jsonl_file(tmp_path, tiny_overrides):
    path = write_problems(tmp_path / "problems.jsonl")
    out = run_cli([str(DEFAULT), *tiny_overrides, "task.source=jsonl", f"task.path={path}", "task.render=question",
                   "task.eval_size=8", "rollout.max_new_tokens=6", "method.name=hint_distill", "teacher.kind=dataset",
                   "run_name=byo"])
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs" / "default" / "byo" / "metrics.jsonl").open()]
    assert {"eval/accuracy/easy", "eval/accuracy/hard"} <= set(rows[-1])
    assert rows[-1]["step"] == 3 + 4                # after warm-start's and RL's steps, as TINY sets them
    assert sum("train/reward_mean" in r for r in rows) == 4          # every RL step scored its attempts
    # The file's hints reached the teacher: failed attempts at "half of ..." problems got "Divide by two."
    assert any(r.get("hint/rate", 0) > 0 for r in rows)


def test_the_dataset_teacher_gives_the_problems_own_first_hint(tmp_path):
    from rl.hints import request_for
    from rl.tasks import Verdict
    from teacher import TeacherConfig, build_teacher

    tasks, _ = source(tmp_path)
    hinted = next(p for p in tasks.eval_problems if p.prompt.startswith("half of"))
    plain = next(p for p in tasks.eval_problems if "+" in p.prompt)
    wrong = Verdict(0.0, "incorrect")
    requests = [request_for(hinted, "7", wrong), request_for(plain, "7", wrong)]
    assert requests[0].hints == ["Divide by two."] and requests[1].hints == []
    hints = build_teacher(TeacherConfig(kind="dataset", max_hint_chars=6)).write_hints(requests)
    assert (hints[0].target_index, hints[0].text) == (1, "Divide") and hints[1] is None
