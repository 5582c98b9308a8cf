"""Rich rendering for the CLI: live trial progress and the final tables."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.table import Table

from advisor.knobs import TrialConfig
from advisor.progress import Stage
from advisor.report.verdicts import claim_text
from advisor.results import (
    HardwareProfile,
    NoiseScale,
    Racer,
    Recommendation,
    TaskSummary,
    TrialRecord,
    TrialResult,
    shown_knobs,
)

__all__ = [
    "NOT_GOING_ON",
    "ConsoleProgress",
    "hardware_table",
    "recommendation_table",
    "stage_text",
    "validation_table",
]

PHASE_NAMES = {
    "starting": "starting",
    "first_step": "first step",
    "warmup": "warming up",
    "measure": "measuring",
}


class ConsoleProgress:
    """Live progress on a terminal (a spinner line for the running trial); plain lines otherwise."""

    def __init__(self, console: Console, quiet: bool = False) -> None:
        self._console = console
        self._quiet = quiet
        self._status: Status | None = None
        self._label = ""
        self._best: float | None = None
        self._failures: Counter[str] = Counter()

    def stage(self, message: str | Stage) -> None:
        text = message if isinstance(message, str) else stage_text(message)
        if not self._quiet:
            self._console.print(f"[dim]·[/] {escape(text)}", highlight=False, soft_wrap=True)

    def trial_started(self, label: str, config: TrialConfig) -> None:
        self._label = escape(f"{label}  {config.label()}")  # printed as rich markup
        if self._quiet:
            return
        if self._console.is_terminal:
            self._status = self._console.status(self.status_text("starting"))
            self._status.start()
        else:
            self._console.print(f"  {self._label} …", highlight=False)

    def trial_phase(self, phase: str) -> None:
        if self._status is not None:
            self._status.update(self.status_text(phase))

    def trial_finished(self, record: TrialRecord, best: float | None) -> None:
        self._end_status()
        self._best = best or self._best
        stopped = record.result.status == "stopped"  # far slower than the best: no failure
        if record.role != "confirm" and not record.eligible and not stopped:
            self._failures["memory" if record.infeasible_reason else record.result.status] += 1
        if self._quiet:
            return
        result = record.result
        if record.eligible:
            outcome = f"[green]{result.samples_per_s:>10,.0f} samples/s[/]"
            if result.stopped_early:
                why = result.reason or "far slower than the best"
                outcome += f" ({escape(why)}; after {result.window_s or 0:.1f} s of its window)"
        elif stopped:
            when = "its window" if result.failure_phase == "measure" else "its warm-up"
            outcome = f"[yellow]{escape(result.reason or 'stopped')}[/] (during {when})"
        else:
            why = record.infeasible_reason or result.reason or ""
            outcome = f"[red]{result.status}[/] {escape(why)}"
        mark = "[green]✓[/]" if record.eligible else "[yellow]–[/]" if stopped else "[red]✗[/]"
        self._console.print(f"{mark} {self._label}  {outcome}", highlight=False)

    def racer_finished(self, racer: Racer) -> None:
        self._end_status()
        if self._quiet:
            return
        curve = racer.curve
        if curve is None:
            why = escape(racer.result.reason or "")
            self._console.print(f"[red]✗[/] {self._label}  [red]{racer.result.status}[/] {why}")
            return
        end = curve.points[-1]
        self._console.print(
            f"[green]✓[/] {self._label}  {curve.loss_kind} loss {end.loss:.4g} after "
            f"{end.seconds:.1f} s ({end.steps:,} steps, {end.samples:,} samples)",
            highlight=False,
        )

    def noise_finished(self, noise: NoiseScale | None, failure: str | None) -> None:
        self._end_status()
        if self._quiet:
            return
        if noise is None:
            why = escape(failure or "")
            self._console.print(f"[red]✗[/] {self._label}  [red]failed[/] {why}", highlight=False)
            return
        if noise.value is None:
            outcome = f"phi: no signal above the noise in {noise.steps:,} steps"
        else:
            interval = f"{noise.low or 0:.3g}-{noise.high or 0:.3g}"
            outcome = f"phi = {noise.value:.3g} (95 % interval {interval}), {noise.steps:,} steps"
        self._console.print(f"[green]✓[/] {self._label}  {outcome}", highlight=False)

    def _end_status(self) -> None:
        """Stop the running trial's live line, if any: one at a time."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def status_text(self, phase: str) -> str:
        """The live line: the running trial and its phase, the best so far, failures by kind."""
        best = f" · best {self._best:,.0f} samples/s" if self._best else ""
        failed = ", ".join(f"{n} {kind}" for kind, n in self._failures.most_common())
        failures = f" · failed: {failed}" if failed else ""
        return f"{self._label} · {PHASE_NAMES.get(phase, phase)}{best}{failures}"


def recommendation_table(rec: Recommendation) -> Table:
    """The recommendation against the baseline, knob by knob, with both throughputs."""
    speedup = f"{rec.speedup:.2f}x" if rec.speedup else "–"
    if rec.confirmation is not None and not rec.confirmation.confirmed:
        speedup = f"unconfirmed, at most {speedup}"
    title = f"Recommended configuration ({speedup} your baseline's samples/s)"
    if rec.time_to_loss is not None:
        title = (
            f"Recommended configuration: your loss {claim_text(rec.time_to_loss)} sooner "
            f"({speedup} samples/s)"
        )
    elif rec.race is not None and rec.race.verdict.kind == "close-call":
        title = f"Recommended configuration: a close call ({speedup} samples/s)"
    table = Table(title=title)
    table.add_column("knob")
    table.add_column("recommended", style="bold green")
    table.add_column("baseline")
    for row in shown_knobs(rec):
        recommended = str(getattr(rec.config, row.name))
        table.add_row(row.name, recommended, str(getattr(rec.baseline_config, row.name)))
    table.add_row(
        "global batch",
        str(rec.config.global_batch_size),
        str(rec.baseline_config.global_batch_size),
    )
    if rec.baseline_samples_per_s:
        base = f"{rec.baseline_samples_per_s:,.0f}"
    elif rec.baseline_over_budget:
        base = "over budget"
    else:
        base = "failed"
    table.add_row("samples/s", f"{rec.samples_per_s:,.0f}", base)
    return table


def hardware_table(hardware: HardwareProfile) -> Table:
    """What `advisor probe` shows: CPU, memory, torch and CUDA, GPUs and matmul peaks."""
    table = Table(title="Hardware", show_header=False)
    table.add_column("what")
    table.add_column("value")
    cpu = escape(hardware.cpu_model)
    table.add_row("CPU", f"{cpu}, {hardware.cores} cores, {hardware.cpu_capability}")
    table.add_row("CPU bf16", "native (AVX512-BF16/AMX)" if hardware.cpu_bf16 else "emulated")
    table.add_row("memory", f"{hardware.memory_bytes / 2**30:.1f} GiB, {hardware.allocator}")
    if hardware.cpu_peak_flops:
        table.add_row("CPU matmul peak", _peaks(hardware.cpu_peak_flops))
    table.add_row("Python / torch", f"{hardware.python_version} / {hardware.torch_version}")
    table.add_row(
        "CUDA / cuDNN", f"{hardware.cuda_version or '–'} / {hardware.cudnn_version or '–'}"
    )
    if not hardware.gpus:
        table.add_row("GPUs", "none")
    for index, gpu in enumerate(hardware.gpus):
        details = (
            f"{escape(gpu.name)}, {gpu.memory_bytes / 2**30:.1f} GiB, capability {gpu.capability}"
        )
        table.add_row(f"GPU {index}", f"{details}, fp16, {'bf16' if gpu.bf16 else 'no bf16'}")
        if gpu.peak_flops:
            table.add_row(f"GPU {index} matmul peak", _peaks(gpu.peak_flops))
    return table


def _peaks(peaks: dict[str, float]) -> str:
    return ", ".join(f"{dtype} {rate / 1e9:,.0f} GFLOP/s" for dtype, rate in peaks.items())


def validation_table(result: TrialResult) -> Table:
    """What `advisor validate` shows: the task as built, its batch, a step's time."""
    task: TaskSummary | None = result.task
    table = Table(title="The task builds and trains", show_header=False)
    table.add_column("what")
    table.add_column("value")
    if task is not None:
        model = escape(task.model_class)
        table.add_row("model", f"{model}, {task.num_parameters:,} parameters")
        size = f", {task.dataset_size:,} samples" if task.dataset_size is not None else ""
        table.add_row("dataset", f"{escape(task.dataset_class)}{size}")
        table.add_row("batch", f"{escape(task.batch_description)} ({task.batch_kind})")
        table.add_row("loss", "returned by the model" if task.loss_from_model else "loss_fn")
        table.add_row("your batch size", str(task.user_batch_size))
    if result.step_time_median_s is not None:
        table.add_row("step time", f"{result.step_time_median_s * 1e3:.1f} ms (second step)")
    if result.startup_s is not None:
        table.add_row("startup", f"{result.startup_s:.1f} s to the first step")
    return table


# Why a race does not go on (`advisor.decide.race.extend.why_not_go_on`).
NOT_GOING_ON = {
    "continue-1": "--race-continue 1 keeps the race to its length",
    "no-target": "the race set no target",
    "another-batch-won": "another global batch won already, which a longer race favours more",
    "state-not-saved": "your configuration's training state was not saved",
    "no-other-batch": "no other global batch raced",
}


def stage_text(stage: Stage) -> str:
    """A step of the decision, in a line."""
    if stage.kind == "racing":
        return (
            f"racing {stage.count} configurations for {stage.seconds:g} s of training each, "
            "from the same initial weights, to your loss"
        )
    if stage.kind == "race-replicate":
        return (
            f"race replicate {stage.count}: the finalists again, from other initial weights "
            "and another data order"
        )
    if stage.kind == "race-goes-on":
        return (
            f"the race kept your global batch; {stage.count} finalists go on from where they "
            f"stopped to {stage.seconds:g} s of training, to judge it later in training"
        )
    if stage.kind == "race-stays":
        return f"the race kept your global batch and does not go on: {NOT_GOING_ON[stage.label]}"
    if stage.kind == "race-went-on-alone":
        return (
            f"after {stage.until_s:g} s of replicate 1, the other global batch cannot win over "
            f"the race's replicates: they do not go on, and the verdict after "
            f"{stage.seconds:g} s stands"
        )
    if stage.kind == "race-skips":
        return (
            "your loss did not fall in the race: it cannot compare global batches, so the "
            f"other {stage.count} racers are skipped"
        )
    if stage.kind == "schedule-tracks":
        return (
            f"batch-size schedule: training your configuration for {stage.seconds:g} s, "
            "measuring the noise scale along the way"
        )
    if stage.kind == "schedule-races":
        return (
            f"racing {stage.label} against the fixed recommendation, {stage.seconds:g} s each "
            f"at most, to your loss {stage.loss:.4g}"
        )
    return (
        f"your baseline and the next {stage.count} trials all raised {stage.label}: the error "
        "is your code's or data's, not a configuration's; the search stops"
    )
