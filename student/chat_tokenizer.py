"""A pretrained checkpoint's own tokenizer and chat template, in the layout every producer of token
ids uses (student/tokenizer.py: `render_prompt`, `render_answer`, `render_reply`, `insert_hint`).

The layout is read off the template itself, by rendering small conversations and taking the
differences of their texts, so any template that renders a conversation as the concatenation of
its turns works (ChatML, Llama 3, Mistral's newer ones, ...):

    render_prompt   the template's rendering of [user prompt (, hint)] with the generation prompt
    render_answer   the answer's tokens and the end-of-turn token (the one that ends an assistant
                    message in the template, e.g. <|im_end|>: generation stops there)
    render_reply    what the template writes after that end-of-turn token, through the next
                    generation prompt: the environment's messages (and a hint)

How a hint is marked: as its own user turn, "Hint: <text>", right before the assistant turn it is
about (the byte students have a <hint> token there instead). A pretrained chat model has read
many user turns and no <hint> token; a turn of its own keeps the problem's turn as the student
sees it without the hint, so inserting or removing the hint never re-tokenises the problem.

Tool calls stay text, as for the byte students: an assistant message that calls a tool is the
call's name and JSON arguments in its content (student/tokenizer.py::assistant_message reads it
back); the `tool` role is passed to the template as is.
"""
from __future__ import annotations

import json
from pathlib import Path

from student.tokenizer import assistant_text

HINT_PREFIX = "Hint: "
# Sentinels for reading the layout off the template: texts no tokenizer merges with its neighbours.
_USER, _ANSWER = "\u2063U\u2063", "\u2063A\u2063"


class ChatTokenizer:
    """A transformers tokenizer with a chat template, behind the byte tokenizer's interface.

    `vocab_size` is the model's (its embedding rows, which may exceed the tokenizer's length: the
    rows past it are never sampled)."""

    def __init__(self, hf, vocab_size: int | None = None, source: str = ""):
        self.hf, self.source = hf, source or getattr(hf, "name_or_path", "")
        if not getattr(hf, "chat_template", None):
            raise ValueError(f"student.tokenizer=auto: the tokenizer of {self.source!r} has no chat template; "
                             "a student's prompts, hints and episodes are rendered through one")
        self.vocab_size = max(vocab_size or 0, len(hf))
        self.eos_id = self._end_of_turn()
        self.pad_id = self._pad()
        self.bos_id = hf.bos_token_id if hf.bos_token_id is not None else self.pad_id
        # The template's fixed pieces, read once (rollouts call render_reply and insert_hint per message).
        self._opening = self.encode(self._diff([_user()], [_user()], add_generation_prompt=True))
        answered = self._text(_ANSWERED)
        eot = self.hf.convert_ids_to_tokens(self.eos_id)
        self._after_end_of_turn = answered[answered.rindex(eot) + len(eot):]     # e.g. the "\n" after <|im_end|>

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> "ChatTokenizer":
        """The tokenizer of a transformers folder; the vocabulary size from its config.json."""
        from transformers import AutoTokenizer

        folder = Path(folder)
        try:
            hf = AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError) as err:
            message = (str(err).splitlines() or [type(err).__name__])[0]
            raise ValueError(f"student.tokenizer=auto: no tokenizer in {folder} ({message})") from None
        vocab = None
        if (folder / "config.json").is_file():
            vocab = json.loads((folder / "config.json").read_text()).get("vocab_size")
        return cls(hf, vocab, str(folder))

    # ------------------------------------------------------------------ what the template says
    def _text(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _diff(self, before: list[dict], after: list[dict], add_generation_prompt: bool = False) -> str:
        """The text `after` adds to `before` (both rendered); an error if it does not extend it."""
        a, b = self._text(before), self._text(after, add_generation_prompt)
        if not b.startswith(a):
            raise ValueError(f"student.tokenizer=auto: the chat template of {self.source!r} does not render a "
                             "conversation as the concatenation of its turns, which hintrl's layout needs "
                             f"({a[-80:]!r} is not a prefix of {b[-120:]!r})")
        return b[len(a):]

    def _specials(self) -> dict[str, int]:
        """Every special or added token the tokenizer knows, text -> id."""
        out = {t: i for t, i in zip(self.hf.all_special_tokens, self.hf.all_special_ids)}
        for i, added in getattr(self.hf, "added_tokens_decoder", {}).items():
            if getattr(added, "special", False):
                out[str(added)] = i
        return out

    def _end_of_turn(self) -> int:
        """The special token the template writes right after an assistant message's text."""
        turn = self._diff([_user()], [_user(), {"role": "assistant", "content": _ANSWER}])
        after = turn[turn.index(_ANSWER) + len(_ANSWER):]
        found = [(len(t), i) for t, i in self._specials().items() if t and after.startswith(t)]
        if not found:
            raise ValueError(f"student.tokenizer=auto: the chat template of {self.source!r} ends an assistant "
                             f"message with {after[:20]!r}, not a special token; generation needs one to stop at")
        return max(found)[1]

    def _pad(self) -> int:
        """The tokenizer's pad token, or another special that is never sampled: a pad equal to the
        end-of-turn token (common) would make every finished answer look padded."""
        pad = self.hf.pad_token_id
        if pad is not None and pad != self.eos_id:
            return pad
        others = sorted(i for i in self._specials().values() if i != self.eos_id)
        if not others:
            raise ValueError(f"student.tokenizer=auto: the tokenizer of {self.source!r} has no special token "
                             "besides the end of turn to pad with")
        return others[0]

    # ------------------------------------------------------------------ the layout
    @property
    def never_sampled(self) -> tuple[int, ...]:
        """Every special token except the end of turn, and the embedding rows past the tokenizer."""
        specials = set(self._specials().values()) | {self.pad_id}
        return tuple(sorted(specials - {self.eos_id})) + tuple(range(len(self.hf), self.vocab_size))

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """The text up to the end of turn, special tokens skipped."""
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.hf.decode(ids, skip_special_tokens=True)

    def _conversation(self, messages: list[dict]) -> list[dict]:
        out = []
        for m in messages:
            if m["role"] == "hint":
                out.append(_hint(m["content"]))
            elif m["role"] == "assistant":
                out.append({"role": "assistant", "content": assistant_text(m)})
            else:
                out.append({"role": m["role"], "content": m["content"]})
        return out

    def render_messages(self, messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
        return self.encode(self._text(self._conversation(messages), add_generation_prompt))

    def render_prompt(self, prompt: str, hint: str | None = None) -> list[int]:
        messages = [{"role": "user", "content": prompt}] + ([{"role": "hint", "content": hint}] if hint else [])
        return self.render_messages(messages, add_generation_prompt=True)

    def render_answer(self, answer: str) -> list[int]:
        return self.encode(answer) + [self.eos_id]

    def render_reply(self, messages: list[dict], hint: str | None = None) -> list[int]:
        """What follows an assistant message's end-of-turn token through the next generation prompt."""
        more = self._conversation(messages) + ([_hint(hint)] if hint else [])
        return self.encode(self._after_end_of_turn + self._diff(_ANSWERED, _ANSWERED + more, add_generation_prompt=True))

    def insert_hint(self, context: list[int], hint: str) -> list[int]:
        """`context` (ending in the generation prompt) with a hint turn right before that prompt."""
        opening = self._opening
        if context[-len(opening):] != opening:
            raise ValueError("a hint goes before the generation prompt that ends the context, which this one lacks")
        turn = self.encode(self._diff([_user()], [_user(), _hint(hint)]))
        return context[:-len(opening)] + turn + opening

    def to_transformers(self):
        return self.hf


def _user() -> dict:
    return {"role": "user", "content": _USER}


_ANSWERED = [_user(), {"role": "assistant", "content": _ANSWER}]     # a conversation that ends in an answer


def _hint(text: str) -> dict:
    return {"role": "user", "content": HINT_PREFIX + text}
