"""Two CPU ranks (gloo) through the real CLI and launcher: ZeRO stages agree with ZeRO-0, resume is
bit-identical at ZeRO-3, and a ZeRO-3 checkpoint exports to the same model as a ZeRO-0 one."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import CHILD_PYTHONPATH, ROOT, TINY, TINY_RUN, run_cli

pytestmark = pytest.mark.slow   # every test here launches two ranks (torchrun), most of them whole runs

# Persistence threshold 0: ZeRO-3 really partitions even these tiny parameters.
TWO_RANKS = TINY + ["launcher.nproc_per_node=2", "deepspeed.param_persistence_threshold=0",
                    "method.name=hint_distill"]


def metrics_of(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """run(name, *overrides) -> run folder; each distinct run happens once per module."""
    base, done = tmp_path_factory.mktemp("dist"), {}

    def run(name: str, *extra: str, check: bool = True):
        if name not in done:
            out = run_cli(["experiments/default", *TWO_RANKS, f"output_dir={base}",
                           f"run_name={name}", *extra], timeout=900)
            if check:
                assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
            done[name] = out
        return base / "default" / name, done[name]
    return run


def assert_close_runs(ref: list[dict], other: list[dict], rtol=1e-3, atol=1e-5, skip=()):
    assert [m["step"] for m in ref] == [m["step"] for m in other]
    for a, b in zip(ref, other):
        assert set(a) == set(b), a["step"]
        for k in set(a) - set(skip):
            assert abs(a[k] - b[k]) <= atol + rtol * abs(a[k]), (a["step"], k, a[k], b[k])


def test_launcher_starts_two_ranks_into_one_run_folder(two_rank_run):
    run_dir, out = two_rank_run("z0", "deepspeed.zero_stage=0")
    assert "torch.distributed.run --nproc_per_node=2" in out.stdout
    assert "2 rank(s), ZeRO-0" in out.stdout
    assert [m["step"] for m in metrics_of(run_dir)] == list(range(8))
    ckpt = run_dir / "checkpoints" / "step_0000007"
    assert {"rng_rank0.safetensors", "rng_rank1.safetensors", "state_rank0.json", "state_rank1.json",
            "manifest.json"} <= {p.name for p in ckpt.iterdir()}


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_stage_matches_zero0(two_rank_run, stage):
    ref_dir, _ = two_rank_run("z0", "deepspeed.zero_stage=0")
    run_dir, out = two_rank_run(f"z{stage}", f"deepspeed.zero_stage={stage}")
    assert f"ZeRO-{stage}" in out.stdout
    # Same samples (ZeRO-3 generates with a synced full copy), same losses up to reduction order.
    assert (run_dir / "rollouts.jsonl").read_text() == (ref_dir / "rollouts.jsonl").read_text()
    # ZeRO-3 trains through transformers' forward (partitioned weights), ZeRO-0 through the lean one
    # that also generated: only the former's rounding differs from rollout's and can flip a routing tie.
    assert_close_runs(metrics_of(ref_dir), metrics_of(run_dir),
                      skip=("router/replay_mismatch",) if stage == 3 else ())


def test_two_loopback_nodes_equal_one_node_of_two_ranks(two_rank_run, tmp_path):
    """launcher.nnodes=2 (torchrun's rendezvous, README "Scale out"): two nodes of one rank each, both
    on 127.0.0.1 and writing one shared run folder, make the same run as one node of two ranks."""
    from rl.distributed import free_port

    ref_dir, _ = two_rank_run("z2", "deepspeed.zero_stage=2")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    nodes = [subprocess.Popen([sys.executable, "-m", "rl.train", "experiments/default", *TWO_RANKS,
                               "deepspeed.zero_stage=2", "launcher.nproc_per_node=1", "launcher.nnodes=2",
                               f"launcher.node_rank={rank}", "launcher.master_addr=127.0.0.1",
                               f"launcher.master_port={port}", f"output_dir={tmp_path}", "run_name=nodes"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    outputs = [node.communicate(timeout=900)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "--nnodes=2 --node_rank=1" in outputs[1]
    run_dir = tmp_path / "default" / "nodes"
    assert metrics_of(run_dir) == metrics_of(ref_dir)
    assert (run_dir / "rollouts.jsonl").read_text() == (ref_dir / "rollouts.jsonl").read_text()


def assert_resume_is_bit_identical(two_rank_run, name: str, *extra: str):
    full_dir, _ = two_rank_run(name, *extra)
    # Stop after step 3 (warm-start only), drop the step-4 checkpoint, resume with the full budget.
    part_dir, _ = two_rank_run(f"{name}-part", *extra, "trainer.steps=1", "trainer.checkpoint_every=3")
    shutil.rmtree(part_dir / "checkpoints" / "step_0000004")
    # No launcher override: the run's saved config brings its 2 ranks back.
    out = run_cli(["experiments/default", *TINY, f"output_dir={part_dir.parent.parent}",
                   f"run_name={name}-part", "resume=true"], timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    assert metrics_of(part_dir) == metrics_of(full_dir)
    assert (part_dir / "rollouts.jsonl").read_text() == (full_dir / "rollouts.jsonl").read_text()


def test_zero3_resume_is_bit_identical(two_rank_run):
    assert_resume_is_bit_identical(two_rank_run, "z3", "deepspeed.zero_stage=3")


def test_resume_on_other_rank_count_is_refused(two_rank_run, tmp_path):
    run_dir, _ = two_rank_run("z3", "deepspeed.zero_stage=3")
    out = run_cli(["experiments/default", *TINY, f"output_dir={run_dir.parent.parent}",
                   "run_name=z3", "resume=true", "launcher.nproc_per_node=1",
                   "deepspeed.zero_stage=3"])
    assert out.returncode != 0 and "saved by 2 rank(s)" in out.stderr


def test_zero3_export_equals_zero0_export(two_rank_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from rl.export import export
    logits = []
    for name, stage in (("z0", 0), ("z3", 3)):
        run_dir, _ = two_rank_run(name, f"deepspeed.zero_stage={stage}")
        model = AutoModelForCausalLM.from_pretrained(export(run_dir, tmp_path / name))
        logits.append(model(torch.tensor([[257, 51, 43, 52, 260]])).logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-5)


def test_expert_parallel_matches_ep1(two_rank_run):
    ref_dir, _ = two_rank_run("ep1", "deepspeed.zero_stage=2")
    run_dir, _ = two_rank_run("ep2", "deepspeed.zero_stage=2", "deepspeed.expert_parallel_size=2")
    shards = {p.name for p in (run_dir / "checkpoints" / "step_0000007").iterdir()}
    assert {"expert_shard_ep0.pt", "expert_shard_ep1.pt"} <= shards
    assert (run_dir / "rollouts.jsonl").read_text() == (ref_dir / "rollouts.jsonl").read_text()
    # Expert parallelism trains through transformers' forward, EP=1 through the lean one that also
    # generated: only the former's rounding differs from rollout's and can flip a routing tie.
    assert_close_runs(metrics_of(ref_dir), metrics_of(run_dir), skip=("router/replay_mismatch",))


def test_expert_parallel_resume_is_bit_identical(two_rank_run):
    assert_resume_is_bit_identical(two_rank_run, "ep2", "deepspeed.zero_stage=2",
                                   "deepspeed.expert_parallel_size=2")


def test_expert_parallel_export_equals_ep1_export(two_rank_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from rl.export import export
    logits = []
    for name, extra in (("ep1", []), ("ep2", ["deepspeed.expert_parallel_size=2"])):
        run_dir, _ = two_rank_run(name, "deepspeed.zero_stage=2", *extra)
        model = AutoModelForCausalLM.from_pretrained(export(run_dir, tmp_path / name))
        logits.append(model(torch.tensor([[257, 51, 43, 52, 260]])).logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-5)


def test_zero3_loads_a_checkpoint_partitioned(two_rank_run, tmp_path):
    """student.checkpoint under ZeRO-3 goes through HfDeepSpeedConfig (zero.Init): same losses."""
    from rl.export import export
    src, _ = two_rank_run("z0", "deepspeed.zero_stage=0")
    hf_dir = export(src, tmp_path / "hf")
    short = ("warmstart.steps=2", "trainer.steps=0", f"student.checkpoint={hf_dir}")
    a, _ = two_rank_run("ck-z0", "deepspeed.zero_stage=0", *short)
    b, out = two_rank_run("ck-z3", "deepspeed.zero_stage=3", *short)
    assert "ZeRO-3" in out.stdout
    assert_close_runs(metrics_of(a), metrics_of(b), rtol=1e-6, atol=1e-7)
    # Trained weights, not a fresh init: the first loss differs from the from-config run's.
    assert abs(metrics_of(a)[1]["loss/sft"] - metrics_of(src)[1]["loss/sft"]) > 1e-3


@pytest.mark.parametrize("name,layout", [("pt-z3", ["deepspeed.zero_stage=3"]),
                                         ("pt-ep2", ["deepspeed.zero_stage=2", "deepspeed.expert_parallel_size=2"])])
def test_a_pretrained_student_with_its_own_tokenizer_trains_sharded(two_rank_run, tiny_pretrained, name, layout):
    """A Hub-format MoE (Mixtral, SmolLM2's 49,152-token vocabulary and chat template, loaded with
    `student.tokenizer=auto`) under ZeRO-3 and with its experts split over the ranks trains as under
    ZeRO-0: the same samples, the same losses up to reduction order."""
    student = [k for k in TINY_RUN if k.startswith("student.")] + [f"student.checkpoint={tiny_pretrained}",
                                                                   "student.tokenizer=auto"]
    ref_dir, _ = two_rank_run("pt-z0", "deepspeed.zero_stage=0", *student)
    run_dir, out = two_rank_run(name, *layout, *student)
    if name == "pt-z3":
        assert "ZeRO-3" in out.stdout
    else:
        assert {"expert_shard_ep0.pt", "expert_shard_ep1.pt"} <= {
            p.name for p in (run_dir / "checkpoints" / "step_0000007").iterdir()}
    rollouts = [json.loads(line) for line in (ref_dir / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and (run_dir / "rollouts.jsonl").read_text() == (ref_dir / "rollouts.jsonl").read_text()
    assert_close_runs(metrics_of(ref_dir), metrics_of(run_dir), skip=("router/replay_mismatch",))


def test_launcher_rank_count_must_match_the_config(tmp_path):
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "--master_port=0", "-m", "rl.train", "experiments/default", *TINY,
                          f"output_dir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "the launcher started 2 ranks" in out.stderr


# ---------------------------------------------------------------------- the methods on two ranks
METHODS = {
    "hint_distill-ema": ["method.name=hint_distill", "method.teacher_weights=ema", "method.ema_rate=0.3"],
    "self_distill": ["method.name=self_distill", "method.context=feedback"],       # EMA teacher, top-k JSD
    "corrected_replay": ["method.name=corrected_replay", "method.when=failed"],
    "teacher_distill": ["method.name=teacher_distill"],
}
LAYOUTS = {"z3": ["deepspeed.zero_stage=3"], "ep2": ["deepspeed.zero_stage=2", "deepspeed.expert_parallel_size=2"]}
# CI runs one method per layout that the other layout does not cover; HINTRL_FULL_MATRIX=1 runs all
# eight (what the closing note of the issue that added the methods reports).
IN_CI = {("self_distill", "z3"), ("corrected_replay", "z3"), ("hint_distill-ema", "ep2"), ("teacher_distill", "ep2")}


def _method_overrides(method, teacher):
    extra = list(METHODS[method])
    return extra + [f"method.teacher_path={teacher}"] if method == "teacher_distill" else extra


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("method", METHODS)
def test_method_resumes_mid_rl_bit_identically_on_two_ranks(two_rank_run, exported_teacher, method, layout):
    """Each method at ZeRO-3 and with expert parallelism on two ranks: killed after RL step 3 of 4
    (an eval step), resumed; the same run, metric for metric and sample for sample (the EMA teacher
    is rebuilt from the checkpoint on every rank)."""
    import os

    if (method, layout) not in IN_CI and not os.environ.get("HINTRL_FULL_MATRIX"):
        pytest.skip("outside CI's subset of the matrix; HINTRL_FULL_MATRIX=1 runs it")
    extra = [*LAYOUTS[layout], *_method_overrides(method, exported_teacher), "trainer.checkpoint_every=3"]
    name = f"{method}-{layout}"
    full_dir, _ = two_rank_run(name, *extra)
    part_dir, _ = two_rank_run(f"{name}-part", *extra, "trainer.steps=3")
    out = run_cli(["experiments/default", *TINY, f"output_dir={part_dir.parent.parent}",
                   f"run_name={name}-part", "resume=true"], timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    assert metrics_of(part_dir) == metrics_of(full_dir)
    assert (part_dir / "rollouts.jsonl").read_text() == (full_dir / "rollouts.jsonl").read_text()


def test_corrected_replay_at_zero3_matches_zero0(two_rank_run, exported_teacher):
    """Corrected rows through the ZeRO-3 path (transformers' forward, router hooks with free rows)
    give the ZeRO-0 run's samples and, up to reduction order, its metrics."""
    extra = _method_overrides("corrected_replay", exported_teacher) + ["trainer.checkpoint_every=3"]
    ref_dir, _ = two_rank_run("corrected_replay-z0", "deepspeed.zero_stage=0", *extra)
    run_dir, _ = two_rank_run("corrected_replay-z3", *LAYOUTS["z3"], *extra)
    assert (run_dir / "rollouts.jsonl").read_text() == (ref_dir / "rollouts.jsonl").read_text()
    assert_close_runs(metrics_of(ref_dir), metrics_of(run_dir),
                      skip=("router/replay_mismatch", "corrected/route_mismatch"))
