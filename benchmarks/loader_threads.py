"""Why trials give the training process only the cores its DataLoader workers leave free.

    python benchmarks/loader_threads.py [--spec examples/data_bound.py:factory] [--workers 2]

Trains the same configuration in this process with torch's default intra-op threads (one per
core) and with `cores - num_workers` threads, alternating, and prints samples/s for each.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from advisor.knobs import TrialConfig
from advisor.task import build_task
from advisor.trial.child.hardware import usable_cores
from advisor.trial.child.loop import Trainer
from advisor.trial.child.window import run_window

RESULTS = Path(__file__).parent / "results"


def measure(spec: str, config: TrialConfig, threads: int, seconds: float) -> float:
    task, _ = build_task(spec)
    trainer = Trainer(task, config, torch.device("cpu"))
    torch.set_num_threads(threads)  # after Trainer, which sets the advisor default
    run_window(trainer, min_steps=3)
    window = run_window(trainer, min_steps=3, min_seconds=seconds)
    trainer.close()
    return window.micro_batches * config.batch_size / window.elapsed_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/data_bound.py:factory")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    cores = usable_cores()
    config = TrialConfig(batch_size=args.batch_size, num_workers=args.workers)
    choices = {
        "one thread per core": cores,
        "cores left by workers": config.main_process_threads(cores),
    }
    rates: dict[str, list[float]] = {name: [] for name in choices}
    for _ in range(args.repeats):
        for name, threads in choices.items():
            rates[name].append(measure(args.spec, config, threads, args.seconds))
            print(f"{name} ({threads} threads): {rates[name][-1]:,.0f} samples/s")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"median, {name}: {value:,.0f} samples/s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "loader_threads.json").write_text(
        json.dumps(
            {"spec": args.spec, "config": config.model_dump(), "samples_per_s": rates}, indent=2
        )
    )


if __name__ == "__main__":
    main()
