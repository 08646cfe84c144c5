"""Method config sections (typed by method.name) and the step's config checks."""
import pytest

from rl.config import ConfigError
from rl.configure import load_config

from conftest import ROOT

DEFAULT = ROOT / "experiments" / "default"


def test_each_method_has_its_own_keys():
    cfg = load_config(DEFAULT, ["method.name=hint_distill", "method.distill_coef=0.5"])
    assert type(cfg.method).__name__ == "HintDistillConfig" and cfg.method.distill_coef == 0.5
    grpo = load_config(DEFAULT, ["method.name=grpo"])
    assert not hasattr(grpo.method, "distill_coef")
    with pytest.raises(ConfigError, match=r"unknown key 'method.distill_coef'.*method 'grpo' has: "
                                          r"adv_std_norm, clip_eps, loss_norm, name"):
        load_config(DEFAULT, ["method.name=grpo", "method.distill_coef=2"])


def test_a_method_key_in_yaml_is_checked_against_the_method_named_there(tmp_path):
    (tmp_path / "config.yaml").write_text("method:\n  name: grpo\n  distill_kl: forward\n")
    with pytest.raises(ConfigError, match=r"config.yaml: unknown key 'method.distill_kl'"):
        load_config(tmp_path)


def test_switching_method_on_the_command_line_drops_the_other_methods_keys(tmp_path):
    (tmp_path / "config.yaml").write_text("method:\n  name: hint_distill\n  distill_kl: forward\n  clip_eps: 0.3\n")
    cfg = load_config(tmp_path, ["method.name=grpo"])
    assert cfg.method.name == "grpo" and cfg.method.clip_eps == 0.3      # shared keys kept
    back = load_config(tmp_path, ["method.name=grpo", "method.name=hint_distill"])
    assert back.method.distill_kl == "reverse"                            # dropped, then the default


def test_switching_task_starts_from_an_empty_task_config():
    cfg = load_config(DEFAULT, ["task.name=chain_sum"])
    assert cfg.task.name == "chain_sum" and cfg.task.config == {}
    kept = load_config(DEFAULT, ["task.name=chain_sum", "task.config={min_terms: 2, max_terms: 3}"])
    assert kept.task.config == {"min_terms": 2, "max_terms": 3}


@pytest.mark.parametrize("override, message", [
    ("rollout.temperature=0", "rollout.temperature=0.0 must be > 0"),
    ("rollout.attempts_per_prompt=1", "at least 2 attempts per prompt"),
    ("method.loss_norm=sequence", "method.loss_norm='sequence' is not valid"),
    ("method.distill_estimator=topk", "method.distill_estimator='topk' is not valid"),
    ("task.reward=graded", "task.reward='graded' is not valid"),
    ("method.clip_eps=0", "method.clip_eps=0.0 must be > 0"),
])
def test_step_config_checks(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(DEFAULT, [override])


def test_a_group_of_one_is_fine_without_rl_steps():
    assert load_config(DEFAULT, ["rollout.attempts_per_prompt=1", "trainer.steps=0"]).rollout.attempts_per_prompt == 1
