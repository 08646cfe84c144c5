import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a child process needs to import this tree, keeping any PYTHONPATH given (gpu_check.sh's wheels).
CHILD_PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
os.environ.setdefault("DS_ACCELERATOR", "cpu")

# A config small enough that a full run (warm-start + RL + eval + checkpoints) takes seconds.
TINY = [
    "task.eval_size=16", "student.hidden_size=32", "student.num_layers=1", "student.num_heads=2",
    "student.num_kv_heads=1", "student.num_experts=4", "student.expert_width=16",
    "rollout.prompts_per_step=4", "rollout.attempts_per_prompt=4", "rollout.max_new_tokens=4",
    "warmstart.steps=3", "warmstart.batch_size=8", "trainer.steps=4", "trainer.eval_every=2",
    "trainer.checkpoint_every=2", "trainer.threads=1",
]


# A single-process Trainer in the test process sets these for DeepSpeed (rl/engine.py); a CLI run
# started afterwards would inherit them and take itself for a rank of that finished process group.
_PROCESS_GROUP_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _restore_process_group_env():
    saved = {k: os.environ.get(k) for k in _PROCESS_GROUP_ENV}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def tiny_overrides(tmp_path):
    return TINY + [f"output_dir={tmp_path / 'runs'}"]


def run_cli(args, timeout=300):
    """Runs `python -m rl.train` in a fresh process, as scripts/train.sh does."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "rl.train", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def exported_teacher(tmp_path_factory):
    """A model folder in scripts/export.sh's format (transformers' save_pretrained + our tokenizer),
    wider than the TINY student."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl.configure import load_config
    from student.model import model_config
    from student.tokenizer import ByteTokenizer

    out = tmp_path_factory.mktemp("teacher")
    cfg = load_config(ROOT / "experiments" / "default", TINY + ["student.hidden_size=48"])
    tok = ByteTokenizer()
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(model_config(cfg.student, tok)).save_pretrained(out)
    tok.to_transformers().save_pretrained(out)
    return out
