"""What FSDP2 saves against DDP, in peak memory and samples/s, on this machine.

    python -m benchmarks.fsdp_memory tests/workloads/tiny.py:parameter_heavy --batch-size 16

Fresh isolated trials (advisor's own, `ProcessRunner`), interleaved, `--repeats` of each layout at
one micro-batch: one process, DDP and FSDP with every rank count up to the cores (FSDP
resharding after the forward pass and not). Prints one Markdown row per layout: the median
samples/s and the median peak memory (on CPU the whole trial's resident memory, ranks summed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from advisor.knobs import AmpMode, TrialConfig, parse_parallel
from advisor.memory import gib
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch


def layouts(cores: int) -> list[str]:
    worlds = [n for n in (2, 4, 8) if n <= cores]
    kinds = ("ddp-{}", "fsdp-{}", "fsdp-{}-grad-op")
    return ["none"] + [kind.format(n) for n in worlds for kind in kinds]


def config(layout: str, batch_size: int, amp: AmpMode) -> TrialConfig:
    parsed = parse_parallel(layout)
    return TrialConfig(
        batch_size=batch_size, amp=amp, parallel_mode=parsed.mode, world_size=parsed.world,
        reshard_after_forward=parsed.reshard,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--amp", default="off", choices=("off", "bf16", "fp16"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=3.0)
    args = parser.parse_args()
    launch = TrialLaunch(
        spec=args.spec, cwd=Path.cwd(), warmup_steps=3, trial_seconds=args.trial_seconds,
        timeout_s=600,
    )  # fmt: skip
    names = layouts(os.cpu_count() or 1)
    rates: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, list[int]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.repeats):
            for name in names if index % 2 == 0 else names[::-1]:
                result = ProcessRunner(launch).run(
                    WindowOrder(config=config(name, args.batch_size, args.amp)),
                    Path(folder) / "trial.log",
                )
                assert result.status == "ok", f"{name}: {result.reason}"
                rates[name].append(result.samples_per_s or 0.0)
                peaks[name].append(result.peak_memory_bytes or 0)
    print("| layout | samples/s | peak memory |")
    print("|---|---|---|")
    for name in names:
        peak = int(statistics.median(peaks[name]))
        print(f"| {name} | {statistics.median(rates[name]):,.1f} | {gib(peak)} |")


if __name__ == "__main__":
    main()
