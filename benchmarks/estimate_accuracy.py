"""Estimated search trials against whole cycles: how far off, and at what cost.

    python benchmarks/estimate_accuracy.py [--spec examples/data_bound.py:factory] [--rounds 4]

Runs configurations whose optimizer cycle is too long for a search trial's window (batch 512,
accumulation 4: one process with a worker, two DDP ranks with none, one and two workers each),
interleaved, as the search runs them (`precise_window`, estimated from timed micro-steps) and as a
finalist's re-run does (`whole_cycles`). Reports per configuration the median estimate over the
median of whole cycles, the mean |estimate / that median - 1| of single trials, and the mean
wall of each. To compare two versions of advisor, run it from a `git worktree` of each, one
after the other, or with `--label` in a loop that alternates them; `--jsonl` keeps every trial.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from advisor.knobs import TrialConfig
from advisor.results import TrialResult
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

CONFIGS = {
    "bs=512 acc=4 workers=1": TrialConfig(batch_size=512, accumulation_steps=4, num_workers=1),
    **{
        f"ddp-2 bs=512 acc=4 workers={workers}": TrialConfig(
            batch_size=512,
            accumulation_steps=4,
            parallel_mode="ddp",
            world_size=2,
            num_workers=workers,
        )
        for workers in (0, 1, 2)
    },
}
BEST_SAMPLES_PER_S = 1700.0  # a search's best so far, as on examples/data_bound.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/data_bound.py:factory")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--trial-seconds", type=float, default=2.0)
    parser.add_argument("--jsonl", type=Path, help="append every trial here, as JSON lines")
    parser.add_argument("--label", default="", help="names this run's lines in --jsonl")
    args = parser.parse_args()
    launch = TrialLaunch(
        spec=args.spec, cwd=Path.cwd(), warmup_steps=3, trial_seconds=args.trial_seconds,
        timeout_s=300,
    )  # fmt: skip
    runs: dict[tuple[str, str], list[TrialResult]] = {}
    with tempfile.TemporaryDirectory() as logs:
        ProcessRunner(launch).run(
            WindowOrder(config=TrialConfig(batch_size=32)), Path(logs) / "up.log"
        )  # start it
        for _ in range(args.rounds):
            for name, config in CONFIGS.items():
                for way in ("estimated", "whole cycles"):
                    result = _run(launch, config, Path(logs) / "t.log", way)
                    runs.setdefault((name, way), []).append(result)
                    if args.jsonl:
                        with args.jsonl.open("a") as out:
                            out.write(_line(args.label, name, way, result) + "\n")
    print(_markdown(runs, args))


def _run(launch: TrialLaunch, config: TrialConfig, log: Path, way: str) -> TrialResult:
    if way == "whole cycles":
        return ProcessRunner(launch).run(WindowOrder(config=config, whole_cycles=True), log)
    return ProcessRunner(launch).run(
        WindowOrder(config=config, precise_window=True, beat_samples_per_s=BEST_SAMPLES_PER_S), log
    )


def _line(label: str, name: str, way: str, result: TrialResult) -> str:
    fields = ("samples_per_s", "wall_s", "startup_s", "warmup_s", "window_s", "estimated")
    row = {"label": label, "config": name, "way": way, "status": result.status}
    return json.dumps(row | {field: getattr(result, field) for field in fields})


def _markdown(runs: dict[tuple[str, str], list[TrialResult]], args: argparse.Namespace) -> str:
    lines = [
        f"{args.spec}, {args.trial_seconds:g} s windows, {args.rounds} rounds:",
        "",
        "| configuration | estimated ÷ whole (medians) | mean abs. error | wall estimated | "
        "wall whole |",
        "|---|---|---|---|---|",
    ]
    for name in CONFIGS:
        estimated = _rates(runs[(name, "estimated")])
        whole = statistics.median(_rates(runs[(name, "whole cycles")]) or [float("nan")])
        error = statistics.mean(abs(rate / whole - 1) for rate in estimated) if estimated else 0
        lines.append(
            f"| {name} | {statistics.median(estimated or [float('nan')]) / whole:.2f} | "
            f"{error:.1%} | {_mean_wall(runs[(name, 'estimated')]):.2f} s | "
            f"{_mean_wall(runs[(name, 'whole cycles')]):.2f} s |"
        )
    return "\n".join(lines)


def _rates(results: list[TrialResult]) -> list[float]:
    return [r.samples_per_s for r in results if r.status == "ok" and r.samples_per_s]


def _mean_wall(results: list[TrialResult]) -> float:
    return statistics.mean(r.wall_s or 0.0 for r in results)


if __name__ == "__main__":
    main()
