"""kill -9 at random moments, inside checkpoint writes, on one rank of a two-rank ZeRO-3 run and on
one node of a two-node one: every resume ends with metrics.jsonl and rollouts.jsonl equal to an uninterrupted run's.

Each chain is one run killed again and again: a segment starts (fresh or resume=true), dies by
SIGKILL, and the next segment resumes it, until one finishes. Moments come from a seeded RNG:
either a named point inside a checkpoint save or the log's truncation (rl/failpoints.py: the
process kills itself there with a real SIGKILL), or a time (the test kills the process once the
run has logged a chosen number of steps plus a random delay). After every kill each `step_*`
folder must verify against its manifest (saves are atomic), and the resume must start from the
newest of them: what is lost is at most the steps since that checkpoint, and is counted.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CHILD_PYTHONPATH, ROOT, TINY
from rl.checkpoint import list_tags, verify

pytestmark = pytest.mark.slow

# 9 steps (3 warm-start + 6 RL), a checkpoint every 2 and at the end, two kept; the EMA teacher
# adds a file of the trainer's own to every checkpoint.
RUN = [o for o in TINY if not o.startswith(("trainer.steps", "trainer.checkpoint_every"))] + [
    "trainer.steps=6", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=2",
    "method.name=hint_distill", "method.teacher_weights=ema"]
LONG = ["trainer.steps=27"]    # 30 steps: room for ten kills at moments that move forward
TWO_RANKS = ["launcher.nproc_per_node=2", "deepspeed.zero_stage=3", "deepspeed.param_persistence_threshold=0"]
CHECKPOINT_POINTS = ["checkpoint.after_deepspeed", "checkpoint.after_trainer_files", "checkpoint.after_rank_state",
                     "checkpoint.after_manifest", "checkpoint.after_rename", "checkpoint.during_cleanup"]


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:       # the line a kill cut short
            pass
    return out


def _comparable(run_dir: Path) -> tuple[list, list]:
    metrics = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in _lines(run_dir / "metrics.jsonl")]
    return metrics, _lines(run_dir / "rollouts.jsonl")


class Chain:
    """One run under repeated kills: segments started by `start`, judged against `reference`."""

    def __init__(self, base: Path, name: str, extra: list[str], marker: str):
        self.base, self.name, self.extra, self.marker = base, name, extra, marker
        self.run_dir = base / "default" / name
        self.kills: list[dict] = []
        self.segments = 0

    def start(self, kill_at: str = "") -> subprocess.Popen:
        resume = ["resume=true"] if self.segments else []
        self.segments += 1
        env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1", HINTRL_KILL_AT=kill_at,
                   HINTRL_FAULT_TRIAL=self.marker)
        return subprocess.Popen([sys.executable, "-m", "rl.train", "experiments/default", *RUN, *self.extra,
                                 f"output_dir={self.base}", f"run_name={self.name}", *resume],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def after_kill(self, proc: subprocess.Popen, where: str) -> None:
        """The segment died: check the folder is consistent and note what the kill cost."""
        out, err = proc.communicate(timeout=300)
        assert proc.returncode != 0, f"segment meant to die at {where} finished:\n{err[-2000:]}"
        ckpt = self.run_dir / "checkpoints"
        tags = list_tags(ckpt)
        for tag in tags:
            assert verify(ckpt / tag) is None, f"after a kill at {where}: {tag} does not verify: {verify(ckpt / tag)}"
        logged = max((m["step"] for m in _lines(self.run_dir / "metrics.jsonl")), default=-1)
        resumes_at = int(tags[-1][5:]) if tags else 0
        self.kills.append({"where": where, "logged_step": logged, "resumes_at": resumes_at,
                           "steps_lost": max(0, logged - resumes_at)})

    def finish(self) -> None:
        proc = self.start()
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]


def _run_until_killed(proc: subprocess.Popen, where: str, chain: Chain) -> None:
    proc.wait(timeout=600)
    chain.after_kill(proc, where)


def _kill_after(chain: Chain, proc: subprocess.Popen, step: int, delay: float, rank: int | None) -> str:
    """SIGKILL the run (or one of its ranks) `delay` s after this segment logs step `step`
    (step -1: `delay` s after it starts, i.e. during start-up)."""
    metrics, started = chain.run_dir / "metrics.jsonl", time.time()
    while proc.poll() is None:
        fresh = metrics.exists() and metrics.stat().st_mtime > started
        if step < 0 or (fresh and max((m["step"] for m in _lines(metrics)), default=-1) >= step):
            time.sleep(delay)
            target = proc.pid if rank is None else _rank_pid(chain.marker, rank)
            if target is not None and proc.poll() is None:
                os.kill(target, signal.SIGKILL)
            break
        time.sleep(0.01)
    return f"after step {step} + {delay:.2f} s" + ("" if rank is None else f", rank {rank}")


def _resume_point(chain: Chain) -> int:
    tags = list_tags(chain.run_dir / "checkpoints")
    return int(tags[-1][5:]) if tags else 0


def _rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the trainer rank `rank` of the chain's run (found by the chain's marker)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"HINTRL_FAULT_TRIAL={marker}".encode() in env and f"RANK={rank}".encode() in env \
                and b"LOCAL_RANK=" + str(rank).encode() in env:
            return int(proc.name)
    return None


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    base = tmp_path_factory.mktemp("reference")
    done = {}
    for name, extra in (("one", []), ("long", LONG), ("two", TWO_RANKS)):
        chain = Chain(base, name, extra, f"ref-{name}")
        chain.finish()
        done[name] = _comparable(chain.run_dir)
    return done


def _judge(chain: Chain, reference, record, ranks: int) -> None:
    metrics, rollouts = _comparable(chain.run_dir)
    ref_metrics, ref_rollouts = reference
    assert [m["step"] for m in metrics] == [m["step"] for m in ref_metrics], "steps missing or repeated"
    assert metrics == ref_metrics, "metrics differ from the uninterrupted run"
    assert rollouts == ref_rollouts, "rollouts differ from the uninterrupted run"
    for kill in chain.kills:
        record("kill", "survived", ranks=ranks, **kill)


def test_kills_inside_checkpoint_writes_and_log_truncation(tmp_path, references, record):
    """Seven kills of one rank: at each point of a save, at a seeded checkpoint step after the
    point the run resumes from, and once while a resume truncates the logs."""
    rng = random.Random(20)
    chain = Chain(tmp_path, "points", [], "points")
    saves = [2, 4, 6, 8, 9]      # checkpoint_every=2 and the last step
    for i, point in enumerate(CHECKPOINT_POINTS):
        resume, tags = _resume_point(chain), len(list_tags(chain.run_dir / "checkpoints"))
        # a cleanup needs a tag to delete: more than keep_checkpoints=2 once that save is renamed
        ahead = [s for s in saves if s > resume and (point != "checkpoint.during_cleanup"
                                                      or tags + sum(resume < c <= s for c in saves) > 2)]
        step = rng.choice(ahead[:2])
        _run_until_killed(chain.start(f"{point}@{step}"), f"{point}@{step}", chain)
        if i == 2:
            _run_until_killed(chain.start("runlog.before_replace"), "runlog.before_replace", chain)
    chain.finish()
    assert len(chain.kills) == 7
    _judge(chain, references["one"], record, ranks=1)


def test_kills_at_random_moments(tmp_path, references, record):
    """Ten kills of one run at seeded moments, from start-up (before anything is logged: the run
    starts over) to the last steps."""
    rng = random.Random(21)
    chain = Chain(tmp_path, "timed", LONG, "timed")
    for i in range(10):
        step = -1 if i == 0 else min(_resume_point(chain) + rng.randint(1, 3), 28)
        delay = rng.uniform(0.5, 3.0) if step < 0 else rng.uniform(0.0, 0.05)   # steps take ~50 ms
        proc = chain.start()
        where = _kill_after(chain, proc, step, delay, rank=None)
        proc.wait(timeout=600)
        assert proc.returncode != 0, f"the kill {where} landed after the run finished"
        chain.after_kill(proc, where)
    chain.finish()
    _judge(chain, references["long"], record, ranks=1)


def test_kills_of_one_rank_of_a_two_rank_zero3_run(tmp_path, references, record):
    """Four kills of one rank of two (ZeRO-3): inside saves on rank 1, at seeded times on either."""
    rng = random.Random(22)
    chain = Chain(tmp_path, "zero3", TWO_RANKS, "zero3")
    _run_until_killed(chain.start("checkpoint.after_deepspeed@4#1"), "checkpoint.after_deepspeed@4#1", chain)
    for rank in (rng.choice([0, 1]), 1):
        proc = chain.start()
        step = rng.randint(_resume_point(chain) + 1, 7)
        where = _kill_after(chain, proc, step, rng.uniform(0.0, 0.3), rank=rank)
        proc.wait(timeout=600)
        chain.after_kill(proc, where)
    step = min(c for c in (2, 4, 6, 8, 9) if c > _resume_point(chain))
    point = f"checkpoint.after_rank_state@{step}#1"
    _run_until_killed(chain.start(point), point, chain)
    chain.finish()
    assert len(chain.kills) == 4
    _judge(chain, references["two"], record, ranks=2)


def _two_nodes(base: Path, kill_at: str, resume: bool) -> list[subprocess.Popen]:
    """The ZeRO-3 run as two torchrun nodes of one rank each on 127.0.0.1 (a fresh port per
    segment: the last one's may still be held); node 1 gets the failpoint."""
    from rl.distributed import free_port

    port = free_port()
    return [subprocess.Popen(
        [sys.executable, "-m", "rl.train", "experiments/default", *RUN, *TWO_RANKS, "launcher.nproc_per_node=1",
         "launcher.nnodes=2", f"launcher.node_rank={node}", "launcher.master_addr=127.0.0.1",
         f"launcher.master_port={port}", f"output_dir={base}", "run_name=nodes", *(["resume=true"] if resume else [])],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1",
                           HINTRL_KILL_AT=kill_at if node == 1 else "", HINTRL_FAULT_TRIAL="nodes"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]


def test_kill_of_one_nodes_rank_in_a_two_node_run(tmp_path, references, record):
    """Node 1's rank dies by SIGKILL inside a save; node 0's stops with it rather than hang; both
    nodes resume, and the run equals the one-node two-rank one."""
    chain = Chain(tmp_path, "nodes", TWO_RANKS, "nodes")
    point = "checkpoint.after_deepspeed@4#1"
    nodes = _two_nodes(tmp_path, point, resume=False)
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert all(node.returncode != 0 for node in nodes), outputs[0][-2000:] + outputs[1][-2000:]
    ckpt = chain.run_dir / "checkpoints"
    assert all(verify(ckpt / tag) is None for tag in list_tags(ckpt))
    assert _resume_point(chain) == 2          # the save at step 4 died before its manifest
    logged = max((m["step"] for m in _lines(chain.run_dir / "metrics.jsonl")), default=-1)
    chain.kills.append({"where": f"{point}, node 1 of 2", "logged_step": logged, "resumes_at": 2,
                        "steps_lost": max(0, logged - 2)})
    nodes = _two_nodes(tmp_path, "", resume=True)
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    _judge(chain, references["two"], record, ranks=2)
