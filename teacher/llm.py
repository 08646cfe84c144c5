"""What every language-model teacher shares: prompt, de-duplication, reply parsing.

A backend (teacher/hf.py, teacher/openai_api.py) only turns chat prompts into reply texts:
`complete(chats) -> list[str | NoReply]`, a `NoReply` naming the fault when no reply came (the
endpoint failed; teacher.base.TEACHER_FAULTS). This class
renders each request with the prompt template, sends each distinct prompt once (a group of G
attempts often repeats the same wrong answer), reuses greedy replies across calls (the same
request always gets the same greedy reply), and parses replies into hints.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from teacher.base import Hint, HintRequest, TeacherConfig
from teacher.prompt import PromptTemplate, parse_reply

_CACHE_ENTRIES = 4096


@dataclass(frozen=True)
class NoReply:
    """What a backend returns for a prompt that got no reply, and why (a TEACHER_FAULTS name)."""
    fault: str


class ChatTeacher:
    def __init__(self, cfg: TeacherConfig):
        self.cfg = cfg
        self.template = PromptTemplate.load(cfg.prompt_template or None)
        self._replies: OrderedDict[str, str] = OrderedDict()   # greedy replies by prompt

    def complete(self, chats: list[list[dict]]) -> list[str | NoReply]:
        raise NotImplementedError

    def write_hints(self, requests: list[HintRequest]) -> list[Hint | None]:
        chats = [self.template.render(r) for r in requests]
        if self.cfg.temperature > 0:          # sampled: every request gets its own reply
            replies = self.complete(chats) if chats else []
        else:
            keys = [json.dumps(c, sort_keys=True) for c in chats]
            chat_of = dict(zip(keys, chats))                    # distinct prompts, in order
            known = {k: self._replies[k] for k in chat_of if k in self._replies}
            todo = [k for k in chat_of if k not in known]
            if todo:
                known.update(zip(todo, self.complete([chat_of[k] for k in todo])))
            for key in todo:
                if isinstance(known[key], str):       # a failure is asked again next time
                    self._remember(key, known[key])
            replies = [known[k] for k in keys]
        return [Hint(-1, "", error="teacher_error", fault=reply.fault) if isinstance(reply, NoReply)
                else parse_reply(reply, req, self.cfg.max_hint_chars)
                for req, reply in zip(requests, replies)]

    def _remember(self, key: str, reply: str) -> None:
        self._replies[key] = reply
        self._replies.move_to_end(key)
        while len(self._replies) > _CACHE_ENTRIES:
            self._replies.popitem(last=False)
