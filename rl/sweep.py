"""A sweep's figure: how many generated tokens each arm needs, as a knob of the regime changes.

    python -m rl.sweep experiments/hidden-rule       # reads its sweep.yaml; scripts/reproduce.sh runs it too

A sweep is a list of study folders, one per value of a config key (`knob`, e.g. the hidden rule's
`task.config.rule_bits`), each already summarized (results/summary.json, rl/study.py). For every
folder the target is `fraction` of a reference arm's mean final accuracy on `bucket` (the oracle's:
what the regime allows), and for every other arm and seed the RL phase's generated tokens at the
first evaluation that reaches it. A seed that never reaches it counts at its whole budget and is
*censored*: the table prints "> budget" and the figure draws an arrow up from it, so a method that
fails is never drawn as cheap. Resolution is the studies' evaluation interval (trainer.eval_every).

Writes sweep.png and results/sweep.json beside sweep.yaml and the table into the README between
<!-- sweep:begin --> and <!-- sweep:end -->.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from rl.config import ConfigError
from rl.configure import load_config
from rl.stats import mean_interval
from rl.study import reach
from rl.study_tables import write_readme

BEGIN, END = "<!-- sweep:begin -->", "<!-- sweep:end -->"
KEYS = {"knob", "bucket", "target", "folders", "arms"}


def load_sweep(folder: Path) -> dict:
    path = folder / "sweep.yaml"
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)} (sweep.yaml has {sorted(KEYS)})")
    for key in ("knob", "bucket", "target", "folders"):
        if key not in spec:
            raise ConfigError(f"{path}: {key} is missing")
    target = spec["target"]
    if not isinstance(target, dict) or set(target) != {"arm", "fraction"} or not 0 < float(target["fraction"]) <= 1:
        raise ConfigError(f"{path}: target is {{arm, fraction in (0, 1]}}, got {target!r}")
    folders = [(folder / f).resolve() for f in spec["folders"]]
    for f in folders:
        if not (f / "study.yaml").is_file():
            raise ConfigError(f"{path}: folders: {f.name} is not a study folder (no study.yaml)")
    return {"knob": str(spec["knob"]), "bucket": str(spec["bucket"]), "target_arm": str(target["arm"]),
            "fraction": float(target["fraction"]), "folders": folders, "arms": spec.get("arms")}


def knob_value(cfg, knob: str):
    """cfg's value at a dotted key ("task.config.rule_bits"): attributes, then mapping keys."""
    value = cfg
    for part in knob.split("."):
        try:
            value = value[part] if isinstance(value, dict) or hasattr(value, "keys") else getattr(value, part)
        except (KeyError, AttributeError):
            raise ConfigError(f"sweep.yaml: knob {knob!r}: the config has no {part!r} there") from None
    return value


def point(summary: dict, bucket: str, target_arm: str, fraction: float, arms: list[str] | None) -> dict:
    """One folder's arms: tokens to reach fraction x the target arm's mean final accuracy on bucket."""
    reference = summary["arms"][target_arm]["final"][bucket]["mean"]
    target = fraction * reference
    out = {"target": target, "reference_final": reference, "arms": {}}
    for name, a in summary["arms"].items():
        if name == target_arm or (arms and name not in arms):
            continue
        tokens, censored = {}, []
        for seed, curve in a["curves"].items():
            hit = reach(curve, bucket, target)[1]
            tokens[seed] = curve["generated"][-1] if hit is None else hit
            if hit is None:
                censored.append(seed)
        out["arms"][name] = {**mean_interval(tokens.values()), "per_seed": tokens, "censored": censored,
                             "reached": len(tokens) - len(censored)}
    return out


def build(folder: Path) -> dict:
    sweep = load_sweep(folder)
    points, missing = [], []
    for f in sweep["folders"]:
        path = f / "results" / "summary.json"
        if not path.is_file():
            missing.append(f.name)
            continue
        summary = json.loads(path.read_text())
        if sweep["target_arm"] not in summary["arms"]:
            missing.append(f"{f.name} (no {sweep['target_arm']} arm)")
            continue
        value = knob_value(load_config(f), sweep["knob"])
        points.append({"folder": f.name, "value": value, "gate": summary.get("gate"),
                       **point(summary, sweep["bucket"], sweep["target_arm"], sweep["fraction"], sweep["arms"])})
    points.sort(key=lambda p: p["value"])
    return {"knob": sweep["knob"], "bucket": sweep["bucket"], "target_arm": sweep["target_arm"],
            "fraction": sweep["fraction"], "points": points, "missing": missing}


def _cell(a: dict) -> str:
    if a["mean"] is None:
        return "—"
    n = len(a["per_seed"])
    if a["censored"]:
        # Some seeds never got there: the mean is a lower bound (their whole budget counted).
        return f"> {a['mean'] / 1e6:.3f}M ({a['reached']}/{n})"
    interval = f" [{a['low'] / 1e6:.3f}, {a['high'] / 1e6:.3f}]" if a["low"] is not None else ""
    return f"{a['mean'] / 1e6:.3f}M{interval} ({n}/{n})"


def markdown(result: dict) -> str:
    points = result["points"]
    arms = list(dict.fromkeys(name for p in points for name in p["arms"]))
    knob = result["knob"].rsplit(".", 1)[-1]
    lines = [f"RL-phase generated tokens to reach {result['fraction']:g} × `{result['target_arm']}`'s mean final "
             f"accuracy on `{result['bucket']}`, per `{knob}` (from each folder's `results/summary.json`, by "
             "`python -m rl.sweep`; figure `sweep.png`): mean [95% Student-t interval] over seeds (seeds that reached "
             "it / seeds). \"> x\": some seed never reached it, its whole budget counted, so x is a lower bound. "
             "Resolution: one evaluation interval.", "",
             f"| arm | " + " | ".join(f"{knob} = {p['value']} (target {p['target']:.3f})" for p in points) + " |",
             "|---|" + "---|" * len(points)]
    for name in arms:
        lines.append(f"| `{name}` | " + " | ".join(_cell(p["arms"][name]) if name in p["arms"] else "—"
                                                  for p in points) + " |")
    if result["missing"]:
        lines += ["", "Not yet summarized: " + ", ".join(result["missing"]) + "."]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    arms = list(dict.fromkeys(name for p in points for name in p["arms"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, name in enumerate(arms):
        color = f"C{i}"
        xs = [p["value"] for p in points if name in p["arms"]]
        stats = [p["arms"][name] for p in points if name in p["arms"]]
        ys = [s["mean"] for s in stats]
        ax.plot(xs, ys, "-o", color=color, label=name, alpha=0.85)
        for x, s in zip(xs, stats):
            if s["low"] is not None and not s["censored"]:
                ax.plot([x, x], [max(s["low"], 1.0), s["high"]], color=color, alpha=0.6)
            if s["censored"]:      # a lower bound: the budget ran out first on some seed
                ax.plot([x], [s["mean"]], "^", color=color, markersize=10, markerfacecolor="none")
                ax.annotate("", xy=(x, s["mean"] * 1.8), xytext=(x, s["mean"]),
                            arrowprops={"arrowstyle": "->", "color": color})
    ax.set_yscale("log")
    top = max(p["arms"][n]["mean"] for p in points for n in p["arms"] if p["arms"][n]["mean"] is not None)
    ax.set_ylim(top=top * 2.5)             # room for the arrows
    ax.set_title("open triangle + arrow: a lower bound (some seed never reached it)", fontsize=8)
    ax.set_xlabel(result["knob"].rsplit(".", 1)[-1])
    ax.set_ylabel(f"generated tokens to {result['fraction']:g} × {result['target_arm']} ({result['bucket']})")
    ax.set_xticks([p["value"] for p in points])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(folder: Path) -> str:
    result = build(folder)
    (folder / "results").mkdir(exist_ok=True)
    (folder / "results" / "sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    write_readme(folder, table, BEGIN, END, heading="Sweep")
    if result["points"]:
        plot(result, folder / "sweep.png")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder with sweep.yaml")
    args = parser.parse_args(argv)
    try:
        print(write(Path(args.folder)))
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
