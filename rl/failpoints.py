"""Named points where the fault-injection suite (tests/faults/) kills this process with SIGKILL.

    HINTRL_KILL_AT=checkpoint.after_manifest@6#1    kill rank 1 at that point of step 6's save

`name[@step][#rank]`, several separated by commas. Unset (always, outside those tests) a point
costs one dict lookup. The kill is a real `kill -9` of this process, so what a test sees after it
is what a cluster's OOM killer or preemption leaves behind; the points only choose the moment,
since the windows they sit in (between two files of a checkpoint) are too short to hit by timing.
"""
from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("HINTRL_KILL_AT", "")


def _matches(entry: str, name: str, step: int | None, rank: int) -> bool:
    entry, _, want_rank = entry.partition("#")
    entry, _, want_step = entry.partition("@")
    return (entry == name and (not want_step or step == int(want_step))
            and (not want_rank or rank == int(want_rank)))


def reach(name: str, step: int | None = None) -> None:
    """Die here if HINTRL_KILL_AT names this point (and step, and this process's rank)."""
    if not _SPEC:
        return
    rank = int(os.environ.get("RANK", "0"))
    if any(_matches(entry.strip(), name, step, rank) for entry in _SPEC.split(",")):
        os.kill(os.getpid(), signal.SIGKILL)
