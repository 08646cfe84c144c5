"""One reader of the run folder's JSON-lines logs (rl/runlog.py), which every tool uses, so they
agree on a log whose last line is being written or was cut by a kill."""
import json

import pytest

from rl.runlog import LogError, is_run_folder, read_log


def write_run(folder, lines, tail=""):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("seed: 0\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + tail)


def test_a_cut_last_line_is_skipped_and_every_reader_agrees(tmp_path):
    from rl.analysis import load_run
    from rl.runs import _metrics
    from rl.study import metrics_of

    run = tmp_path / "exp" / "run"
    write_run(run, [{"step": 1, "eval/accuracy": 0.5}, {"step": 2, "eval/accuracy": 0.75}], tail='{"step": 3, "ev')
    expected = [{"step": 1, "eval/accuracy": 0.5}, {"step": 2, "eval/accuracy": 0.75}]
    assert read_log(run / "metrics.jsonl") == expected
    assert metrics_of(run) == expected and _metrics(run) == expected
    assert load_run(run).metrics["eval/accuracy"].tolist() == [0.5, 0.75]


def test_a_bad_line_before_the_last_names_its_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(LogError, match=r"metrics.jsonl:2: not JSON"):
        read_log(path)
    path.write_text('{"step": 1}\n[1, 2]\n{"step": 2}\n')
    with pytest.raises(LogError, match=r"metrics.jsonl:2: not a JSON object"):
        read_log(path)
    assert read_log(tmp_path / "absent.jsonl") == []


def test_a_run_folder_is_what_the_trainer_wrote_not_an_experiment_folder(tmp_path):
    run = tmp_path / "run"
    write_run(run, [{"step": 1}])
    experiment = tmp_path / "experiment"
    experiment.mkdir()
    (experiment / "config.yaml").write_text("seed: 0\n")
    checkpointed = tmp_path / "checkpointed"
    (checkpointed / "checkpoints").mkdir(parents=True)
    (checkpointed / "config.yaml").write_text("seed: 0\n")
    assert is_run_folder(run) and is_run_folder(checkpointed) and not is_run_folder(experiment)
