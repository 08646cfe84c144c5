"""Load a trained student as a policy, from any of the three folders a run leaves:

    load_policy("runs/default/RUN")                               the run's newest complete checkpoint
    load_policy("runs/default/RUN/checkpoints/step_0000600")      that checkpoint
    load_policy("runs/default/RUN/hf")                            an export folder (rl/export.py)

-> Loaded(policy, cfg, tok, model, description): the policy (student/policy.py) over the model in
eval mode, the run's config, the byte tokenizer, the model, and one line saying what was loaded.

The config is the run's own resolved `config.yaml` for a run or checkpoint folder. For an export
folder it is the `hintrl_config.yaml` rl/export.py writes beside the weights; an export without one
(an older hintrl) takes the `experiment` folder it was trained with, or the config of the run folder
it sits in (`trainer.export_to`). `overrides` ("key=value") go on top.

A checkpoint is DeepSpeed's state, verified against its manifest (rl/checkpoint.py) and read
straight into the run's student (`build_student`, then the consolidated weights at any ZeRO stage
or with expert parallelism, rl.export.load_checkpoint): the weights `python -m rl.export` would
write, without writing them.

Every problem (no checkpoint, a checkpoint that does not verify, a folder that is none of the
three, an export folder without a config) is a `PolicyLoadError` of one line naming the path.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from rl.checkpoint import list_tags, verify
from rl.config import RunConfig
from rl.configure import load_config
from rl.runlog import is_run_folder
from student.tokenizer import Tokenizer

EXPORT_CONFIG = "hintrl_config.yaml"      # the run's resolved config, written into an export folder


class PolicyLoadError(ValueError):
    """A folder that cannot be loaded as a policy; the message is one line naming the path."""


@dataclass
class Loaded:
    policy: object                # student.policy.Policy
    cfg: RunConfig
    tok: Tokenizer
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


def checkpoint_model(run_dir: Path, tag: str, cfg: RunConfig, tok: Tokenizer) -> torch.nn.Module:
    """The run's student with checkpoint `tag`'s weights, read straight from the DeepSpeed state
    (verified against its manifest first): the weights rl.export would write, without writing them."""
    from rl.export import load_checkpoint
    from student.model import build_student

    ckpt = run_dir / "checkpoints" / tag
    problem = verify(ckpt)
    if problem:
        raise PolicyLoadError(f"{ckpt}: does not verify: {problem}")
    try:
        with torch.random.fork_rng(devices=[]):      # its random initialisation is overwritten: leave the caller's RNG be
            model = build_student(cfg.student, tok)
        load_checkpoint(model, run_dir, tag, cfg.deepspeed.zero_stage)
    except (OSError, RuntimeError, ValueError, KeyError) as err:  # CheckpointError, UnsafeCheckpointError, a misfit
        message = (str(err).splitlines() or [type(err).__name__])[0]
        raise PolicyLoadError(f"{ckpt}: cannot load it ({message})") from None
    return model


def _tokenizer(cfg: RunConfig, folder) -> Tokenizer:
    try:
        from student.model import build_tokenizer
        return build_tokenizer(dataclasses.replace(cfg.student, checkpoint=str(folder)))
    except (OSError, ValueError) as err:
        raise PolicyLoadError(str(err)) from None


def _export_config(path: Path, experiment, overrides) -> tuple[RunConfig, str]:
    own = path / EXPORT_CONFIG
    if own.is_file():
        if experiment is not None:
            print(f"[load_policy] {path} holds its own {EXPORT_CONFIG}; experiment={experiment} is not used",
                  file=sys.stderr)
        return load_config(own, list(overrides)), str(own)
    if experiment is not None:
        return load_config(experiment, list(overrides)), f"experiment {experiment}"
    for parent in (path.parent, path.parent.parent):      # trainer.export_to, or RUN/exports/<tag> (an older cache)
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
    if path.name == "checkpoints" and is_run_folder(path.parent):
        path = path.parent
    checkpoint, model = _checkpoint_of(path), None
    if _is_export_dir(path):
        cfg, config_from = _export_config(path, experiment, overrides)
        model_dir, what = path, f"export {path}"
        tok = _tokenizer(cfg, model_dir)           # an export carries the tokenizer it was trained with
    elif checkpoint is not None or is_run_folder(path):
        run_dir, tag = checkpoint if checkpoint is not None else (path, None)
        cfg = _run_config(run_dir, overrides)
        config_from = str(run_dir / "config.yaml")
        if tag is None:
            tag = _newest_verified(run_dir)
        tok = _tokenizer(cfg, cfg.student.checkpoint)
        model = checkpoint_model(run_dir, tag, cfg, tok)
        model_dir, what = run_dir / "checkpoints" / tag, f"checkpoint {run_dir / 'checkpoints' / tag}"
    elif path.parent.name == "checkpoints":
        raise PolicyLoadError(f"{path}: not a complete checkpoint (a save that did not finish, or one moved aside)")
    else:
        raise PolicyLoadError(f"{path}: not a run folder (config.yaml + checkpoints/), a checkpoint folder "
                              "(RUN/checkpoints/step_NNNNNNN) or an export folder (config.json)")
    if model is None:
        try:
            model = build_student(dataclasses.replace(cfg.student, checkpoint=str(model_dir)), tok)
        except (OSError, ValueError, KeyError) as err:
            message = (str(err).splitlines() or [type(err).__name__])[0]
            raise PolicyLoadError(f"{model_dir}: cannot load the model ({message})") from None
    vocab = getattr(model.config, "vocab_size", None)
    if vocab != tok.vocab_size:
        raise PolicyLoadError(f"{model_dir}: a model of {vocab} tokens; its tokenizer (student.tokenizer="
                              f"{cfg.student.tokenizer}) has {tok.vocab_size}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = model.to(device).eval()
    policy = build_policy(model, lean=cfg.student.lean_forward, pad_id=tok.pad_id, banned_ids=tok.never_sampled,
                          warn=lambda text: print(f"[load_policy] {text}", file=sys.stderr))
    return Loaded(policy, cfg, tok, model, f"{what}; config {config_from}")
