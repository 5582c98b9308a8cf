"""Measurement noise: the same configuration measured several times, as isolated trials.

    python benchmarks/measurement_noise.py [--repeats 5] [--trial-seconds 2]
                                           [--device auto|cpu|cuda]

For each example workload, six configurations on CPU (the baseline, batch 32; batch 256 with
bf16 autocast where the CPU has it; two DDP processes at batch 128; batch 512 with two loader
workers, whose batches arrive in bursts; batch 512 with 4 accumulation steps, a cycle a search
trial estimates from its parts; that with two DDP ranks of two workers each), or five on a GPU
(`--device`; `_gpu_configs`), are measured `--repeats` times each, two ways, all interleaved
so that drift of the machine spreads over every one:
  whole    warm-up steps, then a window of `--trial-seconds`, as finalists' re-runs measure;
  precise  a search trial: its warm-up settles from an eighth of that on, and its window may
           end from then on once its rate is precise (advisor.trial.child.window).
Prints and writes (benchmarks/results/measurement_noise.json) the coefficient of variation of
samples/s across the repeats, the mean window, the mean wall of a trial and the two ways' mean
rates: the spread a single trial carries, which decides how close two configurations can be and
still be told apart, and whether a shorter measurement adds to it or biases it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from advisor.knobs import TrialConfig
from advisor.trial.child.hardware import probe
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

RESULTS = Path(__file__).parent / "results"
EXAMPLES = ("examples/mlp.py:factory", "examples/cnn.py:factory", "examples/data_bound.py:factory")
WAYS = ("whole", "precise")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trial-seconds", type=float, default=2.0)
    parser.add_argument("--specs", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args()
    hardware = probe()
    cuda = args.device == "cuda" or (args.device == "auto" and bool(hardware.gpus))
    configs = _gpu_configs(len(hardware.gpus)) if cuda else _cpu_configs(hardware.cpu_bf16)
    rows = []
    for spec in args.specs:
        launch = TrialLaunch(
            spec=spec, cwd=Path.cwd(), warmup_steps=3, trial_seconds=args.trial_seconds,
            timeout_s=300,
        )  # fmt: skip
        runs: dict[tuple[TrialConfig, str], list[tuple[float, float, float]]] = {}
        with tempfile.TemporaryDirectory() as logs:
            for index in range(args.repeats):
                for config in configs:
                    for way in WAYS:
                        log = Path(logs) / f"{index}.log"
                        result = ProcessRunner(launch).run(
                            WindowOrder(config=config, precise_window=way == "precise"), log
                        )
                        runs.setdefault((config, way), []).append(
                            (
                                result.samples_per_s or 0.0,
                                result.window_s or 0.0,
                                result.wall_s or 0.0,
                            )
                        )
        for (config, way), values in runs.items():
            rows.append(_row(spec, config, way, values))
            print(_line(rows[-1]))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "measurement_noise.json").write_text(
        json.dumps(
            {
                "device": "cuda" if cuda else "cpu",
                "trial_seconds": args.trial_seconds,
                "rows": rows,
            },
            indent=2,
        )
    )


def _cpu_configs(bf16: bool) -> tuple[TrialConfig, ...]:
    return (
        TrialConfig(batch_size=32),
        TrialConfig(batch_size=256, amp="bf16" if bf16 else "off"),
        TrialConfig(batch_size=128, parallel_mode="ddp", world_size=2),
        TrialConfig(batch_size=512, num_workers=2),
        TrialConfig(batch_size=512, accumulation_steps=4),
        # an estimate where two ranks' workers deliver batches in rounds
        TrialConfig(
            batch_size=512, accumulation_steps=4, num_workers=2, parallel_mode="ddp", world_size=2
        ),
    )


def _gpu_configs(gpus: int) -> tuple[TrialConfig, ...]:
    """Steps of milliseconds, where the first step's one-off costs and the GPU's clocks
    ramping up from idle weigh most."""
    configs = (
        TrialConfig(device="cuda", batch_size=64),
        TrialConfig(device="cuda", batch_size=256),
        TrialConfig(device="cuda", batch_size=256, accumulation_steps=2),
        TrialConfig(device="cuda", batch_size=256, amp="bf16"),
        TrialConfig(device="cuda", batch_size=512, num_workers=2, pin_memory=True),
    )
    ddp = TrialConfig(device="cuda", batch_size=256, parallel_mode="ddp", world_size=2)
    return (*configs, ddp) if gpus >= 2 else configs


def _row(
    spec: str, config: TrialConfig, way: str, values: list[tuple[float, float, float]]
) -> dict[str, object]:
    rates = [rate for rate, _, _ in values]
    mean = statistics.fmean(rates)
    return {
        "spec": spec,
        "config": config.label(),
        "way": way,
        "samples_per_s": rates,
        "window_s": [window for _, window, _ in values],
        "wall_s": [wall for _, _, wall in values],
        "mean": mean,
        "cv": statistics.stdev(rates) / mean if mean and len(rates) > 1 else None,
    }


def _line(row: dict[str, object]) -> str:
    rates = ", ".join(f"{v:,.0f}" for v in row["samples_per_s"])  # type: ignore[attr-defined]
    window = statistics.fmean(row["window_s"])  # type: ignore[arg-type]
    wall = statistics.fmean(row["wall_s"])  # type: ignore[arg-type]
    cv = "–" if row["cv"] is None else f"{row['cv']:.1%}"
    return (
        f"{row['spec']:32} {row['config']:28} {row['way']:7} window {window:.2f} s "
        f"wall {wall:.2f} s "
        f"mean {row['mean']:,.0f} CV {cv}  ({rates})"
    )


if __name__ == "__main__":
    main()
