"""Export a run's checkpoint as a Hugging Face folder: `python -m rl.export RUN_DIR OUT_DIR`.

    OUT_DIR/model.safetensors, config.json, generation_config.json   (AutoModelForCausalLM, vLLM)
    OUT_DIR/tokenizer.json, tokenizer_config.json, chat_template.jinja (AutoTokenizer)
    OUT_DIR/hintrl_config.yaml   the run's resolved config: task, teacher, rollout shape, for
                                 `scripts/eval.sh OUT_DIR` (rl/eval.py) to evaluate it as the run did

Reads the DeepSpeed checkpoint offline, in one process, at any ZeRO stage: stage 0 stores the
whole module on rank 0; stages 1-3 are consolidated from every rank's fp32 optimizer partition
(DeepSpeed's zero_to_fp32), which is exact for fp32 and bf16 runs alike. With expert parallelism
the experts come from each EP rank's shard file (student/expert_parallel.py). The exported config names
no hintrl experts implementation, so plain transformers loads it; `student.checkpoint=OUT_DIR`
trains from it again. The checkpoint's manifest is verified first, its files are read without
unpickling code (student/safe_load.py), and the export is safetensors only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from rl.checkpoint import CheckpointError, list_tags, verify
from rl.config import to_yaml
from rl.configure import load_config
from student import safe_load
from student.model import build_tokenizer, model_config


def consolidated_state_dict(run_dir: Path, tag: str, zero_stage: int) -> dict[str, torch.Tensor]:
    ckpt_dir = run_dir / "checkpoints"
    if list((ckpt_dir / tag).glob("expert_shard_ep*.pt")):
        # Expert parallelism: dense weights from rank 0's module states, experts from each EP rank.
        from student.expert_parallel import full_state_dict_from_checkpoint

        return {k: v.float() for k, v in full_state_dict_from_checkpoint(ckpt_dir / tag).items()}
    if zero_stage == 0:
        states = safe_load.load(ckpt_dir / tag / "mp_rank_00_model_states.pt")
        return {k: v.float() for k, v in states["module"].items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with safe_load.weights_only_loads(ckpt_dir / tag):   # zero_to_fp32 itself unpickles freely
        return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)


def load_checkpoint(model: torch.nn.Module, run_dir: Path, tag: str, zero_stage: int) -> None:
    """Checkpoint `tag`'s weights into `model` (a student of the run's family and shape), cast to
    its dtype: what an export holds, without writing one (rl/load_policy.py loads checkpoints so)."""
    state = consolidated_state_dict(run_dir, tag, zero_stage)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied output embeddings are stored once; anything else missing is a real mismatch.
    missing = [k for k in missing if k not in getattr(model, "_tied_weights_keys", {}) and
               not (model.config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"{run_dir / 'checkpoints' / tag}: state does not fit the model; "
                           f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()


def export(run_dir: str | Path, out_dir: str | Path, step: int | None = None) -> Path:
    from transformers import AutoModelForCausalLM

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    cfg = load_config(run_dir)                    # the run's own resolved config
    tags = list_tags(run_dir / "checkpoints")
    if not tags:
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint to export")
    tag = tags[-1] if step is None else f"step_{step:07d}"
    if tag not in tags:
        raise FileNotFoundError(f"{run_dir / 'checkpoints' / tag}: no such checkpoint; have {tags}")
    problem = verify(run_dir / "checkpoints" / tag)
    if problem:
        raise CheckpointError(f"{run_dir / 'checkpoints' / tag}: not exported: {problem}")
    tok = build_tokenizer(cfg.student)
    if cfg.student.checkpoint:
        from transformers import AutoConfig
        hf_config = AutoConfig.from_pretrained(cfg.student.checkpoint)
    else:
        hf_config = model_config(cfg.student, tok)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    load_checkpoint(model, run_dir, tag, cfg.deepspeed.zero_stage)
    model.to(getattr(torch, cfg.student.dtype))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.to_transformers().save_pretrained(out_dir)
    # transformers 5 names the class TokenizersBackend; PreTrainedTokenizerFast (its alias there)
    # is the name older transformers, and the engines built on them, also know.
    tok_cfg = out_dir / "tokenizer_config.json"
    tok_cfg.write_text(tok_cfg.read_text().replace('"TokenizersBackend"', '"PreTrainedTokenizerFast"'))
    (out_dir / "hintrl_config.yaml").write_text(to_yaml(cfg))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.export", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    args = parser.parse_args(argv)
    try:
        out = export(args.run_dir, args.out_dir, args.step)
    except (CheckpointError, safe_load.UnsafeCheckpointError, FileNotFoundError) as err:
        print(f"export error: {err}", file=sys.stderr)
        return 1
    print(f"exported {args.run_dir} -> {out}\n"
          f"  AutoModelForCausalLM.from_pretrained({str(out)!r}); vllm serve {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
