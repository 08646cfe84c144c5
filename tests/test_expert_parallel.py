"""Expert parallelism (student/expert_parallel.py) against expert_parallel_size=1, on CPU ranks.

Each multi-rank test launches this file under torchrun (gloo); the worker builds the same seeded
model twice, shards one copy's experts (EP) and leaves the other whole (EP=1, data-parallel over
the same ranks), runs both side by side on each rank's own batches and writes what it measured
to a JSON file per rank, which the test then checks.
"""
from __future__ import annotations

import atexit
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl.distributed import free_port
from student import STUDENT_FAMILIES

ROOT = Path(__file__).resolve().parents[1]
SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, num_experts=4, expert_width=16)
ARCHS = tuple(name for name in STUDENT_FAMILIES if STUDENT_FAMILIES[name].expert_parallel)


# -- worker (runs under torchrun) --------------------------------------------------------------

def _init():
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:   # skip DeepSpeed's shm-op compile (minutes), as rl.engine does
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
    deepspeed.init_distributed(dist_backend="gloo")
    # Exiting with the group alive can abort a rank under gloo (rl/distributed.py::shutdown).
    atexit.register(torch.distributed.destroy_process_group)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _models(arch: str, ep_size: int, zero_stage: int):
    from student import ByteTokenizer, StudentConfig, build_student
    from student import expert_parallel as ep

    torch.manual_seed(0)
    ref = build_student(StudentConfig(arch=arch, **SIZES), ByteTokenizer())
    model = copy.deepcopy(ref)
    ep.shard_experts(model, ep_size, zero_stage)
    return ref, model


def _forward_checks(arch: str, ep_size: int, batch: torch.Tensor) -> dict:
    """Logits, loss and gathered gradients of one forward/backward, no DeepSpeed."""
    from student import expert_parallel as ep

    ref, model = _models(arch, ep_size, zero_stage=1)
    out = {}
    l_ref = ref(batch, labels=batch)
    l_ep = model(batch, labels=batch)
    out["logits"] = (l_ref.logits - l_ep.logits).abs().max().item()
    out["loss"] = abs(l_ref.loss.item() - l_ep.loss.item())
    l_ref.loss.backward()
    l_ep.loss.backward()
    # Expert gradients: EP's hold every rank's tokens (the all-to-all backward sums them);
    # EP=1's hold this rank's only, so sum those over the ranks to compare.
    g_ref = {n: p.grad.clone() for n, p in ref.named_parameters()}
    expert_keys = set()
    for _, m in ep.experts_modules(model):
        for n, p in m.named_parameters(recurse=False):
            key = f"{m._ep_prefix}{n}"
            expert_keys.add(key)
            torch.distributed.all_reduce(g_ref[key])
            g_ref[key] = g_ref[key][m.expert_offset:m.expert_offset + m.local_experts]
    g_ep = {n: p.grad for n, p in model.named_parameters()}
    out["expert_grads"] = _max_diff({k: g_ref[k] for k in expert_keys}, {k: g_ep[k] for k in expert_keys})
    out["dense_grads"] = _max_diff({k: g_ref[k] for k in g_ep if k not in expert_keys},
                                   {k: g_ep[k] for k in g_ep if k not in expert_keys})
    out["sharded_shape"] = list(next(m for _, m in ep.experts_modules(model)).down_proj.shape)
    return out


def _replay_checks(ep_size: int, batch: torch.Tensor) -> dict:
    """Router replay on a sharded model: forced ids apply, and EP equals EP=1 under them."""
    from student.router_replay import RouterReplay

    ref, model = _models("qwen3_moe", ep_size, zero_stage=1)
    rr_ref, rr_ep = RouterReplay(ref), RouterReplay(model)
    n, k, e = batch.numel(), rr_ref.top_k, SIZES["num_experts"]
    g = torch.Generator().manual_seed(7)
    forced = [torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]) for _ in range(rr_ref.num_layers)]
    with torch.no_grad():
        free = model(batch).logits
        with rr_ep.record() as rec:
            model(batch)
        with rr_ref.replay(forced):
            ref_forced = ref(batch).logits
        with rr_ep.replay(forced):
            ep_forced = model(batch).logits
    recorded = rec.routes()
    return {"forced_vs_ref": (ref_forced - ep_forced).abs().max().item(),
            "forced_vs_free": (ep_forced - free).abs().max().item(),
            "mismatch_ep": rr_ep.stats()["mismatched"], "mismatch_ref": rr_ref.stats()["mismatched"],
            "recorded_shape": list(recorded[0].shape)}


def _train_checks(ep_size: int, zero_stage: int, opt_name: str, batches: list, ckpt_dir: Path) -> dict:
    """3 DeepSpeed steps of EP and EP=1 side by side, then a checkpoint round trip under EP."""
    import deepspeed
    from student import expert_parallel as ep

    ref, model = _models("qwen3_moe", ep_size, zero_stage)
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": zero_stage},
          "gradient_clipping": 0.5, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}

    def make_opt(groups):
        if opt_name == "sgd":   # plain SGD shows a gradient scaling error that Adam would normalise away
            return torch.optim.SGD(groups, lr=0.5)
        return torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.01)

    e_ref, *_ = deepspeed.initialize(model=ref, optimizer=make_opt(ref.parameters()), config=ds)
    e_ep, *_ = deepspeed.initialize(model=model, optimizer=make_opt(ep.optimizer_param_groups(model)), config=ds)

    def step(engine, ids):
        loss = engine(ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        return loss.item(), float(engine.get_global_grad_norm())

    out = {"losses": [], "grad_norms": []}
    for ids in batches[:3]:
        (l1, n1), (l2, n2) = step(e_ref, ids), step(e_ep, ids)
        out["losses"].append([l1, l2])
        out["grad_norms"].append([n1, n2])
    full = ep.gather_full_state_dict(model)
    out["params"] = _max_diff({k: v for k, v in ref.state_dict().items()}, full)
    initial = _models("qwen3_moe", 1, zero_stage)[0]
    out["params_moved"] = _max_diff(initial.state_dict(), full)
    ep.copy_full_weights(model, initial)       # the unsharded copy rollouts would run on
    out["full_copy"] = _max_diff(initial.state_dict(), full)

    # Checkpoint round trip: save after step 3, take step 4, load, take step 4 again.
    e_ep.save_checkpoint(str(ckpt_dir), tag="t3")
    ep.save_expert_shard(model, ckpt_dir / "t3")
    step(e_ep, batches[3])
    after4 = ep.gather_full_state_dict(model)
    e_ep.load_checkpoint(str(ckpt_dir), tag="t3")
    ep.load_expert_shard(model, ckpt_dir / "t3")
    out["restored"] = _max_diff(full, ep.gather_full_state_dict(model))
    step(e_ep, batches[3])
    out["resumed_step"] = _max_diff(after4, ep.gather_full_state_dict(model))
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        out["offline"] = _max_diff(full, ep.full_state_dict_from_checkpoint(ckpt_dir / "t3"))
        out["files"] = sorted(p.name for p in (ckpt_dir / "t3").iterdir())
    return out


def worker(out_dir: str, ep_size: int, zero_stage: int, opt_name: str, archs: str) -> None:
    _init()
    torch.set_num_threads(1)
    rank = torch.distributed.get_rank()
    g = torch.Generator().manual_seed(100 + rank)   # every rank its own batches
    batches = [torch.randint(3, 200, (2, 9), generator=g) for _ in range(4)]
    result = {"forward": {arch: _forward_checks(arch, ep_size, batches[0]) for arch in archs.split(",") if arch},
              "replay": _replay_checks(ep_size, batches[0]),
              "train": _train_checks(ep_size, zero_stage, opt_name, batches, Path(out_dir) / "ckpt")}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


# -- tests -------------------------------------------------------------------------------------

def launch(tmp_path: Path, nproc: int, ep_size: int, zero_stage: int, opt_name: str, archs=()) -> list[dict]:
    from conftest import CHILD_PYTHONPATH   # here: torchrun also runs this file as a script

    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=CHILD_PYTHONPATH)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", str(free_port()), __file__, str(tmp_path), str(ep_size), str(zero_stage),
           opt_name, ",".join(archs)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)]


def check_training(results: list[dict], param_tol: float) -> None:
    for res in results:
        tr = res["train"]
        for l_ref, l_ep in tr["losses"]:
            assert abs(l_ref - l_ep) < 1e-5
        for n_ref, n_ep in tr["grad_norms"]:
            assert n_ep > 0.5                      # clipping (at 0.5) was active
            assert abs(n_ref - n_ep) < 1e-5 * n_ref
        assert tr["params_moved"] > 1e-3           # the steps did change the weights ...
        assert tr["params"] < param_tol            # ... identically under EP and EP=1
        assert tr["full_copy"] == 0.0              # copy_full_weights brings every expert over
        assert tr["restored"] == 0.0               # checkpoint restores every expert bit for bit
        assert tr["resumed_step"] == 0.0           # and the optimizer state: the next step is identical


@pytest.mark.parametrize("zero_stage", [1, 2])
@pytest.mark.slow
def test_ep2_equals_ep1_adamw(tmp_path, zero_stage):
    results = launch(tmp_path, 2, 2, zero_stage, "adamw", ARCHS if zero_stage == 1 else ())
    check_training(results, param_tol=1e-5)
    for res in results:
        for arch, fw in res["forward"].items():
            assert fw["sharded_shape"][0] == SIZES["num_experts"] // 2, arch
            assert fw["logits"] < 1e-5 and fw["loss"] < 1e-6, arch
            assert fw["expert_grads"] < 1e-6 and fw["dense_grads"] < 1e-6, arch
        rp = res["replay"]
        assert rp["forced_vs_ref"] < 1e-5          # forced routes: EP equals EP=1 ...
        assert rp["forced_vs_free"] > 1e-3         # ... and they did change the output
        assert rp["mismatch_ep"] == rp["mismatch_ref"] > 0
        assert rp["recorded_shape"] == [18, 2]     # recording sees this rank's 2x9 tokens, K=2
    assert results[0]["forward"] == {} or results[0]["forward"].keys() == set(ARCHS)
    files = results[0]["train"]["files"]
    assert {"expert_shard_ep0.pt", "expert_shard_ep1.pt", "mp_rank_00_model_states.pt",
            "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= set(files)
    assert results[0]["train"]["offline"] == 0.0


@pytest.mark.slow
def test_ep2_gradient_scale_with_sgd(tmp_path):
    # SGD moves weights by lr * gradient: an expert gradient off by the EP factor would show here.
    check_training(launch(tmp_path, 2, 2, 2, "sgd"), param_tol=1e-6)


@pytest.mark.slow
def test_ep2_on_four_ranks_with_expert_data_parallel_groups(tmp_path):
    # 4 ranks, EP=2: two ranks hold each expert, so expert gradients also reduce over a group.
    results = launch(tmp_path, 4, 2, 2, "adamw")
    check_training(results, param_tol=1e-5)
    files = results[0]["train"]["files"]
    assert [f for f in files if f.startswith("expert_shard")] == ["expert_shard_ep0.pt", "expert_shard_ep1.pt"]


def test_unsupported_settings_are_refused():
    from student.expert_parallel import check_expert_parallel

    check_expert_parallel(2, 4, 8, zero_stage=1)
    check_expert_parallel(1, 2, 8, zero_stage=3)             # EP off: any stage
    with pytest.raises(ValueError, match="stage 3"):
        check_expert_parallel(2, 2, 8, zero_stage=3)
    with pytest.raises(ValueError, match="clipping"):
        check_expert_parallel(2, 2, 8, zero_stage=0)
    with pytest.raises(ValueError, match="must divide"):
        check_expert_parallel(3, 4, 8, zero_stage=1)
    with pytest.raises(ValueError, match="must divide"):
        check_expert_parallel(2, 2, 5, zero_stage=1)


def test_ep1_leaves_the_model_alone():
    from student import ByteTokenizer, StudentConfig, build_student
    from student import expert_parallel as ep

    model = build_student(StudentConfig(**SIZES), ByteTokenizer())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert ep.shard_experts(model, 1, zero_stage=0) == 0 and not ep.is_sharded(model)
    assert _max_diff(before, ep.gather_full_state_dict(model)) == 0.0
    assert len(ep.optimizer_param_groups(model)) == 1


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "")
