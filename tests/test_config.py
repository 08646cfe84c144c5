import re
from pathlib import Path

import pytest

from rl.config import ConfigError, to_yaml
from rl.configure import load_config

from conftest import ROOT


def write(tmp_path, text):
    (tmp_path / "config.yaml").write_text(text)
    return tmp_path


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*/config.yaml")),
                         ids=lambda p: p.parent.name)
def test_every_experiment_loads(path):
    assert (path.parent / "README.md").is_file(), "an experiment folder needs its README.md"
    try:
        cfg = load_config(path.parent)
    except ConfigError as err:
        # Only an experiment that distils from another's exported model may fail, before that
        # model exists, and it must say where to get it.
        assert "method.teacher_path" in str(err) and "scripts/train.sh experiments/teacher" in str(err), err
        return
    assert cfg.experiment == path.parent.name


def test_override_wins_over_yaml_and_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "trainer:\n  steps: 7\n"), ["trainer.lr=0.5"])
    assert (cfg.trainer.steps, cfg.trainer.lr, cfg.trainer.eval_every) == (7, 0.5, 50)


def test_unknown_key_in_yaml_names_file_and_key(tmp_path):
    with pytest.raises(ConfigError, match=r"config.yaml: unknown key 'trainer.stepz'"):
        load_config(write(tmp_path, "trainer:\n  stepz: 3\n"))


def test_unknown_key_on_command_line(tmp_path):
    with pytest.raises(ConfigError, match=r"command line .*unknown key 'method.nmae'"):
        load_config(write(tmp_path, ""), ["method.nmae=grpo"])


def test_wrong_type_names_key(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'trainer.steps'.*'abc'"):
        load_config(write(tmp_path, "trainer:\n  steps: abc\n"))


def test_malformed_yaml_names_file_and_line(tmp_path):
    with pytest.raises(ConfigError, match=r"config.yaml: line \d+, column \d+ malformed YAML"):
        load_config(write(tmp_path, "trainer:\n  steps: [1, 2\n"))


def test_registry_names_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"method.name='ppo'.*grpo.*hint_distill"):
        load_config(write(tmp_path, ""), ["method.name=ppo"])
    with pytest.raises(ConfigError, match=r"rollout.engine='sglang'.*local.*vllm"):
        load_config(write(tmp_path, ""), ["rollout.engine=sglang"])
    with pytest.raises(ConfigError, match=r"task.name='no_such_task'"):
        load_config(write(tmp_path, ""), ["task.name=no_such_task"])
    with pytest.raises(ConfigError, match=r"task.config: .*'digits'"):
        load_config(write(tmp_path, "task:\n  config:\n    digits: 3\n"))


def test_a_family_is_refused_a_path_its_registry_entry_does_not_offer(tmp_path):
    """student/model.py's STUDENT_FAMILIES says what each family runs on; the config asks nothing
    else (olmoe through vLLM samples another distribution: its logits differ by nats)."""
    from student import STUDENT_FAMILIES

    assert not STUDENT_FAMILIES["olmoe"].vllm
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm serves the families \['mixtral', 'qwen2_moe', "
                                          r"'qwen3_moe'\], and student.arch=olmoe: use rollout.engine=local"):
        load_config(write(tmp_path, ""), ["student.arch=olmoe", "student.hidden_size=64", "rollout.engine=vllm"])
    load_config(write(tmp_path, ""), ["student.arch=qwen2_moe", "rollout.engine=vllm"])
    load_config(write(tmp_path, ""), ["student.arch=olmoe", "student.hidden_size=64",
                                      "deepspeed.expert_parallel_size=2", "deepspeed.zero_stage=2",
                                      "launcher.nproc_per_node=2"])


def test_a_family_registered_without_expert_parallelism_is_refused_sharded_experts(tmp_path, monkeypatch):
    """Every family here shards its experts; one registered from outside (as a researcher adds a
    family) may not, and then deepspeed.expert_parallel_size > 1 is refused by name."""
    from dataclasses import replace

    from student import STUDENT_FAMILIES

    monkeypatch.setattr(STUDENT_FAMILIES, "_entries", dict(STUDENT_FAMILIES._entries))  # undone after
    STUDENT_FAMILIES.register("mixtral_unsharded", replace(STUDENT_FAMILIES["mixtral"], expert_parallel=False))
    sharded = ["deepspeed.expert_parallel_size=2", "deepspeed.zero_stage=2", "launcher.nproc_per_node=2"]
    with pytest.raises(ConfigError, match=r"deepspeed.expert_parallel_size=2: student.arch=mixtral_unsharded, "
                                          r"whose experts are not sharded; set it to 1"):
        load_config(write(tmp_path, ""), ["student.arch=mixtral_unsharded", *sharded])
    load_config(write(tmp_path, ""), ["student.arch=mixtral_unsharded"])
    load_config(write(tmp_path, ""), ["student.arch=mixtral", *sharded])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(ROOT / "experiments/default", ["seed=3"])
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    assert load_config(tmp_path) == cfg


def test_cli_stops_before_any_work_with_one_clear_line(tmp_path, capsys):
    # In-process: `python -m rl.train` is `sys.exit(main())`, and a config error returns before the
    # trainer (or anything heavy) is imported.
    from rl.train import main

    assert main([str(ROOT / "experiments/default"), "trainer.stepz=1", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "config error: command line 'trainer.stepz=1': unknown key 'trainer.stepz'"
    assert not any(Path(tmp_path).iterdir())


def test_cli_refuses_a_launcher_rank_count_other_than_the_configs(tmp_path, capsys, monkeypatch):
    # What a rank sees when torchrun started 2 of them for a one-rank config (the launcher sets
    # LOCAL_RANK and WORLD_SIZE): a config error before any work, not a hang in the process group.
    from rl.train import main

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([str(ROOT / "experiments/default"), f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("config error: the launcher started 2 ranks but launcher.nproc_per_node x "
                           "launcher.nnodes = 1; set them to match")
    assert not any(Path(tmp_path).iterdir())


@pytest.mark.parametrize("overrides, needle", [
    (["launcher.nproc_per_node=3"], "rollout.prompts_per_step=16 must be divisible by the number of ranks (3"),
    (["launcher.nproc_per_node=2", "deepspeed.expert_parallel_size=2"], "zero_stage 1 or 2"),
    (["launcher.nproc_per_node=2", "deepspeed.zero_stage=2", "deepspeed.expert_parallel_size=3"],
     "expert_parallel_size=3 must divide"),
    (["deepspeed.offload_param=true", "deepspeed.zero_stage=2"], "offload_param needs deepspeed.zero_stage=3"),
    (["launcher.nnodes=2"], "launcher.master_port"),
    (["deepspeed.stage3_max_live_parameters=1"], "unknown key 'deepspeed.stage3_max_live_parameters'"),
])
def test_scale_settings_are_checked(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config("experiments/default", overrides)


def test_text_overrides_stay_text():
    cfg = load_config("experiments/default", ["run_name=off", "output_dir=yes"])
    assert (cfg.run_name, cfg.output_dir) == ("off", "yes")


def test_base_experiment_is_merged_first(tmp_path):
    (tmp_path / "parent").mkdir()
    (tmp_path / "child").mkdir()
    (tmp_path / "parent" / "config.yaml").write_text("trainer:\n  steps: 7\n  lr: 0.5\n")
    (tmp_path / "child" / "config.yaml").write_text("base: ../parent\ntrainer:\n  lr: 0.25\n")
    cfg = load_config(tmp_path / "child")
    assert (cfg.trainer.steps, cfg.trainer.lr, cfg.experiment) == (7, 0.25, "child")
    (tmp_path / "parent" / "config.yaml").write_text("base: ../child\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_config(tmp_path / "child")
    (tmp_path / "parent" / "config.yaml").write_text("trainer:\n  stepz: 1\n")
    with pytest.raises(ConfigError, match=r"parent/config.yaml: unknown key 'trainer.stepz'"):
        load_config(tmp_path / "child")


@pytest.mark.parametrize("override, message", [
    ("task.buckets={hard: {min_digits: 0}}", "task.buckets.hard: min_digits must be positive"),
    ("task.mix={nope: 1}", "task.mix names ['nope']"),
    ("warmstart.mix={all: -1}", "weights must be >= 0"),
    ("task.buckets={hard: 3}", "task.buckets.hard must be a mapping"),
])
def test_bad_buckets_and_mixes_name_the_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("experiments/default", [override])


def test_a_layer_replaces_buckets_and_mixes_whole(tmp_path):
    (tmp_path / "config.yaml").write_text(f"base: {ROOT / 'experiments/repro-guide'}\nwarmstart:\n  mix: {{hard: 1}}\n")
    cfg = load_config(tmp_path, ["task.mix={easy: 2}"])
    assert cfg.warmstart.mix == {"hard": 1} and cfg.task.mix == {"easy": 2}
    assert set(cfg.task.buckets) == {"easy", "hard"}          # untouched where no layer sets it


@pytest.mark.parametrize("override, message", [
    ("task.environment=nope", "task.environment='nope' is not valid"),
    ("task.environment=calculator", "task.environment=calculator reads task.name=chain_sum with task.render=expression"),
    ("task.environment=chain", "task.environment=chain reads task.name=chain_sum"),
    ("rollout.max_turns=0", "rollout.max_turns must be positive"),
])
def test_an_environment_that_cannot_read_the_task_is_named(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("experiments/default", [override])


def test_the_chained_stages_load(tmp_path):
    """experiments/model-chain's stages are configs of their own (chain.py launches them); stage 2
    names stage 1's export, here any model folder."""
    large = load_config(ROOT / "experiments" / "model-chain" / "large")
    assert (large.experiment, large.trainer.export_to, large.student.hidden_size) == ("model-chain-large", "export", 192)
    (tmp_path / "config.json").write_text("{}")
    small = load_config(ROOT / "experiments" / "model-chain" / "small", [f"method.teacher_path={tmp_path}"])
    assert (small.experiment, small.method.name, small.student.hidden_size) == ("model-chain-small", "teacher_distill", 128)
    with pytest.raises(ConfigError, match="method.teacher_path is required"):
        load_config(ROOT / "experiments" / "model-chain" / "small")


def test_a_checkpoint_brings_its_own_shape_and_a_contradicting_knob_is_refused(tmp_path):
    """student.checkpoint's config.json sets the family and the sizes: a knob set to another value
    is refused by name, one equal to the checkpoint's (a run re-trained from its own export) is not."""
    import json

    from rl.config import ConfigError
    from rl.configure import load_config

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
                                                    "num_local_experts": 4, "intermediate_size": 32}))
    load_config(None, [f"student.checkpoint={folder}", "student.hidden_size=64", "student.num_layers=2"])
    with pytest.raises(ConfigError, match=r"student.hidden_size=96 but the checkpoint's hidden_size is 64"):
        load_config(None, [f"student.checkpoint={folder}", "student.hidden_size=96"])
    with pytest.raises(ConfigError, match=r"student.arch=olmoe but student.checkpoint is a mixtral model"):
        load_config(None, [f"student.checkpoint={folder}", "student.arch=olmoe"])
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ConfigError, match=r"is a 'llama' model; a student is one of the registered MoE families"):
        load_config(None, [f"student.checkpoint={folder}"])
    with pytest.raises(ConfigError, match=r"no readable config.json"):
        load_config(None, [f"student.checkpoint={tmp_path / 'absent'}"])
