"""Does a claim hold on a busy machine? Tune quiet and with another program on the machine,
then re-measure each recommendation independently under the same conditions.

    python -m benchmarks.busy_machine examples/mlp.py:factory [--busy-cores 1] [--trials 12]

For each condition (quiet, then `--busy-cores` cores kept busy by other processes): `advisor
tune` in a fresh process, then the recommendation and the baseline re-measured as fresh
isolated trials, `--repeats` each, interleaved (as `benchmarks/remeasure.py` does), under
the same load. Prints one Markdown row per condition: the claimed speed-up, whether
advisor confirmed it, the re-measured speed-up, and whether the two agree within 15 %.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from advisor.results import Recommendation
from advisor.trial.parent.runner import TrialLaunch
from benchmarks.remeasure import paired_speedup, remeasure

AGREEMENT = 0.15


@contextmanager
def busy(cores: int) -> Iterator[None]:
    """`cores` other programs, each a busy loop: the machine as a shared one is."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def tune(spec: str, out: Path, trials: int, extra: list[str]) -> tuple[Recommendation, float]:
    command = [sys.executable, "-m", "advisor", "tune", spec, "--out", str(out), "--quiet"]
    command += ["--trials", str(trials), *extra]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    return Recommendation.model_validate_json((out / "recommendation.json").read_text()), wall


def row(name: str, rec: Recommendation, wall: float, repeats: int, seconds: float) -> str:
    launch = TrialLaunch(
        spec=rec.spec, cwd=Path(rec.workdir), warmup_steps=3, trial_seconds=seconds, timeout_s=600
    )
    claim = rec.speedup
    confirmation = rec.confirmation
    status = "no speed-up to claim"
    if confirmation is not None:
        status = "confirmed" if confirmation.confirmed else "**unconfirmed**"
        status += f" ({len(confirmation.ratios)} rounds"
        if confirmation.outside_cores is not None:
            status += f", others {confirmation.outside_cores:.1f} cores"
        status += ")"
    if claim is None or rec.config == rec.baseline_config:
        return f"| {name} | {rec.config.label()} | – | {status} | – | – | {wall:.0f} s |"
    recommended, baseline = remeasure(launch, (rec.config, rec.baseline_config), repeats)
    measured = paired_speedup(recommended, baseline)
    agree = abs(claim / measured - 1) <= AGREEMENT
    verdict = f"{claim / measured - 1:+.0%}" + ("" if agree else " (outside 15 %)")
    return (
        f"| {name} | {rec.config.label()} | {claim:.2f}x | {status} | {measured:.2f}x "
        f"| {verdict} | {wall:.0f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--busy-cores", type=int, default=1)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--trial-seconds", type=float, default=3.0, help="of the re-measurement")
    parser.add_argument("--conditions", default="quiet,busy")
    parser.add_argument("tune_args", nargs="*", help="more advisor tune options, after --")
    args = parser.parse_args()
    print("| machine | recommended | claimed | advisor says | re-measured | claim vs re-measured "
          "| tune |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for condition in args.conditions.split(","):
        cores = args.busy_cores if condition == "busy" else 0
        name = f"{cores} core{'s' if cores > 1 else ''} busy" if cores else "quiet"
        with tempfile.TemporaryDirectory() as out, busy(cores):
            rec, wall = tune(args.spec, Path(out), args.trials, args.tune_args)
            print(row(name, rec, wall, args.repeats, args.trial_seconds), flush=True)


if __name__ == "__main__":
    main()
