"""rl/plan.py against what it plans for: the model states against the tensors real DeepSpeed engines
hold (tests/plan_probe.py, 1 and 2 ranks), the activations against what autograd saves in the real
training forward, and the command's output (the committed plans of experiments/scale regenerate)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import CHILD_PYTHONPATH, ROOT
from rl import plan
from rl.configure import load_config

STATES_TOLERANCE = 0.05        # model states: DeepSpeed pads partitions to alignment
ACTIVATIONS_TOLERANCE = 0.10   # activations: a formula over the lean forward's saved tensors
SCALE = ROOT / "experiments" / "scale" / "qwen3-30b-a3b"


def _probe(overrides: list[str], ranks: int, out_dir) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    script = str(ROOT / "tests" / "plan_probe.py")
    from rl.distributed import free_port

    cmd = ([sys.executable, script, str(out_dir), *overrides] if ranks == 1 else
           [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", f"--master_port={free_port()}",
            script, str(out_dir), *overrides, f"launcher.nproc_per_node={ranks}"])
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))]


def _planned_states(overrides: list[str], world: int) -> tuple[float, float]:
    """(bytes held through the step, bytes at the backward's peak) of the planned model states."""
    cfg = load_config(None, [*overrides, f"launcher.nproc_per_node={world}"])
    lines = plan.model_state_lines(plan.model_shape(cfg), cfg, world, plan.configured_layout(cfg))
    return sum(x.bytes for x in lines if x.held), sum(x.bytes for x in lines)


def _assert_states(overrides: list[str], ranks: int, out_dir) -> None:
    held, in_backward = _planned_states(overrides, ranks)
    measured = _probe(overrides, ranks, out_dir)
    assert len(measured) == ranks
    for rank in measured:
        assert abs(rank["held"] - held) <= STATES_TOLERANCE * held, (rank, held)
        assert abs(rank["in_backward"] - in_backward) <= STATES_TOLERANCE * in_backward, (rank, in_backward)


BF16 = ["deepspeed.dtype=bf16", "student.dtype=bfloat16"]


@pytest.mark.slow     # each builds DeepSpeed in a fresh process: ~13 s
@pytest.mark.parametrize("stage, dtype", [(0, []), (2, []), (3, []), (0, BF16), (2, BF16)],
                         ids=["zero0", "zero2", "zero3", "zero0-bf16", "zero2-bf16"])
def test_the_planned_model_states_are_what_one_ranks_engine_holds(stage, dtype, tmp_path):
    """fp32 ZeRO-0: parameters, gradients and AdamW's moments (16 bytes a parameter); ZeRO-2 adds
    the fp32 master partition and DeepSpeed's reduce bucket (2 GB in fp32, 1 GB in bf16) during the
    backward; ZeRO-3 holds that bucket from the start. bf16: 2-byte parameters and gradients, an
    fp32 master copy at every stage."""
    _assert_states([f"deepspeed.zero_stage={stage}", *dtype], 1, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["deepspeed.zero_stage=2"], ["deepspeed.zero_stage=3"],
                                    ["deepspeed.zero_stage=2", "deepspeed.expert_parallel_size=2"],
                                    ["deepspeed.zero_stage=2", *BF16]],
                         ids=["zero2", "zero3", "zero2-ep2", "zero2-bf16"])
def test_the_planned_model_states_are_what_each_of_two_ranks_holds(layout, tmp_path):
    _assert_states(layout, 2, tmp_path)


def _saved_by_the_training_forward(overrides: list[str], rows: int, prompt: int, completion: int) -> int:
    """Bytes autograd keeps for the backward of the trainer's scoring forward (each storage once,
    the parameters left out: they are the model states)."""
    from student.build import build_policy
    from student.model import build_student, build_tokenizer

    cfg = load_config(None, overrides)
    tok = build_tokenizer(cfg.student)
    torch.manual_seed(0)
    model = build_student(cfg.student, tok)
    policy = build_policy(model, pad_id=tok.pad_id, banned_ids=tok.never_sampled, lean=cfg.student.lean_forward)
    seen, total = {p.untyped_storage().data_ptr() for p in model.parameters()}, 0

    def keep(t):
        nonlocal total
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
        return t

    gen = torch.Generator().manual_seed(1)
    prompts = [[tok.bos_id, *torch.randint(0, 200, (prompt - 1,), generator=gen).tolist()] for _ in range(rows)]
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        policy.score(prompts, torch.randint(0, 200, (rows, completion), generator=gen), router_aux=True)
    return total


@pytest.mark.parametrize("overrides, rows, prompt, completion", [
    ([], 8, 8, 16),
    (["student.arch=mixtral", "student.num_layers=2"], 8, 16, 16),
    (["student.hidden_size=256", "student.num_heads=8", "student.expert_width=128", "student.top_k=4",
      "student.num_experts=16", "student.num_layers=2"], 4, 64, 32),
], ids=["default", "mixtral", "wider-longer"])
def test_the_planned_activations_are_what_the_training_forward_saves(overrides, rows, prompt, completion):
    measured = _saved_by_the_training_forward(overrides, rows, prompt, completion)
    planned = plan.activation_bytes(plan.model_shape(load_config(None, overrides)), rows, prompt, completion, 4)
    assert abs(planned - measured) <= ACTIVATIONS_TOLERANCE * measured, (planned, measured)


def test_the_search_finds_a_layout_that_fits_where_the_configured_one_does_not():
    cfg = load_config(None, [])
    m, world, prompt = plan.model_shape(cfg), 1, 32
    configured = plan.gpu_total(plan.plan_lines(m, cfg, world, plan.configured_layout(cfg), prompt))
    layout, total, fits = plan.cheapest_fit(m, cfg, world, configured / 2, prompt)
    assert fits and total <= configured / 2 and layout.gradient_accumulation_steps > 1
    layout, total, fits = plan.cheapest_fit(m, cfg, world, 1.0, prompt)   # one byte: nothing fits
    assert not fits and total > 1.0


def _plan_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH)
    return subprocess.run([sys.executable, "-m", "rl.plan", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_command_plans_the_default_experiment_and_names_a_bad_gpu(capsys):
    assert plan.main(["experiments/default", "--gpus", "1", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert ": fits" in out and "the configured layout is the cheapest that fits" in out
    with pytest.raises(SystemExit) as stopped:
        plan.main(["experiments/default", "--gpus", "1", "--gpu", "k80"])
    assert stopped.value.code == 2 and "--gpu 'k80' is unknown; choose one of" in capsys.readouterr().err


@pytest.mark.slow     # ~8 s each: a 30B model built on the meta device
@pytest.mark.parametrize("name", sorted(p.name for p in SCALE.glob("plan-*.txt")))
def test_the_committed_paper_scale_plans_regenerate(name):
    """Each plan-*.txt's first line is its command; running it prints the rest, byte for byte."""
    command, _, expected = (SCALE / name).read_text().partition("\n")
    args = command.removeprefix("$ python -m rl.plan ").split()
    out = _plan_cli(*args)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected
