"""The statistics every table of the project uses: spread over seeds, paired differences, intervals.

One definition each, so that "± x" means the same in every README:

    spread(values)                 mean, *sample* std (n - 1) and n; n = 1 has no std (None)
    paired_difference(a, b)        per-seed a - b over the seeds both have, its mean and a 95%
                                   Student-t interval (arms that share a warm-start per seed are
                                   paired: the seed's luck cancels in the difference)
    bootstrap_interval(values)     a 95% percentile-bootstrap interval of a mean (e.g. over problems)
    fmt(s) / fmt_interval(d)       "0.477 ± 0.041 (n=3)", "0.500 (n=1)", "+0.022 [-0.010, +0.054] (n=3)"
"""
from __future__ import annotations

import math
import random
import statistics
from typing import Iterable, Mapping

# Two-sided 95% quantiles of Student's t, t_{0.975, df}, df = 1..30 (standard table values; past
# 30 the normal's 1.960 is within 4%).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """t_{0.975, df}: the half-width of a 95% interval of a mean is this x std / sqrt(n)."""
    if df < 1:
        raise ValueError(f"df={df}: a t interval needs at least two values")
    return _T975[df - 1] if df <= len(_T975) else 1.960


def spread(values: Iterable[float | None]) -> dict:
    """{"mean", "std", "n"} over the values that are not None: std is the sample std (n - 1), None
    for n = 1 (one seed has no spread; printing "± 0.000" would claim one); mean None for n = 0."""
    kept = [float(v) for v in values if v is not None]
    if not kept:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(kept), "std": statistics.stdev(kept) if len(kept) > 1 else None, "n": len(kept)}


def mean_interval(values: Iterable[float]) -> dict:
    """{"mean", "low", "high", "n"}: the mean with its 95% Student-t interval (None bounds for n < 2)."""
    kept = [float(v) for v in values if v is not None]
    s = spread(kept)
    if s["n"] < 2:
        return {"mean": s["mean"], "low": None, "high": None, "n": s["n"]}
    half = t_quantile_975(s["n"] - 1) * s["std"] / math.sqrt(s["n"])
    return {"mean": s["mean"], "low": s["mean"] - half, "high": s["mean"] + half, "n": s["n"]}


def paired_difference(a: Mapping, b: Mapping) -> dict:
    """a and b map a seed (or any pairing key) to a value; the difference a - b on the keys both
    have (None values dropped), as {"mean", "low", "high", "n", "per_seed": {key: a - b}}."""
    keys = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
    diffs = {k: float(a[k]) - float(b[k]) for k in keys}
    return {**mean_interval(diffs.values()), "per_seed": diffs}


def bootstrap_interval(values: Iterable[float], resamples: int = 2000, seed: int = 0) -> dict:
    """{"mean", "low", "high", "n"}: the mean and the 2.5th / 97.5th percentiles of the means of
    `resamples` resamples with replacement (seeded: the same values give the same interval). For
    the mean of many 0/1 or small-integer outcomes, e.g. per-problem rescues in the teacher gap."""
    kept = [float(v) for v in values]
    n = len(kept)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(kept, k=n)) / n for _ in range(resamples))
    return {"mean": sum(kept) / n, "low": means[int(0.025 * resamples)], "high": means[int(0.975 * resamples) - 1],
            "n": n}


def fmt(s: Mapping, scale: float = 1.0, digits: int = 3, show_n: bool = True) -> str:
    """A spread as "mean ± std (n=k)"; "mean (n=1)" for one value; "—" for none."""
    if s.get("mean") is None:
        return "—"
    n = f" (n={s['n']})" if show_n else ""
    if s.get("std") is None:
        return f"{s['mean'] * scale:.{digits}f}{n or ' (n=1)'}"
    return f"{s['mean'] * scale:.{digits}f} ± {s['std'] * scale:.{digits}f}{n}"


def fmt_interval(d: Mapping, scale: float = 1.0, digits: int = 3, sign: bool = True, show_n: bool = True) -> str:
    """An interval as "+0.022 [-0.010, +0.054] (n=3)"; without bounds "+0.022 (n=1)"; "—" for none."""
    if d.get("mean") is None:
        return "—"
    f = (lambda x: f"{x * scale:+.{digits}f}") if sign else (lambda x: f"{x * scale:.{digits}f}")
    n = f" (n={d['n']})" if show_n else ""
    if d.get("low") is None:
        return f"{f(d['mean'])}{n}"
    return f"{f(d['mean'])} [{f(d['low'])}, {f(d['high'])}]{n}"
