"""rl/sweep.py: tokens to a fraction of the oracle's accuracy, across study folders, censored
where a seed never gets there."""
import json
from pathlib import Path

import pytest

from rl.config import ConfigError
from rl.sweep import BEGIN, END, build, main, markdown

ROOT = Path(__file__).resolve().parents[1]


def _curve(accuracies, per_eval=1000.0):
    return {"step": [100 + 50 * i for i in range(len(accuracies))],
            "generated": [per_eval * i for i in range(len(accuracies))], "hidden": list(accuracies)}


def _study(root: Path, name: str, bits: int, arms: dict) -> None:
    folder = root / name
    folder.mkdir()
    (folder / "config.yaml").write_text(f"base: {ROOT / 'experiments/hidden-rule'}\ntask: {{config: {{rule_bits: {bits}}}}}\n")
    (folder / "study.yaml").write_text("arms: {grpo: [method.name=grpo]}\n")
    (folder / "results").mkdir()
    summary = {"arms": {name: {"final": {"hidden": {"mean": curves[0]["hidden"][-1]}},
                               "curves": {str(s): c for s, c in enumerate(curves)}} for name, curves in arms.items()}}
    (folder / "results" / "summary.json").write_text(json.dumps(summary))


def test_tokens_to_the_target_per_knob_value_with_censored_seeds(tmp_path):
    _study(tmp_path, "bits4", 4, {"oracle": [_curve([0, 1, 1])], "grpo": [_curve([0, 0.95, 1]), _curve([0, 0.5, 0.95])],
                                  "hint": [_curve([0, 1, 1]), _curve([0, 1, 1])]})
    _study(tmp_path, "bits16", 16, {"oracle": [_curve([0, 1, 1])], "grpo": [_curve([0, 0, 0]), _curve([0, 0.95, 1])],
                                    "hint": [_curve([0, 0.5, 1]), _curve([0, 1, 1])]})
    (tmp_path / "bits8").mkdir()              # a study folder not yet summarized
    (tmp_path / "bits8" / "study.yaml").write_text("arms: {grpo: [method.name=grpo]}\n")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("knob: task.config.rule_bits\nbucket: hidden\n"
                                      "target: {arm: oracle, fraction: 0.9}\nfolders: [../bits16, ../bits4, ../bits8]\n")
    (sweep / "README.md").write_text(f"# s\n\n{BEGIN}\n{END}\n")
    result = build(sweep)
    assert [p["value"] for p in result["points"]] == [4, 16] and result["missing"] == ["bits8"]
    low, high = result["points"]
    assert low["target"] == pytest.approx(0.9)
    assert low["arms"]["grpo"]["per_seed"] == {"0": 1000.0, "1": 2000.0} and not low["arms"]["grpo"]["censored"]
    # seed 0 never reaches 0.9: counted at its budget (2000) and censored
    assert high["arms"]["grpo"]["per_seed"] == {"0": 2000.0, "1": 1000.0} and high["arms"]["grpo"]["censored"] == ["0"]
    assert high["arms"]["hint"]["mean"] == pytest.approx(1500.0) and "oracle" not in high["arms"]
    table = markdown(result)
    assert "| `grpo` | 0.002M [" in table and "> 0.002M (1/2)" in table and "Not yet summarized: bits8." in table
    assert main([str(sweep)]) == 0
    assert (sweep / "sweep.png").is_file() and "> 0.002M (1/2)" in (sweep / "README.md").read_text()


def test_a_bad_sweep_file_names_the_key(tmp_path):
    (tmp_path / "sweep.yaml").write_text("knob: x\nbucket: hidden\ntarget: {arm: oracle, fraction: 2}\nfolders: []\n")
    with pytest.raises(ConfigError, match="target is"):
        build(tmp_path)
    (tmp_path / "sweep.yaml").write_text("knob: x\nbucket: hidden\ntarget: {arm: oracle, fraction: 0.9}\n"
                                         "folders: [nowhere]\n")
    with pytest.raises(ConfigError, match="nowhere is not a study folder"):
        build(tmp_path)


def test_the_hidden_rule_sweep_file_loads():
    from rl.sweep import load_sweep
    sweep = load_sweep(ROOT / "experiments/hidden-rule")
    assert [f.name for f in sweep["folders"]] == ["hidden-rule-bits1", "hidden-rule-bits4", "hidden-rule",
                                                "hidden-rule-bits12", "hidden-rule-bits16"]
