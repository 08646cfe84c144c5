"""Contamination controls and problem files as task sources: every eval set the run reports is a
set of prompt hashes, and nothing in it is trained on, from a file or a generator seed alike."""
import json

import pytest

from conftest import TINY
from rl.config import EvalConfig, TaskConfig
from rl.configure import load_config
from rl.contamination import prompt_hash
from rl.tasks import TaskSource

SPACE = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_hash_ignores_whitespace_only():
    assert prompt_hash("12 + 35") == prompt_hash("  12  +\t35\n") != prompt_hash("12 + 36")


def test_a_planted_overlap_in_a_training_file_is_refused(tmp_path):
    plain = TaskSource(TaskConfig(config=SPACE, render="expression", eval_size=20), seed=0)
    held = plain.eval_problems[:5]
    fresh = [{"prompt": f"{a} + {b} + 1", "answer": str(a + b + 1)} for a in range(3) for b in range(3)]
    # the planted ones carry extra whitespace: a hash over the raw text would let them through
    planted = [{"prompt": " " + p.prompt.replace(" ", "  "), "answer": p.answer} for p in held]
    cfg = TaskConfig(config=SPACE, render="expression", eval_size=20,
                     files={"mined": _write(tmp_path / "mined.jsonl", planted + fresh)}, mix={"all": 1, "mined": 1})
    tasks = TaskSource(cfg, seed=0)
    assert tasks.refused_at_load == {"mined": 5}
    assert tasks.sources == ["all", "mined"]
    train = tasks.next_batch(400)
    eval_hashes = set().union(*tasks.eval_sets.values())
    assert not {prompt_hash(p.prompt) for p in train} & eval_hashes
    from_file = [p for p in train if p.bucket == "mined"]
    assert len(from_file) > 100 and {p.prompt for p in from_file} <= {r["prompt"] for r in fresh}
    # a file problem is verified by its record's answer
    problem = from_file[0]
    assert tasks.verify(problem, problem.answer).reward == 1.0
    assert tasks.verify(problem, "999").reward == 0.0


def test_a_private_eval_set_is_refused_by_the_generator_stream(tmp_path):
    cfg = TaskConfig(config=SPACE, render="expression", eval_size=10)
    first = [p.prompt for p in TaskSource(cfg, seed=0).next_batch(30)]
    private = _write(tmp_path / "private.jsonl", [{"prompt": p, "answer": "0"} for p in dict.fromkeys(first)])
    tasks = TaskSource(cfg, seed=0, eval_cfg=EvalConfig(suites=["private"], private={"mine": private}))
    assert set(tasks.eval_sets) == {"heldout/all", "private/mine"}
    train = tasks.next_batch(30)
    assert not {p.prompt for p in train} & set(first)
    assert tasks.skipped >= 30
    assert [p.bucket for p in tasks.private["mine"]] == ["private/mine"] * len(set(first))


def test_mined_records_are_scored_by_the_task_verifier(tmp_path):
    """A record carrying its reasoning-gym entry is judged by the task's verifier (binary reward
    over reasoning-gym's score), not by text match."""
    source = TaskSource(TaskConfig(config=SPACE, render="expression", eval_size=4), seed=0)
    p = source.next_batch(1)[0]
    file = _write(tmp_path / "m.jsonl", [{"prompt": p.prompt, "answer": p.answer, "entry": p.entry}])
    tasks = TaskSource(TaskConfig(config=SPACE, render="expression", eval_size=4, files={"m": file}), seed=0)
    mined = tasks._problem(0, tasks.train["m"][0], "m")
    assert mined.prompt == p.prompt and mined.entry["metadata"]["task_entry"] == json.loads(json.dumps(p.entry))
    assert tasks.verify(mined, p.answer).reward == 1.0 and tasks.verify(mined, p.answer + "0").reward == 0.0


def test_config_names_the_bad_file_and_checks_the_mix(tmp_path):
    from rl.config import ConfigError

    good = _write(tmp_path / "ok.jsonl", [{"prompt": "1 + 1", "answer": "2"}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match=r"task.files.m: .*bad.jsonl:1: missing 'answer'"):
        load_config("experiments/default", [f"task.files.m={bad}"])
    with pytest.raises(ConfigError, match=r"task.mix names \['nope'\]"):
        load_config("experiments/default", [f"task.files.m={good}", "task.mix.nope=1"])
    with pytest.raises(ConfigError, match="eval.suites lists 'private' but eval.private names no set"):
        load_config("experiments/default", ["eval.suites=[private]"])
    with pytest.raises(ConfigError, match="eval.suites="):
        load_config("experiments/default", ["eval.suites=[nope]"])
    cfg = load_config("experiments/default", [f"task.files.m={good}", "task.mix={all: 1, m: 0.5}"])
    assert cfg.task.files == {"m": good} and cfg.task.mix == {"all": 1.0, "m": 0.5}


def test_a_run_refuses_planted_problems_logs_them_and_reports_every_suite(tmp_path, capsys):
    """A real single-process run: a training file with planted held-out prompts and a private set
    that the generator would draw; the refusals are counted and logged, every problem is in
    problems.jsonl, eval_sets.json holds the hashes, and all four suites report."""
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    base = load_config("experiments/default", TINY)
    plain = TaskSource(base.task, base.seed)
    held = [{"prompt": p.prompt, "answer": p.answer} for p in plain.eval_problems[:3]]
    drawn = [p.prompt for p in plain.next_batch(12)]
    mined = _write(tmp_path / "mined.jsonl", held + [{"prompt": "1 + 1", "answer": "2"}, {"prompt": "2 + 2", "answer": "4"}])
    private = _write(tmp_path / "private.jsonl", [{"prompt": p, "answer": "0"} for p in dict.fromkeys(drawn)])
    cfg = load_config("experiments/default", TINY + [
        f"output_dir={tmp_path / 'runs'}", "run_name=c", "warmstart.steps=0", "trainer.steps=2", "trainer.eval_every=2",
        f"task.files.mined={mined}", "task.mix={all: 1, mined: 1}", f"eval.private.drawn={private}",
        "eval.suites=[heldout,hinted,private,behaviour]"])
    run_dir = resolve_run_dir(cfg)
    tr = Trainer(cfg, run_dir)
    assert "task.files.mined: 3 problem(s) are in an eval set" in capsys.readouterr().out
    final = tr.train()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert sum(r.get("data/refused_eval_overlap", 0) for r in rows) >= 1
    problems = [json.loads(line) for line in (run_dir / "problems.jsonl").open()]
    assert len(problems) == 2 * cfg.rollout.prompts_per_step
    assert {p["bucket"] for p in problems} <= {"all", "mined"}
    for p in problems:
        assert len(p["rewards"]) == len(p["attempts"]) == len(p["hints"]) == cfg.rollout.attempts_per_prompt
        assert p["hash"] == prompt_hash(p["prompt"]) and p["prompt"] not in drawn
    sets = json.loads((run_dir / "eval_sets.json").read_text())
    assert set(sets) == {"heldout/all", "private/drawn"} and len(sets["heldout/all"]) == cfg.task.eval_size
    for key in ("eval/accuracy", "eval/teacher_gap", "eval/private/drawn/accuracy", "eval/behaviour/format_ok",
                "eval/behaviour/eos_rate", "eval/behaviour/hint_echo", "eval/behaviour/answer_tokens"):
        assert key in final, key
    assert 0.0 <= final["eval/behaviour/format_ok"] <= 1.0


def test_a_training_file_wholly_inside_the_eval_sets_is_one_error_line(tmp_path, capsys):
    from rl.train import main

    plain = TaskSource(load_config("experiments/default", TINY).task, 0)
    only_held = _write(tmp_path / "held.jsonl", [{"prompt": p.prompt, "answer": p.answer} for p in plain.eval_problems[:4]])
    code = main(["experiments/default", *TINY, f"output_dir={tmp_path / 'runs'}", f"task.files.mined={only_held}",
                 "task.mix={all: 1, mined: 1}"])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("task error: task.files.mined=")
    assert "nothing is left to train on" in err
