"""The eval registry (rl/evals/) and its command line (rl/eval.py): suites on a real run, its
checkpoint and its export give one report; the behavioural checks on known answers."""
import json

import pytest

from conftest import TINY


def test_behaviour_checks_on_known_answers():
    from rl.evals.behaviour import echoes, in_format

    assert in_format(" 42", "42") and in_format("-7", "-3") and not in_format("42 apples", "42")
    assert not in_format("", "12") and in_format("blue", "red") and not in_format("a\nb", "red")
    assert echoes("ends with 7", "ends with 7", "40 + 97", "137")            # the hint's whole text
    assert echoes("137 ends", "the answer ends in 7", "40 + 97", "137")       # a word of the hint
    assert not echoes("137", "the answer ends in 7", "40 + 97", "137")
    # a word the problem itself uses is not an echo
    assert not echoes("three legs", "count the legs", "How many legs does a stool have?", "three")


def test_listing_hinted_runs_heldout_once():
    from rl.evals import SUITES, suites_to_run

    assert set(SUITES) == {"heldout", "hinted", "private", "behaviour", "reference_logprob"}
    assert suites_to_run(["heldout", "hinted", "behaviour", "heldout"]) == ["hinted", "behaviour"]
    assert suites_to_run(["heldout"]) == ["heldout"]
    with pytest.raises(KeyError, match="eval.suites='nope' is unknown; choose one of"):
        suites_to_run(["nope"])


def test_eval_reports_a_run_and_its_export_alike(tmp_path, capsys):
    """A real run; `python -m rl.eval` on its folder and on its export: the same metrics, and the
    held-out set's hashes are the ones the run refused to train on (eval_sets.json)."""
    from rl.configure import load_config
    from rl.eval import main
    from rl.export import export
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path}", "run_name=r", "warmstart.steps=2",
                                                     "trainer.steps=2", "eval.suites=[heldout,behaviour]"])
    run_dir = resolve_run_dir(cfg)
    final = Trainer(cfg, run_dir).train()
    assert main([str(run_dir), "--out", str(tmp_path / "run.json")]) == 0
    out = export(run_dir, tmp_path / "export")
    assert (out / "hintrl_config.yaml").is_file()
    capsys.readouterr()
    assert main([str(out), "--suite", "heldout", "--suite", "behaviour", "--json", "--out", str(tmp_path / "exp.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    run, exported = (json.loads((tmp_path / f).read_text()) for f in ("run.json", "exp.json"))
    assert printed == exported
    for report in (run, exported):
        assert set(report["suites"]) == {"heldout", "behaviour"}
        # the trainer's last evaluation saw the same weights: the same numbers
        for key, value in report["suites"]["heldout"]["metrics"].items():
            assert value == pytest.approx(final[key]), key
    assert run["suites"]["behaviour"]["metrics"] == exported["suites"]["behaviour"]["metrics"]
    sets = json.loads((run_dir / "eval_sets.json").read_text())
    assert run["suites"]["heldout"]["sets"]["all"]["hashes"] == sets["heldout/all"]
    assert main([str(out), "--suite", "nope"]) == 2
    assert main([str(tmp_path / "nothing-here"), "--suite", "heldout"]) == 2
    assert "eval error:" in capsys.readouterr().err

