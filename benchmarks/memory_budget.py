"""Does a memory knob pay within a budget? Tune under `--memory-budget`, then re-measure the
recommendation against the fastest configuration without the knob that kept within the budget.

    python -m benchmarks.memory_budget examples/deep_gpt2.py:factory --budget 1.5GiB
    LD_PRELOAD=$(python -m advisor.memory) python -m benchmarks.memory_budget \\
        examples/narrow_gpt2.py:factory --budget 460MiB --global-batch-size 64

`advisor tune` (default settings, `--trials`, and any option this script does not know) in a
fresh process; then, as fresh isolated trials after the tune, interleaved (`remeasure.py`),
`--repeats` pairs of the recommendation and of the search's fastest configuration at the same
global batch with activation checkpointing off and a peak within the budget. Prints the
allocator, the race's verdict and one Markdown row: both configurations, their re-measured
samples/s and peaks, the paired speed-up, and whether any re-run went over the budget.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import advisor
from advisor.knobs import TrialConfig
from advisor.memory import MemoryBudget, gib
from advisor.results import Recommendation
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from benchmarks.remeasure import paired_speedup


def tune(
    spec: str, out: Path, budget: str, trials: int, extra: list[str]
) -> tuple[Recommendation, float]:
    command = [sys.executable, "-m", "advisor", "tune", spec, "--out", str(out), "--quiet"]
    command += ["--memory-budget", budget, "--trials", str(trials), *extra]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    return Recommendation.model_validate_json((out / "recommendation.json").read_text()), wall


def best_without_knob(out: Path, rec: Recommendation, limit: int) -> TrialConfig | None:
    """The fastest search trial at the recommendation's global batch, checkpointing off, whose
    peak kept within `limit`."""
    fitting = [
        t.result for t in advisor.load_result(out).trials
        if t.role in ("baseline", "search") and t.eligible
        and t.result.config.activation_checkpointing == "off"
        and (t.result.peak_memory_bytes or 0) <= limit
        and t.result.config.global_batch_size == rec.config.global_batch_size
    ]  # fmt: skip
    best = max(fitting, key=lambda result: result.samples_per_s or 0.0, default=None)
    return best.config if best else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--budget", required=True)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trial-seconds", type=float, default=3.0, help="of the re-measurement")
    args, extra = parser.parse_known_args()  # the rest goes to `advisor tune`
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        rec, wall = tune(args.spec, out, args.budget, args.trials, extra)
        summary = rec.memory_budget
        limit = summary.limit.bytes if summary else MemoryBudget.model_validate(args.budget).bytes
        assert limit is not None, "give the budget in bytes with a unit"
        other = best_without_knob(out, rec, limit)
        print(f"tune: {wall:.0f} s; {summary.statement if summary else 'no budget summary'}")
        print(f"allocator: {rec.hardware.allocator}; race: {rec.race.verdict if rec.race else '-'}")
        if other is None or other == rec.config:
            print(f"recommended {rec.config.label()}: nothing without the knob to compare with")
            return
        launch = TrialLaunch(
            spec=rec.spec, cwd=Path(rec.workdir), warmup_steps=3,
            trial_seconds=args.trial_seconds, timeout_s=600,
        )  # fmt: skip
        rates: dict[str, list[float]] = {"rec": [], "other": []}
        peaks: dict[str, list[int]] = {"rec": [], "other": []}
        for index in range(args.repeats):
            order = [("rec", rec.config), ("other", other)]
            for name, config in order if index % 2 == 0 else order[::-1]:
                result = ProcessRunner(launch).run(
                    WindowOrder(config=config), out / f"{name}-{index}.log"
                )
                rates[name].append(result.samples_per_s or 0.0)
                peaks[name].append(result.peak_memory_bytes or 0)
    speedup = paired_speedup(rates["rec"], rates["other"])
    over = sum(peak > limit for peak in peaks["rec"] + peaks["other"])
    print(
        "| recommended | peak | best without the knob | peak | re-measured speed-up | re-runs over "
        "the budget |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {rec.config.label()} | {gib(max(peaks['rec']))} | {other.label()} "
        f"| {gib(max(peaks['other']))} | {speedup:.2f}x | {over} of {2 * args.repeats} |"
    )


if __name__ == "__main__":
    main()
