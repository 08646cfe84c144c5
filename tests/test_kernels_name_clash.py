"""Our import package `kernels` shares its name with Hugging Face's `kernels` (hub kernels), which
transformers probes for by import name and distribution version. Check that transformers, with our
package importable, does not take ours for theirs and still builds MoE models. Runs in a fresh
interpreter so the probe sees a clean import state."""
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import sys
sys.path.insert(0, {root!r})
import kernels, kernels.ops
assert kernels.__file__.startswith({root!r}), kernels.__file__
from transformers.utils import import_utils as iu
avail = iu.is_kernels_available
if hasattr(avail, "cache_clear"):
    avail.cache_clear()
assert not avail(), "transformers mistook hintrl's kernels package for Hugging Face kernels"
ok, version = iu._is_package_available("kernels", return_version=True)
print("probe", ok, version)
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
cfg = Qwen3MoeConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8, intermediate_size=32, moe_intermediate_size=8,
                     num_experts=4, num_experts_per_tok=2)
for impl in ("eager", "grouped_mm"):
    m = AutoModelForCausalLM.from_config(cfg, experts_implementation=impl)
    assert m(torch.randint(0, 32, (1, 5))).logits.shape == (1, 5, 32)
import student.experts
m = AutoModelForCausalLM.from_config(cfg, experts_implementation="hintrl")
assert m(torch.randint(0, 32, (1, 5))).logits.shape == (1, 5, 32)
print("ok")
"""


def test_transformers_does_not_mistake_our_kernels_package():
    res = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT))], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("ok")


def test_installed_distribution_is_hintrl_and_provides_our_packages():
    """The installed metadata (what transformers' version probe reads) names our distribution
    `hintrl`, and that distribution provides the four import packages."""
    dist = metadata.distribution("hintrl")
    assert dist.metadata["Name"] == "hintrl"
    top_level = set((dist.read_text("top_level.txt") or "").split())
    assert {"rl", "student", "teacher", "kernels"} <= top_level, top_level
    # the import name `kernels` resolves, in the metadata, to the distribution `hintrl`
    assert "hintrl" in metadata.packages_distributions().get("kernels", [])
