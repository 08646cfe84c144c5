"""The teacher protocol: chat messages + verifier feedback in, `Hint(target_index, text)` out.

The teacher package knows nothing of training: it sees plain chat messages (dicts with "role"
and "content"), the verifier's feedback text and, when the task has one, the reference answer,
which a teacher may read but must never reveal (see `teacher.leak`).

Teachers: `rule` (offline default, teacher/rule.py), `dataset` (the problem's own human-written
hints, teacher/dataset.py), `hf` (a local transformers model, teacher/hf.py) and `openai` (any
OpenAI-compatible chat endpoint, teacher/openai_api.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from student.registry import Registry


@dataclass
class HintRequest:
    messages: list[dict]          # OpenAI chat messages: user, assistant (maybe with tool_calls), tool
    feedback: str                 # the verifier's words about the attempt
    reference: str | None = None  # reference answer, for the teacher's eyes only
    hints: list[str] = field(default_factory=list)   # the problem's own human-written hints, if its task has them
    first_wrong: int | None = None   # a per-step verifier's pick: index of the first message that went wrong
    expected: str = ""            # what that message should have been (teacher's eyes only)
    decoys: list[str] = field(default_factory=list)  # hints stating something wrong, for a control (teacher.decoy)


@dataclass
class Hint:
    """A hint for one message, or why there is none: a failed hint keeps its reason and the raw
    model reply, so the run can count it and log it (text is then "")."""
    target_index: int             # index into HintRequest.messages of the message to redo; -1 on error
    text: str
    error: str = ""               # "" | "malformed" (unparseable reply) | "teacher_error" (no reply)
    reply: str = ""               # a language-model teacher's raw reply
    fault: str = ""               # teacher_error: why no reply came, one of TEACHER_FAULTS


# Why a teacher gave no reply (`Hint.fault`), as teacher/openai_api.py classifies a failed request.
# The run counts each as hint/teacher_errors/<fault>; together they make hint/teacher_errors.
TEACHER_FAULTS = ("timeout", "http_5xx", "http_4xx", "malformed_reply", "connection_cut", "refused",
                  "skipped", "other")


@dataclass
class TeacherConfig:
    kind: str = "rule"            # key of TEACHERS
    max_hint_chars: int = 80      # longer hints are cut: a hint is a nudge, not a solution
    reveal: str = "mismatch"      # rule: "mismatch" = prefix through the first wrong character; "all_but_last"
    shuffle: bool = False         # control: each attempt gets the hint written for another problem (teacher/shuffled.py)
    decoy: bool = False           # dataset: control: the problem's decoy hint (a wrong rule, rl/hidden_rule.py), not its hint
    # Language-model teachers (hf, openai)
    prompt_template: str = ""     # file; relative = to the experiment folder; "" = teacher/prompts/default.txt
    model: str = ""               # hf: HF folder or .gguf file (pkg://DIST/FILE for a packaged one); openai: served name
    gguf_file: str = ""           # hf: a GGUF file inside the `model` folder
    max_new_tokens: int = 48      # reply length bound (MESSAGE line + one short hint)
    temperature: float = 0.0      # 0 = greedy (replies to identical requests are then reused)
    batch_size: int = 64          # hf: prompts per generate call (KV memory ~ batch x prompt length)
    prefix_cache: bool = True     # hf: prefill the prompts' shared prefix once, reuse its KV cache
    device: str = "cpu"           # hf: torch device of the teacher model
    base_url: str = ""            # openai: e.g. http://127.0.0.1:8000/v1
    api_key_env: str = ""         # openai: environment variable holding the key ("" = none)
    concurrency: int = 8          # openai: requests in flight
    timeout_s: float = 30.0       # openai: per try, for the whole reply
    retries: int = 2              # openai: extra tries per request, with exponential backoff
    backoff_s: float = 0.5        # openai: first backoff; doubles each retry
    cooldown_s: float = 30.0      # openai: after repeated failures, skip the endpoint this long

    def check(self) -> list[str]:
        """Problems beyond a key's type, each naming its key (the kind is the registry's to check)."""
        import torch

        problems = []
        if self.reveal not in ("mismatch", "all_but_last"):
            problems.append(f"teacher.reveal={self.reveal!r} is not valid; choose one of ['all_but_last', 'mismatch']")
        if self.decoy and self.kind != "dataset":
            problems.append(f"teacher.decoy=true is the dataset teacher's control (a task's decoy hints); "
                            f"teacher.kind={self.kind!r} writes its own")
        if self.kind == "hf" and not self.model:
            problems.append("teacher.kind=hf needs teacher.model (a Hugging Face folder or a .gguf file)")
        if self.kind == "openai" and not (self.base_url and self.model):
            problems.append("teacher.kind=openai needs teacher.base_url (e.g. http://127.0.0.1:8000/v1) "
                            "and teacher.model (the served name)")
        try:
            torch.device(self.device)
        except (RuntimeError, ValueError, TypeError):
            problems.append(f"teacher.device={self.device!r} is not a torch device (e.g. cpu, cuda, cuda:1)")
        return problems


class Teacher(Protocol):
    def write_hints(self, requests: list[HintRequest]) -> list[Hint | None]:
        """One hint (or None: nothing useful to say) per request, in order."""
        ...


# teacher.kind -> the class (student/registry.py): a new kind is its file and one line here
TEACHERS: Registry[Callable[[TeacherConfig], Teacher]] = Registry("teacher.kind", {
    "rule": "teacher.rule:RuleTeacher",
    "dataset": "teacher.dataset:DatasetTeacher",
    "hf": "teacher.hf:HFTeacher",
    "openai": "teacher.openai_api:OpenAITeacher",
})


def message_text(message: dict) -> str:
    """A message's text: its content, or an assistant's tool calls as name + JSON arguments (how
    the student's chat layout writes a call, student/tokenizer.py)."""
    calls = message.get("tool_calls") or []
    if calls:
        return "".join(c["function"]["name"] + c["function"]["arguments"] for c in calls)
    return message.get("content") or ""


def target_index(req: HintRequest) -> int:
    """The message a hint should be about: the verifier's first wrong assistant message when it
    named one, else the last assistant message."""
    if req.first_wrong is not None and req.messages[req.first_wrong]["role"] == "assistant":
        return req.first_wrong
    return last_assistant_index(req.messages)


def last_assistant_index(messages: list[dict]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return i
    raise ValueError("a hint request needs at least one assistant message to target")
