"""A student's tokenizer (`student.tokenizer`): the interface every producer of token ids uses
(`Tokenizer`), and the byte-level tokenizer built in code, for students trained from scratch (no
downloads). A pretrained checkpoint's own tokenizer and chat template is `student.tokenizer=auto`
(student/chat_tokenizer.py), behind the same interface; student/model.py::build_tokenizer builds either.

Ids 0..255 are raw UTF-8 bytes; a few specials follow. The chat layout is fixed here because the
student learns it during warm-start, so every producer of token ids (rollout, teacher scoring,
warm-start, evaluation) must render through `render_prompt` (and insert hints with `insert_hint`):

    <bos> prompt bytes [<hint> hint bytes] <assistant>   ->  answer bytes <eos>

The hint sits right before the target (assistant) message: that is the "local context" the
hint_distill method conditions on.

Multi-message episodes continue the same layout (`render_messages`, and the exported chat template
renders the same ids from the same OpenAI-shaped messages):

    <bos> user [<hint> hint] <assistant> message <eos> tool result [<hint> hint] <assistant> message <eos> ...

A later user or tool message is its bytes, right after the previous <eos>. An assistant message
that calls a tool is written as the call's name followed by its JSON arguments, e.g.
`calc{"a":12,"op":"+","b":7}` (one call per message), and `assistant_message` reads it back into
the chat-completions shape (`tool_calls` with the arguments as a JSON string).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

# name{json arguments}; an unclosed `name{...` is a call too (a malformed one, for the tool to refuse)
TOOL_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\{.*)", re.DOTALL)


KINDS = ("byte", "auto")


class Tokenizer(Protocol):
    """What rollouts, scoring, warm-start, evaluation and export ask of a student's tokenizer: the
    byte tokenizer below, or a checkpoint's own with its chat template (student/chat_tokenizer.py)."""
    pad_id: int
    eos_id: int                       # ends an assistant message; the only special ever sampled
    vocab_size: int                   # the model's embedding rows

    @property
    def never_sampled(self) -> tuple[int, ...]: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def render_prompt(self, prompt: str, hint: str | None = None) -> list[int]: ...
    def render_answer(self, answer: str) -> list[int]: ...
    def render_messages(self, messages: list[dict], add_generation_prompt: bool = False) -> list[int]: ...
    def render_reply(self, messages: list[dict], hint: str | None = None) -> list[int]: ...
    def insert_hint(self, context: list[int], hint: str) -> list[int]: ...
    def to_transformers(self): ...


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

    def render_messages(self, messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
        """The chat layout of OpenAI-shaped messages (roles user, tool, hint, assistant; an
        assistant's `tool_calls` as name + arguments): the ids the exported chat template renders."""
        ids = [self.bos_id]
        for m in messages:
            role = m["role"]
            if role in ("user", "tool"):
                ids += self.encode(m["content"])
            elif role == "hint":
                ids += [self.hint_id] + self.encode(m["content"])
            elif role == "assistant":
                ids += [self.assistant_id] + self.render_answer(assistant_text(m))
            else:
                raise ValueError(f"message role {role!r} is not in the chat layout (user, tool, hint, assistant)")
        return ids + [self.assistant_id] if add_generation_prompt else ids

    def render_reply(self, messages: list[dict], hint: str | None = None) -> list[int]:
        """What follows an assistant message's <eos> before the next one: the environment's messages
        and the opening of the next assistant turn (with a hint in its local context)."""
        ids = [i for m in messages for i in self.render_messages([m])[1:]]
        if hint:
            ids += [self.hint_id] + self.encode(hint)
        return ids + [self.assistant_id]

    def insert_hint(self, context: list[int], hint: str) -> list[int]:
        """`context` (ending in <assistant>) with the hint right before that marker: the local
        context of the message that follows."""
        if not context or context[-1] != self.assistant_id:
            raise ValueError("a hint goes before the <assistant> marker that ends the context, which this one lacks")
        return context[:-1] + [self.hint_id] + self.encode(hint) + [self.assistant_id]

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
        # A tool call is its name then its JSON arguments (a string, as chat-completions sends it).
        template = ("{{ bos_token }}{% for m in messages %}"
                    "{% if m['role'] == 'user' or m['role'] == 'tool' %}{{ m['content'] }}"
                    "{% elif m['role'] == 'hint' %}<hint>{{ m['content'] }}"
                    "{% elif m['role'] == 'assistant' %}<assistant>"
                    "{% if m['tool_calls'] is defined and m['tool_calls'] %}{% for c in m['tool_calls'] %}"
                    "{{ c['function']['name'] }}{{ c['function']['arguments'] }}{% endfor %}"
                    "{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}"
                    "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
        return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                       pad_token="<pad>", chat_template=template,
                                       additional_special_tokens=["<hint>", "<assistant>"])


def assistant_text(message: dict) -> str:
    """An assistant message's text in the chat layout: its content, or its tool calls."""
    calls = message.get("tool_calls") or []
    if calls:
        return "".join(c["function"]["name"] + c["function"]["arguments"] for c in calls)
    return message.get("content") or ""


def assistant_message(text: str, call_id: str = "call_0") -> dict:
    """The chat-completions message of an assistant text: a tool call when it reads name{...
    (the arguments are kept as written; whether they are valid JSON is the tool's business)."""
    match = TOOL_CALL.fullmatch(text)
    if match is None:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": match.group(1), "arguments": match.group(2)}}]}
