"""Disk and file trouble through the real CLI: a disk that fills up during a checkpoint, a
read-only or vanished output folder, corrupted checkpoint files, and a checkpoint carrying a
malicious pickle. Each stops with one clear line (no traceback) or is detected and skipped, and
what was good before stays usable."""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import CHILD_PYTHONPATH, ROOT, TINY, run_cli
from rl.checkpoint import MANIFEST, list_tags, verify

pytestmark = pytest.mark.slow

RUN = TINY + ["trainer.steps=4", "trainer.checkpoint_every=2", "deepspeed.zero_stage=2"]   # 7 steps; tags 2, 4, 6, 7


def _metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _one_clear_line(err: str, prefix: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@contextlib.contextmanager
def _tmpfs(path: Path, size: int, read_only: bool = False):
    """A real small file system (needs root, as CI's container has); skipped without it."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("reference")
    out = run_cli(["experiments/default", *RUN, f"output_dir={base}", "run_name=r"])
    assert out.returncode == 0, out.stderr[-3000:]
    return base / "default" / "r"


@pytest.fixture
def finished_run(reference, tmp_path):
    """A copy of the reference run (all its checkpoints complete) to damage."""
    run_dir = tmp_path / "default" / "r"
    shutil.copytree(reference, run_dir)
    return run_dir


# ---------------------------------------------------------------- a disk that fills up

def test_disk_full_during_a_checkpoint_stops_cleanly_and_keeps_the_last_one(reference, tmp_path, record):
    """The run folder on a tmpfs big enough for the logs and one and a half checkpoints: the first
    save fits, the second cannot (the old tag goes only after the new one is complete)."""
    ckpt = reference / "checkpoints"
    one = sum(f.stat().st_size for f in (ckpt / list_tags(ckpt)[-1]).rglob("*") if f.is_file())
    logs = sum(f.stat().st_size for f in reference.rglob("*") if f.is_file() and "checkpoints" not in f.parts)
    size = ((logs + 3 * one // 2 + 64 * 1024) // 4096) * 4096   # + page rounding of a dozen files
    with _tmpfs(tmp_path / "disk", size) as disk:
        out = run_cli(["experiments/default", *RUN, f"output_dir={disk}", "run_name=r", "trainer.keep_checkpoints=1"])
        assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
        line = _one_clear_line(out.stderr, "checkpoint error:")
        run_dir = disk / "default" / "r"
        tags = list_tags(run_dir / "checkpoints")
        assert "the disk is full" in line and str(run_dir / "checkpoints") in line and "MiB are free" in line, line
        assert tags and f"{run_dir / 'checkpoints' / tags[-1]} is intact" in line, line
        assert verify(run_dir / "checkpoints" / tags[-1]) is None
        assert not list((run_dir / "checkpoints").glob("partial-*")), "the failed save's files were left behind"
        # more space (as after freeing some): resume continues from the kept checkpoint
        subprocess.run(["mount", "-o", "remount,size=256m", str(disk)], check=True)
        resumed = run_cli(["experiments/default", *RUN, f"output_dir={disk}", "run_name=r", "resume=true"])
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert _metrics(run_dir) == _metrics(reference)
    record("disk", "survived", fault=f"tmpfs of {size} bytes filled during {line.split()[3]}",
           stopped_with=line, resumed_from=tags[-1])


# ---------------------------------------------------------------- the output folder

def test_read_only_output_folder_is_one_clear_line(tmp_path, record):
    with _tmpfs(tmp_path / "ro", 1 << 20, read_only=True) as ro:
        out = run_cli(["experiments/default", *RUN, f"output_dir={ro}", "run_name=r"])
    assert out.returncode == 1
    line = _one_clear_line(out.stderr, "run folder error:")
    assert "Read-only file system" in line and str(ro) in line, line
    record("output_folder", "rejected", fault="read-only output folder", message=line)


def test_output_folder_deleted_mid_run_is_one_clear_line(tmp_path, record):
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    run_dir = tmp_path / "default" / "r"
    # Saves at step 5 and 10: the folder goes right after the first, well before the second.
    proc = subprocess.Popen([sys.executable, "-m", "rl.train", "experiments/default", *RUN, "trainer.steps=40",
                             "trainer.checkpoint_every=5", f"output_dir={tmp_path}", "run_name=r"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if list_tags(run_dir / "checkpoints"):
            # at once, as `mv` + `rm` or a deleted mount does (an `rm -rf` racing the run's own
            # appends can leave a half-deleted folder the run goes on writing to: not this test)
            gone = tmp_path / "gone"
            os.rename(run_dir, gone)
            shutil.rmtree(gone)
            break
        time.sleep(0.02)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    line = _one_clear_line(err, "run folder error:")
    assert "was deleted while the run was going" in line, line
    assert not run_dir.exists(), "the run quietly started a new run folder"
    record("output_folder", "rejected", fault="run folder deleted mid-run", message=line)


# ---------------------------------------------------------------- corrupted checkpoint files

def _truncate(f: Path):
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip_bit(f: Path):
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated optimizer states": ("zero_pp_rank_0_mp_rank_00_optim_states.pt", _truncate, "truncated"),
    "bit flip in model states": ("mp_rank_00_model_states.pt", _flip_bit, "checksum mismatch"),
    "bit flip in RNG states": ("rng_rank0.safetensors", _flip_bit, "checksum mismatch"),
    "bit flip in trainer state": ("state_rank0.json", _flip_bit, "checksum mismatch"),
    "deleted model states": ("mp_rank_00_model_states.pt", lambda f: f.unlink(), "missing"),
    "deleted manifest": (MANIFEST, lambda f: f.unlink(), f"no {MANIFEST}"),
    "garbled manifest": (MANIFEST, _truncate, "unreadable"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_each_corruption_is_detected_by_the_manifest(finished_run, kind, record):
    tag = finished_run / "checkpoints" / list_tags(finished_run / "checkpoints")[-1]
    name, damage, said = CORRUPTIONS[kind]
    assert verify(tag) is None
    damage(tag / name)
    problem = verify(tag)
    assert problem is not None and said in problem, problem
    record("corrupt_checkpoint", "detected", fault=kind, file=name, said=problem)


@pytest.mark.parametrize("kind", ["truncated optimizer states", "bit flip in model states"])
def test_resume_skips_a_corrupted_checkpoint_and_ends_as_the_uninterrupted_run(finished_run, reference, kind, record):
    """The newest tag damaged: resume warns in one line naming the file, falls back to the tag
    before, redoes the last step and ends equal to the run that was never damaged."""
    ckpt = finished_run / "checkpoints"
    newest, before = list_tags(ckpt)[-1], list_tags(ckpt)[-2]
    name, damage, said = CORRUPTIONS[kind]
    damage(ckpt / newest / name)
    run_dir = finished_run
    out = run_cli(["experiments/default", *RUN, f"output_dir={run_dir.parents[1]}", "run_name=r", "resume=true"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    warning = [line for line in out.stderr.splitlines() if "unusable" in line]
    assert len(warning) == 1 and name in warning[0] and said in warning[0], out.stderr[-2000:]
    assert f"resuming from {ckpt / before}" in out.stderr
    assert (ckpt / f"unusable-{newest}").is_dir() and verify(ckpt / newest) is None
    assert _metrics(run_dir) == _metrics(reference)
    record("corrupt_checkpoint", "survived", fault=kind, fell_back_to=before)


def test_every_checkpoint_unusable_is_an_error_not_a_restart(finished_run, record):
    ckpt = finished_run / "checkpoints"
    for tag in list_tags(ckpt):
        _flip_bit(ckpt / tag / "mp_rank_00_model_states.pt")
    out = run_cli(["experiments/default", *RUN, f"output_dir={finished_run.parents[1]}", "run_name=r", "resume=true"])
    assert out.returncode == 1
    line = _one_clear_line(out.stderr, "checkpoint error:")
    assert "no usable checkpoint" in line and "checksum mismatch" in line, line
    record("corrupt_checkpoint", "detected", fault="every checkpoint bit-flipped", said=line)


# ---------------------------------------------------------------- a malicious pickle

class _RunsCode:
    """Unpickling this runs a shell command (what a checkpoint from a stranger could hold)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _plant(tag: Path, marker: Path, fix_manifest: bool) -> None:
    target = tag / "mp_rank_00_model_states.pt"
    state = torch.load(target, weights_only=False)     # our own file, to keep the rest of it real
    state["payload"] = _RunsCode(marker)
    torch.save(state, target)
    if fix_manifest:   # as a checkpoint handed over whole would be: its manifest matches
        from rl.checkpoint import _digest

        manifest = json.loads((tag / MANIFEST).read_text())
        manifest["files"][target.name] = {"bytes": target.stat().st_size, "blake2b": _digest(target)}
        (tag / MANIFEST).write_text(json.dumps(manifest))


def test_the_planted_pickle_would_run_code(finished_run, tmp_path):
    """The payload is live: a plain torch.load(weights_only=False) runs it (so the tests below
    show a refusal, not a dud)."""
    marker = tmp_path / "ran"
    tag = finished_run / "checkpoints" / list_tags(finished_run / "checkpoints")[-1]
    _plant(tag, marker, fix_manifest=False)
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(tag / 'mp_rank_00_model_states.pt')!r}, "
                    "weights_only=False)"], check=True, cwd=ROOT)
    assert marker.exists()


def test_a_malicious_pickle_is_refused_not_run(finished_run, tmp_path, record):
    """Planted with a matching manifest: resume and export refuse it with one line naming the file
    and the global; the command never runs."""
    marker = tmp_path / "ran"
    tag = finished_run / "checkpoints" / list_tags(finished_run / "checkpoints")[-1]
    _plant(tag, marker, fix_manifest=True)
    out = run_cli(["experiments/default", *RUN, "trainer.steps=6", f"output_dir={finished_run.parents[1]}",
                   "run_name=r", "resume=true"])
    assert out.returncode == 1, out.stderr[-3000:]
    line = _one_clear_line(out.stderr, "checkpoint error:")
    assert "refused to load" in line and "system" in line and str(tag) in line, line
    assert not marker.exists(), "the pickle ran"
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    export = subprocess.run([sys.executable, "-m", "rl.export", str(finished_run), str(tmp_path / "export")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert export.returncode == 1
    assert "refused to load" in _one_clear_line(export.stderr, "export error:")
    assert not marker.exists(), "the pickle ran"
    record("pickle", "rejected", fault="os.system in model states, manifest matching", said=line)


def test_a_malicious_pickle_without_a_matching_manifest_is_skipped(finished_run, tmp_path, record):
    marker = tmp_path / "ran"
    ckpt = finished_run / "checkpoints"
    _plant(ckpt / list_tags(ckpt)[-1], marker, fix_manifest=False)
    out = run_cli(["experiments/default", *RUN, f"output_dir={finished_run.parents[1]}", "run_name=r", "resume=true"])
    assert out.returncode == 0, out.stderr[-3000:]
    warning = [line for line in out.stderr.splitlines() if "unusable" in line]
    assert len(warning) == 1 and "mp_rank_00_model_states.pt" in warning[0], out.stderr[-2000:]
    assert not marker.exists(), "the pickle ran"
    record("pickle", "detected", fault="os.system in model states, manifest not matching")
