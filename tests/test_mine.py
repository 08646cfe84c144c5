"""rl.mine: run logs -> the problems solved only sometimes, as a problem file (re-measured with a
checkpoint on request); rl.load_policy: a run, checkpoint or export folder -> the same policy."""
import json
import os
import shutil

import pytest
import torch

from conftest import ROOT, TINY
from rl.contamination import prompt_hash
from rl.jsonl_task import load_problems
from rl.mine import main as mine_main
from student.tokenizer import ByteTokenizer


def entry(prompt, answer):
    a, op, b = prompt.split()
    return {"question": f"Calculate {a} {op} {b}.", "answer": answer,
            "metadata": {"source_dataset": "basic_arithmetic", "expression": prompt}}


def problem_line(step, prompt, answer, rewards, hints=None, bucket="all"):
    n = len(rewards)
    attempts = [answer if r >= 1 else f"x{i}" for i, r in enumerate(rewards)]
    return {"step": step, "prompt": prompt, "answer": answer, "bucket": bucket, "hash": prompt_hash(prompt),
            "entry": entry(" ".join(prompt.split()), answer), "rewards": rewards, "attempts": attempts,
            "feedback": ["correct" if r >= 1 else "incorrect" for r in rewards],
            "hints": hints or [None] * n}


def write_jsonl(path, records, tail=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def run_with_problems(tmp_path):
    run = tmp_path / "runA"
    write_jsonl(run / "problems.jsonl", [
        problem_line(1, "1 + 1", "2", [1.0, 0.0, 0.0, 0.0], hints=[None, "starts with 2", "starts with 2", None]),
        problem_line(1, "2 + 2", "4", [1.0, 1.0, 1.0, 1.0]),                 # always solved: dropped
        problem_line(1, "3 + 3", "6", [0.0, 0.0, 0.75, 0.0]),                # partial credit is not solved
        problem_line(1, "9 + 0", "9", [1.0, 0.0]),                           # only before --since-step 2
        problem_line(2, "4 + 4", "8", [0.0, 1.0], hints=["ends with 8", None]),
        problem_line(3, "1 + 1", "2", [1.0, 1.0, 0.0, 0.0], hints=[None, None, "starts with 2", "is even"]),
        problem_line(3, "4  +  4 ", "8", [0.0, 0.0], bucket="all"),           # the same problem, other spacing
        problem_line(3, "5 + 5", "10", [0.0], bucket="hard"),
    ], tail='{"step": 4, "prompt": "cut sh')                                  # a kill mid-write
    return run


def test_mine_problems_log_keeps_the_sometimes_solved(run_with_problems, tmp_path, capsys):
    out = tmp_path / "mined.jsonl"
    assert mine_main([str(run_with_problems), "--out", str(out)]) == 0
    records = read_jsonl(out)
    # 4 + 4: 1 of 4 over two spellings (one hash); 1 + 1: 3 of 8 over steps 1 and 3; 9 + 0: 1 of 2.
    assert [(r["prompt"], r["pass_rate"], r["n_attempts"], r["n_solved"]) for r in records] == [
        ("4 + 4", 0.25, 4, 1), ("1 + 1", 0.375, 8, 3), ("9 + 0", 0.5, 2, 1)]
    one = records[1]
    assert one["answer"] == "2" and one["bucket"] == "all" and one["hash"] == prompt_hash("1 + 1")
    assert one["hints"] == ["starts with 2", "is even"]
    assert one["steps"] == [1, 3] and one["mined_from"] == [str(run_with_problems)]
    assert one["entry"] == entry("1 + 1", "2")
    failed = [a for a in one["attempts"] if a["reward"] < 1]
    assert failed[0] == {"text": "x1", "reward": 0.0, "feedback": "incorrect", "hint": "starts with 2", "count": 1}
    assert [(a["text"], a["hint"], a["count"]) for a in failed[1:]] == [
        ("x2", "starts with 2", 2), ("x3", None, 1), ("x3", "is even", 1)]
    assert [a["text"] for a in one["attempts"] if a["reward"] >= 1] == ["2"]     # distinct, with its count
    assert sum(a["count"] for a in one["attempts"]) == 8
    # The task format: loads as task.source=jsonl, extra fields and all.
    problems = load_problems(out)
    assert [p["prompt"] for p in problems] == ["4 + 4", "1 + 1", "9 + 0"]
    text = capsys.readouterr().out
    assert "problems seen: 6" in text and "kept: 3" in text and "wrote 3 problems" in text

    # --include-unsolved adds pass rate 0 (3 + 3 with its 0.75, 5 + 5 of bucket hard); --since-step and
    # --min-attempts narrow the candidates.
    assert mine_main([str(run_with_problems), "--out", str(out), "--include-unsolved"]) == 0
    assert [(r["prompt"], r["pass_rate"]) for r in read_jsonl(out)] == [
        ("3 + 3", 0.0), ("5 + 5", 0.0), ("4 + 4", 0.25), ("1 + 1", 0.375), ("9 + 0", 0.5)]
    assert mine_main([str(run_with_problems), "--out", str(out), "--include-unsolved", "--since-step", "2",
                      "--min-attempts", "2"]) == 0
    assert [(r["prompt"], r["n_attempts"], r["steps"]) for r in read_jsonl(out)] == [
        ("4 + 4", 4, [2, 3]), ("1 + 1", 4, [3])]


def test_mined_file_trains_and_verifies_as_a_jsonl_task(run_with_problems, tmp_path):
    from rl.configure import load_config
    from rl.tasks import TaskSource

    out = tmp_path / "mined.jsonl"
    assert mine_main([str(run_with_problems), "--out", str(out)]) == 0
    cfg = load_config(ROOT / "experiments" / "default",
                      ["task.source=jsonl", f"task.path={out}", "task.render=question", "task.eval_size=1"])
    tasks = TaskSource(cfg.task, cfg.seed)
    problem = tasks.eval_problems[0]
    assert tasks.verify(problem, problem.answer).reward == 1.0
    assert tasks.verify(problem, "nope").reward == 0.0
    # ... and as a weighted training source of a reasoning-gym run, scored by the task's own verifier
    cfg = load_config(ROOT / "experiments" / "default", TINY + [f"task.files.mined={out}", "task.mix.mined=1"])
    tasks = TaskSource(cfg.task, cfg.seed)
    drawn = tasks.next_batch(3)
    assert sorted(p.prompt for p in drawn) == ["1 + 1", "4 + 4", "9 + 0"]
    for p in drawn:
        assert tasks.verify(p, p.answer).reward == 1.0 and tasks.verify(p, p.answer + "0").reward == 0.0


def test_mine_falls_back_to_rollouts_log_and_merges_runs(run_with_problems, tmp_path, capsys):
    old = tmp_path / "runB"
    rows = [{"step": 5, "prompt": "1 + 1", "answer": "2", "attempt": "2", "reward": 1.0, "feedback": "correct",
             "hint": None},
            {"step": 5, "prompt": "1 + 1", "answer": "2", "attempt": "3", "reward": 0.0, "feedback": "incorrect",
             "hint": "starts with 2", "source": "rollout"},
            # a row a method added (a corrected attempt): not an attempt of the policy's
            {"step": 5, "prompt": "1 + 1", "answer": "2", "attempt": "2", "reward": 1.0, "feedback": "correct",
             "hint": "starts with 2", "source": "corrected"},
            {"step": 5, "prompt": "7 - 2", "answer": "5", "attempt": "4", "reward": 0.0, "feedback": "incorrect",
             "hint": "odd"},
            {"step": 6, "prompt": "7 - 2", "answer": "5", "attempt": "5", "reward": 1.0, "feedback": "correct",
             "hint": None}]
    write_jsonl(old / "rollouts.jsonl", rows)
    out = tmp_path / "mined.jsonl"
    assert mine_main([str(old), "--out", str(out)]) == 0
    assert "holds only a sample" in capsys.readouterr().err
    records = read_jsonl(out)
    assert [(r["prompt"], r["pass_rate"], r["n_attempts"], r["hints"]) for r in records] == [
        ("1 + 1", 0.5, 2, ["starts with 2"]), ("7 - 2", 0.5, 2, ["odd"])]
    assert all("entry" not in r and "bucket" not in r for r in records)     # rollouts.jsonl logs neither
    load_problems(out)

    # Two runs: one problem aggregated over both, named by both.
    assert mine_main([str(run_with_problems), str(old), "--out", str(out)]) == 0
    one = next(r for r in read_jsonl(out) if r["prompt"] == "1 + 1")
    assert (one["n_attempts"], one["n_solved"], one["steps"]) == (10, 4, [1, 3, 5])
    assert one["mined_from"] == [str(run_with_problems), str(old)]
    assert one["entry"] == entry("1 + 1", "2") and one["bucket"] == "all"


def test_mine_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "mined.jsonl"
    assert mine_main([str(tmp_path / "empty"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "problems.jsonl" in err and "rollouts.jsonl" in err and "empty" in err
    assert not out.exists()
    bad = tmp_path / "bad"
    write_jsonl(bad / "problems.jsonl", [problem_line(1, "1 + 1", "2", [1.0, 0.0])], tail="not json\n")
    (bad / "problems.jsonl").write_text((bad / "problems.jsonl").read_text() + json.dumps(
        problem_line(2, "1 + 1", "2", [0.0])) + "\n")
    assert mine_main([str(bad), "--out", str(out)]) == 2
    assert "problems.jsonl:2: not JSON" in capsys.readouterr().err
    write_jsonl(bad / "problems.jsonl", [{"step": 1, "prompt": "1 + 1", "answer": "2", "rewards": ["a"]}])
    assert mine_main([str(bad), "--out", str(out)]) == 2
    assert "'rewards' must be a list of numbers" in capsys.readouterr().err


def test_mine_unwraps_the_task_entry_of_a_problem_file(tmp_path, capsys):
    """A run that trained on a mined file (task.files) logs the file's entry, the task entry inside
    it; mining it again writes the task entry itself, so the task's verifier still scores it."""
    line = problem_line(7, "6 - 1", "5", [1.0, 0.0], bucket="mined")
    line["entry"] = {"question": "6 - 1", "answer": "5",
                     "metadata": {"source_dataset": "jsonl", "line": 3, "task_entry": entry("6 - 1", "5")}}
    write_jsonl(tmp_path / "run" / "problems.jsonl", [line])
    out = tmp_path / "mined.jsonl"
    assert mine_main([str(tmp_path / "run"), "--out", str(out)]) == 0
    [rec] = read_jsonl(out)
    assert rec["entry"] == entry("6 - 1", "5") and rec["bucket"] == "mined"


class ScriptedPolicy:
    """Stands in for the model only: answers the problem right in the first `right[prompt]` of its K
    samples, wrong in the rest. Everything else (episodes, environment, verifier) is real."""

    def __init__(self, right, samples):
        self.right, self.samples, self.calls = right, samples, []
        self.tok = ByteTokenizer()

    def generate(self, prompts, sampling, turns):
        from student.policy import Rollout, Routes
        self.calls.append(len(prompts))
        rows = []
        for i, problem in enumerate(turns.problems):
            text = problem.answer if i % self.samples < self.right[problem.prompt] else "0.5"
            ids = self.tok.encode(text)[:sampling.max_new_tokens - 1] + [self.tok.eos_id]
            assert turns.after_message(i, ids, True) is None         # one message, then the episode is over
            rows.append(ids)
        width = max(map(len, rows))
        ids_NC = torch.tensor([r + [self.tok.pad_id] * (width - len(r)) for r in rows])
        mask = ids_NC != self.tok.pad_id
        return Rollout(prompts, ids_NC, mask, torch.zeros(ids_NC.shape), Routes(torch.zeros(0), [], []))


def test_remeasure_replaces_the_logged_rates(run_with_problems, tmp_path):
    from rl.configure import load_config
    from rl.load_policy import Loaded
    from rl.mine import mine, remeasure, select

    cfg = load_config(ROOT / "experiments" / "default", TINY)
    samples = 5
    candidates, _, _ = mine([run_with_problems])
    # now: "2 + 2" (logged 1.0) solved 3 of 5; "1 + 1" (logged 3/8) 0 of 5; "3 + 3" (logged 0) 5 of 5
    right = {"2 + 2": 3, "1 + 1": 0, "3 + 3": 5, "4 + 4": 1, "9 + 0": 4, "5 + 5": 2}
    policy = ScriptedPolicy(right, samples)
    loaded = Loaded(policy, cfg, ByteTokenizer(), None, "scripted")
    remeasure(candidates, loaded, samples, seed=0, batch_rows=12, progress=False)
    assert policy.calls == [10, 10, 10]                   # 2 problems (of 5 samples) a batch
    by_prompt = {r["prompt"]: r for r in candidates}
    for prompt, k in right.items():
        r = by_prompt[prompt]
        assert (r["pass_rate"], r["n_attempts"], r["n_solved"]) == (k / samples, samples, k)
        assert r["remeasured"]["samples"] == samples and r["remeasured"]["policy"] == "scripted"
    assert by_prompt["2 + 2"]["logged_pass_rate"] == 1.0 and by_prompt["1 + 1"]["logged_pass_rate"] == 0.375
    # the filter reads the re-measured rates
    assert [r["prompt"] for r in select(candidates, False)] == ["4 + 4", "5 + 5", "2 + 2", "9 + 0"]
    fails = by_prompt["2 + 2"]["remeasured_attempts"]
    assert fails[0] == {"text": "0.5", "reward": 0.0, "feedback": fails[0]["feedback"], "count": 2}


def test_load_policy_errors_name_the_path(tmp_path):
    from rl.checkpoint import MANIFEST
    from rl.config import to_yaml
    from rl.configure import load_config
    from rl.load_policy import PolicyLoadError, load_policy

    with pytest.raises(PolicyLoadError, match="no such folder"):
        load_policy(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PolicyLoadError, match=r"empty: not a run folder"):
        load_policy(tmp_path / "empty")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_config(ROOT / "experiments" / "default", TINY)))
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(PolicyLoadError, match="no complete checkpoint"):
        load_policy(run)
    ckpt = run / "checkpoints" / "step_0000002"
    ckpt.mkdir(parents=True)
    (ckpt / "weights.pt").write_bytes(b"x" * 10)
    (ckpt / MANIFEST).write_text(json.dumps({"step": 2, "files": {"weights.pt": {"bytes": 9, "blake2b": "0"}}}))
    with pytest.raises(PolicyLoadError, match="step_0000002: weights.pt has 10 bytes"):
        load_policy(run)
    with pytest.raises(PolicyLoadError, match="does not verify"):
        load_policy(ckpt)
    export = tmp_path / "hf"
    export.mkdir()
    (export / "config.json").write_text("{}")
    with pytest.raises(PolicyLoadError, match="hintrl_config.yaml"):
        load_policy(export)


# ---------------------------------------------------------------------- a real run (slow)
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run of experiments/default: 3 RL steps, a checkpoint at the last, in this process."""
    from rl.configure import load_config
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    saved = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    out = tmp_path_factory.mktemp("mine")
    cfg = load_config(ROOT / "experiments" / "default", TINY + [
        f"output_dir={out / 'runs'}", "warmstart.steps=0", "trainer.steps=3", "task.eval_size=8",
        "rollout.prompts_per_step=2", "trainer.checkpoint_every=3", "trainer.eval_every=100"])
    trainer = Trainer(cfg, resolve_run_dir(cfg))
    trainer.train()
    yield trainer
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.mark.slow
def test_mine_remeasures_a_real_run(trained, tmp_path, capsys):
    run, samples = trained.run_dir, 4
    assert (run / "problems.jsonl").is_file()           # the trainer's per-problem log
    out = tmp_path / "mined.jsonl"
    args = [str(run), "--out", str(out), "--include-unsolved", "--remeasure", str(run), "--samples", str(samples),
            "--batch-size", "8"]
    assert mine_main(args) == 0
    assert "re-measured with checkpoint" in capsys.readouterr().out
    records = read_jsonl(out)
    logged = read_jsonl(run / "problems.jsonl")
    assert {r["hash"] for r in records} <= {prompt_hash(r["prompt"]) for r in logged}
    assert records, "a 3-step run of an untrained student solves (nearly) nothing: every problem is kept"
    for r in records:
        assert r["n_attempts"] == samples and r["pass_rate"] == r["n_solved"] / samples < 1.0
        assert len(r["remeasured_attempts"]) >= 1 and r["logged_n_attempts"] >= 4
        assert r["remeasured"]["temperature"] == trained.cfg.rollout.temperature
        assert r["remeasured"]["max_new_tokens"] == trained.cfg.rollout.max_new_tokens
    assert [p["prompt"] for p in load_problems(out)] == [r["prompt"] for r in records]
    # Seeded: the same command gives the same file; the checkpoint is read in place (no export written).
    first = out.read_text()
    assert mine_main(args) == 0
    assert out.read_text() == first and not (run / "exports").exists()


@pytest.mark.slow
def test_load_policy_run_checkpoint_and_export_generate_alike(trained, tmp_path):
    from rl.export import export
    from rl.load_policy import EXPORT_CONFIG, PolicyLoadError, load_policy
    from student.policy import Sampling

    tok = ByteTokenizer()
    prompts = [tok.render_prompt(p) for p in ["3 + 4", "12 - 7", "9 + 9", "50 - 1"]]
    greedy = Sampling(max_new_tokens=6, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)

    def generations(policy):
        with torch.no_grad():
            return policy.generate(prompts, greedy).completion_ids_NC.tolist()

    trained.rollout.module.eval()
    expected = generations(trained.policy)                      # the trainer's own model, its last step
    run = trained.run_dir
    from_run = load_policy(run)
    assert from_run.cfg.rollout == trained.cfg.rollout and not from_run.model.training
    assert generations(from_run.policy) == expected
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():       # the same weights: the same logits, not merely the same argmax
        torch.testing.assert_close(from_run.model(ids).logits, trained.model(ids).logits, rtol=1e-4, atol=1e-5)
    assert generations(load_policy(run / "checkpoints" / "step_0000003").policy) == expected
    hf = export(run, tmp_path / "hf")
    assert (hf / EXPORT_CONFIG).is_file()                       # the run's config, beside the weights
    from_export = load_policy(hf)
    assert generations(from_export.policy) == expected and from_export.cfg.rollout == trained.cfg.rollout
    experiment = ROOT / "experiments" / "default"
    # an export of an older hintrl, without its config: the experiment is needed
    old = tmp_path / "hf_old"
    shutil.copytree(hf, old)
    (old / EXPORT_CONFIG).unlink(missing_ok=True)
    with pytest.raises(PolicyLoadError, match=f"{old}: an export folder without"):
        load_policy(old)
    loaded = load_policy(old, experiment, TINY)
    assert generations(loaded.policy) == expected and "experiment" in loaded.description
