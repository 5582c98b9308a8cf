"""Whether the same command gives the same answer: fresh tunes of each example, one after the
other on one machine.

    python benchmarks/stability.py [--specs examples/mlp.py:factory ...] [--tunes 5]
                                   [--trials 16] [--keep DIR]

Each tune is the README's quick-start command (`advisor tune SPEC --trials N`) in a fresh output
folder and study, run in its own process as a user runs it. Per example the table gives each
tune's recommended global batch and precision, its verdict, its time-to-loss claim with the
interval and its cost; below it, whether one global batch and precision was recommended in at
least all but one tune, and whether the claims' intervals share a point (the highest low end at
most the lowest high end). Results: benchmarks/results/stability.json and .md; with `--keep`,
each tune's recommendation.json (its racers' curves included) is copied to DIR.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
EXAMPLES = (
    "examples/mlp.py:factory",
    "examples/data_bound.py:factory",
    "examples/hf_gpt2.py:factory",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--tunes", type=int, default=5, help="fresh tunes per example")
    parser.add_argument("--trials", type=int, default=16, help="each tune's --trials")
    parser.add_argument("--name", default="stability", help="results file name")
    parser.add_argument("--keep", type=Path, help="copy each recommendation.json here")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for spec in args.specs:
        keep = args.keep / Path(spec.split(":")[0]).stem if args.keep else None
        tunes = [_tune(spec, args.trials, keep, i) for i in range(1, args.tunes + 1)]
        rows.append({"spec": spec, "tunes": tunes, **_agreement(tunes)})
        _write(rows, args.name)


def _tune(spec: str, trials: int, keep: Path | None, index: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "advisor", "tune", spec, "--trials", str(trials)]
        started = time.perf_counter()
        done = subprocess.run([*command, "--out", out], capture_output=True, text=True)
        wall_s = time.perf_counter() - started
        path = Path(out) / "recommendation.json"
        if done.returncode != 0 or not path.exists():
            print(done.stdout[-2000:], done.stderr[-2000:], flush=True)
            return {"failed": done.returncode, "wall_s": wall_s}
        rec = json.loads(path.read_text())
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, keep / f"tune{index}.json")
    race = rec.get("race") or {}
    row = {
        "batch": rec["config"]["batch_size"] * rec["config"]["accumulation_steps"],
        "global_batch": _global(rec["config"]),
        "amp": rec["config"]["amp"],
        "label": _label(rec["config"]),
        "config": rec["config"],  # every knob: tunes with one label may differ in the others
        "verdict": _kind(race.get("verdict")),
        "replicates": race.get("replicates"),
        # Which other global batches raced (and with which precision): where tunes disagree,
        # whether they raced different batches or judged the same ones differently.
        "raced": sorted(
            {_label(r["config"]) for r in race.get("racers", []) if r.get("role") == "candidate"}
        ),
        # The noise scale's prediction per measured global batch (best samples/s, predicted
        # speed-up, raced or not): what decided which batches raced.
        "predicted": [
            {k: p[k] for k in ("global_batch", "samples_per_s", "predicted_speedup", "raced")}
            for p in (rec.get("noise_scale") or {}).get("predictions", [])
        ],
        "claim": rec.get("time_to_loss"),
        "samples_speedup": rec.get("speedup"),
        # What the race cost: its racers' training processes (a pick read from your curve
        # trained nothing; a going-on that stopped after replicate 1 is not in the
        # recommendation), and whether it went on.
        "race_s": _race_seconds(race),
        "went_on": race.get("went_on_from") is not None,
        "wall_s": wall_s,
    }
    print(json.dumps(row), flush=True)
    return row


def _race_seconds(race: dict[str, Any]) -> float:
    """The wall time of the race's trial processes: each racer once (one that went on appears
    in the race before and after), none for a pick read from your curve."""
    racers = [*(race.get("first_race") or {}).get("racers", []), *race.get("racers", [])]
    seen = {
        json.dumps(r.get("result"), sort_keys=True): r
        for r in racers
        if not r.get("steps_of_baseline")
    }
    return sum((r.get("result") or {}).get("wall_s") or 0.0 for r in seen.values())


def _kind(verdict: Any) -> str | None:
    """The verdict's kind; a recommendation of an earlier schema stored a sentence."""
    return verdict.get("kind") if isinstance(verdict, dict) else verdict


def _global(config: dict[str, Any]) -> int:
    return int(config["batch_size"] * config["accumulation_steps"] * config["world_size"])


def _label(config: dict[str, Any]) -> str:
    return f"batch {_global(config)}, {config['amp'] if config['amp'] != 'off' else 'fp32'}"


def _agreement(tunes: list[dict[str, Any]]) -> dict[str, Any]:
    """The most common answer and how often, and whether the claims' intervals share a point
    (a tune that kept your configuration claims 1.0x, exactly)."""
    answers = Counter((t["global_batch"], t["amp"]) for t in tunes if "failed" not in t)
    (batch, amp), count = answers.most_common(1)[0] if answers else ((None, None), 0)
    lows = [t["claim"]["low"] if t["claim"] else 1.0 for t in tunes if "failed" not in t]
    highs = [t["claim"]["high"] if t["claim"] else 1.0 for t in tunes if "failed" not in t]
    return {
        "answer": {"global_batch": batch, "amp": amp},
        "agree": count,
        "shared_point": bool(lows) and max(lows) <= min(highs),
        "lows": lows,
        "highs": highs,
    }


def _write(rows: list[dict[str, Any]], name: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    machine = {"machine": platform.processor() or platform.machine(), "python": sys.version}
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    text = _markdown(rows)
    (RESULTS / f"{name}.md").write_text(text)
    print(text, flush=True)


def _markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| example | tune | recommended | verdict | time to your loss | samples/s | tune s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        example = Path(row["spec"].split(":")[0]).name
        for index, tune in enumerate(row["tunes"], start=1):
            if "failed" in tune:
                lines.append(f"| {example} | {index} | failed ({tune['failed']}) | | | | |")
                continue
            claim = tune["claim"]
            said = (
                f"{claim['speedup']:.2f}x ({claim['low']:.2f}-{claim['high']:.2f}x, "
                f"{claim['replicates']} replicates)"
                if claim
                else "yours stands"
            )
            rate = f"{tune['samples_speedup']:.2f}x" if tune["samples_speedup"] else "-"
            lines.append(
                f"| {example} | {index} | {tune['label']} | {tune['verdict']} | {said} | {rate} "
                f"| {tune['wall_s']:.0f} |"
            )
    lines.append("")
    for row in rows:
        example = Path(row["spec"].split(":")[0]).name
        answer = row["answer"]
        share = "share" if row["shared_point"] else "do NOT share"
        lines.append(
            f"- {example}: batch {answer['global_batch']} {answer['amp']} in {row['agree']} of "
            f"{len(row['tunes'])}; the intervals {share} a point (highest low "
            f"{max(row['lows'], default=0):.2f}x, lowest high {min(row['highs'], default=0):.2f}x)"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
