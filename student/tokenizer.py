"""Byte-level tokenizer built in code, for students trained from scratch (no downloads).

Ids 0..255 are raw UTF-8 bytes; a few specials follow. The chat layout is fixed here because the
student learns it during warm-start, so every producer of token ids (rollout, teacher scoring,
warm-start, evaluation) must render through `render_prompt`:

    <bos> prompt bytes [<hint> hint bytes] <assistant>   ->  answer bytes <eos>

The hint sits right before the target (assistant) message: that is the "local context" the
hint_distill method conditions on.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ByteTokenizer:
    pad_id: int = 256
    bos_id: int = 257
    eos_id: int = 258
    hint_id: int = 259
    assistant_id: int = 260

    @property
    def vocab_size(self) -> int:
        return 261

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes only; stops at <eos>, skips other specials, replaces broken UTF-8."""
        out = bytearray()
        for i in ids:
            if i == self.eos_id:
                break
            if i < 256:
                out.append(i)
        return out.decode("utf-8", errors="replace")

    def render_prompt(self, prompt: str, hint: str | None = None) -> list[int]:
        ids = [self.bos_id] + self.encode(prompt)
        if hint:
            ids += [self.hint_id] + self.encode(hint)
        return ids + [self.assistant_id]

    def render_answer(self, answer: str) -> list[int]:
        return self.encode(answer) + [self.eos_id]
