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

    @property
    def never_sampled(self) -> tuple[int, ...]:
        """Special ids a policy must never emit: only <eos> (which ends an answer) may be sampled."""
        return (self.pad_id, self.bos_id, self.hint_id, self.assistant_id)

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

    def to_transformers(self):
        """The same tokenizer as a `PreTrainedTokenizerFast` with the chat layout as its chat
        template, for exported students (transformers, vLLM). Byte b keeps id b: a byte-level BPE
        with no merges over GPT-2's printable byte alphabet, then the specials in id order."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        char_of = bytes_to_unicode()
        core = Tokenizer(models.BPE(vocab={char_of[b]: b for b in range(256)}, merges=[]))
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        core.decoder = decoders.ByteLevel()
        specials = {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id,
                    "hint": self.hint_id, "assistant": self.assistant_id}
        for name, _ in sorted(specials.items(), key=lambda kv: kv[1]):
            core.add_special_tokens([f"<{name}>"])
        assert all(core.token_to_id(f"<{n}>") == i for n, i in specials.items())
        # A "hint" message is the local context of the next assistant turn (see module docstring).
        template = ("{{ bos_token }}{% for m in messages %}"
                    "{% if m['role'] == 'user' %}{{ m['content'] }}"
                    "{% elif m['role'] == 'hint' %}<hint>{{ m['content'] }}"
                    "{% elif m['role'] == 'assistant' %}<assistant>{{ m['content'] }}{{ eos_token }}"
                    "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
        return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                       pad_token="<pad>", chat_template=template,
                                       additional_special_tokens=["<hint>", "<assistant>"])
