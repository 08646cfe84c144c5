"""Teacher prompts for language-model teachers: a template file in, chat messages out; the
model's reply in, a `Hint` (or a counted failure) out.

A template is plain text with placeholders; lines `### system`, `### user` and `### assistant`
split it into chat messages (few-shot turns work far better than prose for small models); a
file without them is one user message. Placeholders:

    {problem}    the first user message          {attempt}    the last assistant message
    {feedback}   the verifier's words            {reference}  the reference answer (teacher only)
    {messages}   the numbered trajectory, "[1] user: ..." one per line
    {targets}    the numbers of the assistant messages a hint may target, "2" or "2, 4"

The reply format is two lines, `MESSAGE: <n>` and `HINT: <text>` (a JSON object with "message"
and "hint" is accepted too). MESSAGE may be left out when only one assistant message exists. A
reply without a hint, or whose MESSAGE does not name an assistant message, is malformed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from teacher.base import Hint, HintRequest, message_text

DEFAULT_TEMPLATE = Path(__file__).parent / "prompts" / "default.txt"
PLACEHOLDERS = ("problem", "attempt", "feedback", "reference", "messages", "targets")
_ROLE_LINE = re.compile(r"^###\s*(system|user|assistant)\s*$", re.M)
_FIELD = re.compile(r"\{([a-z_]{3,})\}")
_MESSAGE = re.compile(r"\bmessage\W*?(?:number|no\.?|#)?\s*[:=]?\s*\[?(\d+)", re.I)
_HINT = re.compile(r"\bhint\s*\**\s*[:=\-]\s*(.*\S)", re.I)


class PromptTemplate:
    def __init__(self, text: str, source: str = "<template>"):
        unknown = sorted({m for m in _FIELD.findall(text) if m not in PLACEHOLDERS})
        if unknown:
            raise ValueError(f"{source}: unknown placeholder(s) {unknown}; known: {list(PLACEHOLDERS)}")
        if "{messages}" not in text and "{attempt}" not in text:
            raise ValueError(f"{source}: a teacher prompt must show the attempt ({{messages}} or {{attempt}})")
        self.text, self.source = text, source

    @classmethod
    def load(cls, path: str | Path | None) -> "PromptTemplate":
        path = Path(path) if path else DEFAULT_TEMPLATE
        return cls(path.read_text(), str(path))

    def render(self, req: HintRequest) -> list[dict]:
        """Chat messages for one request."""
        values = {
            "problem": next((m["content"] for m in req.messages if m["role"] == "user"), ""),
            "attempt": next((message_text(m) for m in reversed(req.messages) if m["role"] == "assistant"), ""),
            "feedback": req.feedback,
            "reference": req.reference if req.reference is not None else "(not given)",
            "messages": "\n".join(f"[{i + 1}] {m['role']}: {message_text(m)}" for i, m in enumerate(req.messages)),
            "targets": ", ".join(str(i + 1) for i, m in enumerate(req.messages) if m["role"] == "assistant"),
        }
        text = _FIELD.sub(lambda m: values[m.group(1)], self.text)
        parts = _ROLE_LINE.split(text)
        if len(parts) == 1:
            return [{"role": "user", "content": text.strip()}]
        return [{"role": parts[i], "content": parts[i + 1].strip()} for i in range(1, len(parts), 2)]


def _from_json(reply: str) -> tuple[str | None, str | None]:
    start, end = reply.find("{"), reply.rfind("}")
    if start < 0 or end < start:
        return None, None
    try:
        obj = json.loads(reply[start:end + 1])
    except json.JSONDecodeError:
        return None, None
    if not isinstance(obj, dict) or not isinstance(obj.get("hint"), str):
        return None, None
    message = obj.get("message")
    return (str(message) if message is not None else None), obj["hint"]


def parse_reply(reply: str, req: HintRequest, max_chars: int) -> Hint:
    """The reply's hint, or Hint(-1, "", "malformed", reply) when it cannot be read."""
    message, text = _from_json(reply)
    if text is None:
        hint_m, message_m = _HINT.search(reply), _MESSAGE.search(reply)
        text = hint_m.group(1) if hint_m else None
        message = message_m.group(1) if message_m else None
    text = (text or "").strip().strip("\"'`*").strip()
    assistants = [i for i, m in enumerate(req.messages) if m["role"] == "assistant"]
    if message is None:
        target = assistants[0] if len(assistants) == 1 else None
    else:
        n = int(message) - 1 if str(message).strip().isdigit() else -1
        target = n if n in assistants else None
    if not text or target is None:
        return Hint(-1, "", error="malformed", reply=reply)
    return Hint(target, text[:max_chars], reply=reply)
