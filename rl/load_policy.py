"""Load a trained student as a policy, from any of the three folders a run leaves:

    load_policy("runs/default/RUN")                               the run's newest complete checkpoint
    load_policy("runs/default/RUN/checkpoints/step_0000600")      that checkpoint
    load_policy("runs/default/RUN/hf")                            an export folder (rl/export.py)

-> Loaded(policy, cfg, tok, model, description): the policy (student/policy.py) over the model in
eval mode, the run's config, the byte tokenizer, the model, and one line saying what was loaded.

The config is the run's own resolved `config.yaml` for a run or checkpoint folder. For an export
folder it is the `hintrl_config.yaml` rl/export.py writes beside the weights; an export without one
(an older hintrl) takes the `experiment` folder it was trained with, or the config of the run folder
it sits in (`trainer.export_to`, or this module's own cache). `overrides` ("key=value") go on top.

A checkpoint is DeepSpeed's state; the model is built the way `student.checkpoint` builds it, from
an export: the checkpoint is verified against its manifest (rl/checkpoint.py), exported once into
`RUN/exports/step_NNNNNNN/` (rl.export.export; reused while it matches the checkpoint's manifest),
and loaded from there with the run's student settings (`build_student`). So what is loaded here is
exactly what `python -m rl.export` and `student.checkpoint=` give.

Every problem (no checkpoint, a checkpoint that does not verify, a folder that is none of the
three, an export folder without a config) is a `PolicyLoadError` of one line naming the path.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from rl.checkpoint import MANIFEST, list_tags, verify
from rl.config import RunConfig
from rl.configure import load_config
from rl.runlog import is_run_folder
from student.tokenizer import ByteTokenizer

EXPORT_CONFIG = "hintrl_config.yaml"      # the run's resolved config, written into an export folder
EXPORTS = "exports"                       # the cache of exported checkpoints inside a run folder
SOURCE = "hintrl_source.json"             # in a cached export: the checkpoint it came from


class PolicyLoadError(ValueError):
    """A folder that cannot be loaded as a policy; the message is one line naming the path."""


@dataclass
class Loaded:
    policy: object                # student.policy.Policy
    cfg: RunConfig
    tok: ByteTokenizer
    model: torch.nn.Module
    description: str              # what was loaded, from where, with which config




def _is_export_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _checkpoint_of(path: Path) -> tuple[Path, str] | None:
    """(run folder, tag) when `path` is RUN/checkpoints/step_NNNNNNN."""
    if path.parent.name == "checkpoints" and path.name.startswith("step_") and path.name in list_tags(path.parent):
        return path.parent.parent, path.name
    return None


def _run_config(run_dir: Path, overrides) -> RunConfig:
    if not (run_dir / "config.yaml").is_file():
        raise PolicyLoadError(f"{run_dir}: no config.yaml (not a run folder)")
    return load_config(run_dir, list(overrides))


def _manifest_digest(ckpt: Path) -> str:
    return hashlib.sha256((ckpt / MANIFEST).read_bytes()).hexdigest()[:16]


def _newest_verified(run_dir: Path) -> str:
    tags = list_tags(run_dir / "checkpoints")
    if not tags:
        raise PolicyLoadError(f"{run_dir}: no complete checkpoint in {run_dir / 'checkpoints'}")
    problems = []
    for tag in reversed(tags):
        problem = verify(run_dir / "checkpoints" / tag)
        if problem is None:
            for bad, why in problems:
                print(f"[load_policy] {run_dir / 'checkpoints' / bad} does not verify ({why}); "
                      f"using {tag}", file=sys.stderr)
            return tag
        problems.append((tag, problem))
    raise PolicyLoadError(f"{run_dir}: no checkpoint verifies: "
                          + "; ".join(f"{tag}: {why}" for tag, why in problems))


def cached_export(run_dir: Path, tag: str) -> Path:
    """RUN/exports/<tag>: the checkpoint exported by rl.export (done once; again only when the
    checkpoint's manifest changed, e.g. the step was saved anew). Written aside and renamed into
    place, so a folder there is always whole."""
    ckpt = run_dir / "checkpoints" / tag
    problem = verify(ckpt)
    if problem:
        raise PolicyLoadError(f"{ckpt}: does not verify: {problem}")
    digest = _manifest_digest(ckpt)
    out = run_dir / EXPORTS / tag
    try:
        if json.loads((out / SOURCE).read_text()).get("manifest_sha256") == digest and _is_export_dir(out):
            return out
    except (OSError, ValueError):
        pass
    try:
        out.parent.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".partial-{tag}-", dir=out.parent))
    except OSError as err:                  # a run folder we may not write (someone else's runs)
        tmp = Path(tempfile.mkdtemp(prefix=f"hintrl-export-{tag}-"))
        print(f"[load_policy] cannot cache the export in {out.parent} ({err.strerror or err}); "
              f"exporting to {tmp}, not kept", file=sys.stderr)
        _export(run_dir, tmp, tag)
        return tmp
    try:
        _export(run_dir, tmp, tag)
        (tmp / SOURCE).write_text(json.dumps({"checkpoint": str(ckpt), "manifest_sha256": digest}) + "\n")
        if out.exists():                    # a stale export of an earlier save of this step
            stale = out.with_name(f".stale-{tag}-{os.getpid()}")
            os.replace(out, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:
            if not _is_export_dir(out):     # another process put its (equal) export there first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _export(run_dir: Path, out: Path, tag: str) -> None:
    from rl.export import export

    try:
        export(run_dir, out, int(tag.split("_")[1]))
    except (OSError, RuntimeError) as err:     # CheckpointError, UnsafeCheckpointError, a state that does not fit
        message = (str(err).splitlines() or [type(err).__name__])[0]
        raise PolicyLoadError(f"{run_dir / 'checkpoints' / tag}: cannot export it ({message})") from None


def _export_config(path: Path, experiment, overrides) -> tuple[RunConfig, str]:
    own = path / EXPORT_CONFIG
    if own.is_file():
        if experiment is not None:
            print(f"[load_policy] {path} holds its own {EXPORT_CONFIG}; experiment={experiment} is not used",
                  file=sys.stderr)
        return load_config(own, list(overrides)), str(own)
    if experiment is not None:
        return load_config(experiment, list(overrides)), f"experiment {experiment}"
    for parent in (path.parent, path.parent.parent):      # trainer.export_to, or RUN/exports/<tag>
        if is_run_folder(parent):
            return _run_config(parent, overrides), str(parent / "config.yaml")
    raise PolicyLoadError(f"{path}: an export folder without {EXPORT_CONFIG} (exported by an older hintrl) "
                          "and not inside a run folder; name the experiment folder it was trained with")


def load_policy(path: str | Path, experiment: str | Path | None = None, overrides=(),
                device: str | torch.device | None = None) -> Loaded:
    """The policy of a run folder (its newest complete checkpoint), a checkpoint folder or an export
    folder; `experiment` is read only for an export folder that has no config of its own. `device`:
    default CUDA when there is one, else the CPU."""
    from student.model import build_student
    from student.build import build_policy

    path = Path(path)
    if not path.is_dir():
        raise PolicyLoadError(f"{path}: no such folder")
    tok = ByteTokenizer()
    if path.name == "checkpoints" and is_run_folder(path.parent):
        path = path.parent
    checkpoint = _checkpoint_of(path)
    if _is_export_dir(path):
        cfg, config_from = _export_config(path, experiment, overrides)
        model_dir, what = path, f"export {path}"
    elif checkpoint is not None or is_run_folder(path):
        run_dir, tag = checkpoint if checkpoint is not None else (path, None)
        cfg = _run_config(run_dir, overrides)
        config_from = str(run_dir / "config.yaml")
        if tag is None:
            tag = _newest_verified(run_dir)
        model_dir = cached_export(run_dir, tag)
        what = f"checkpoint {run_dir / 'checkpoints' / tag} (exported to {model_dir})"
    elif path.parent.name == "checkpoints":
        raise PolicyLoadError(f"{path}: not a complete checkpoint (a save that did not finish, or one moved aside)")
    else:
        raise PolicyLoadError(f"{path}: not a run folder (config.yaml + checkpoints/), a checkpoint folder "
                              "(RUN/checkpoints/step_NNNNNNN) or an export folder (config.json)")
    try:
        model = build_student(dataclasses.replace(cfg.student, checkpoint=str(model_dir)), tok)
    except (OSError, ValueError, KeyError) as err:
        message = (str(err).splitlines() or [type(err).__name__])[0]
        raise PolicyLoadError(f"{model_dir}: cannot load the model ({message})") from None
    vocab = getattr(model.config, "vocab_size", None)
    if vocab != tok.vocab_size:
        raise PolicyLoadError(f"{model_dir}: a model of {vocab} tokens; a hintrl student has the byte "
                              f"tokenizer's {tok.vocab_size}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = model.to(device).eval()
    policy = build_policy(model, lean=cfg.student.lean_forward, pad_id=tok.pad_id, banned_ids=tok.never_sampled,
                          warn=lambda text: print(f"[load_policy] {text}", file=sys.stderr))
    return Loaded(policy, cfg, tok, model, f"{what}; config {config_from}")
