"""Parent side of a trial: start an isolated child, enforce the timeout, read its result.

A search trial reports its progress from its warm-up on; the parent projects its samples/s and
may stop it in any phase (`ProgressCallback`). A child busy in one long micro-step cannot look
for the stop, so it is killed after `STOP_GRACE_S`: what it measured so far is all there is.

The child runs in a new session (its own process group), so killing the group also kills its
DataLoader workers. Nothing the child does (raise, hang, segfault, get OOM-killed) escapes as an
exception here: it comes back as a `TrialResult` with a status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast, get_args

from advisor.knobs import TrialConfig
from advisor.results import FailurePhase, MachineLoad, TrialResult
from advisor.trial.nodes import Rendezvous
from advisor.trial.orders import (
    NoiseOrder,
    PhaseCallback,
    ProgressCallback,
    RaceOrder,
    TrialOrder,
    replicate_seed,
)
from advisor.trial.parent.environment import child_env, json_safe
from advisor.trial.parent.group import GRACE_S, TrialChild, kill_group, signal_group
from advisor.trial.parent.launcher import (
    ForkedTrial,
    LauncherGoneError,
    UnsafePreloadError,
    shared_launcher,
)
from advisor.trial.parent.load import LoadMeter
from advisor.trial.parent.preload import installed_imports
from advisor.trial.parent.watch import ProgressReader
from advisor.trial.protocol import Channel, NodePart, TrialRequest, died_without_result

__all__ = ["POLL_S", "Nodes", "ProcessRunner", "TrialLaunch"]

POLL_S = 0.2
STOP_GRACE_S = 1.0
NODE_CHECK_S = 5.0  # after a failed trial over machines: how long to listen for a node gone
GPU_SAMPLE_S = 2.0  # how often other programs on the trial's GPUs are counted (NVML)


@dataclass(kw_only=True)
class TrialLaunch:
    """Everything but the order that a trial needs: what to build, how long, its timeout."""

    spec: str
    cwd: Path
    warmup_steps: int
    trial_seconds: float
    timeout_s: float
    seed: int = 0
    max_measure_steps: int | None = None
    # Fork each trial from advisor's pre-imported launcher (`advisor.trial.parent.launcher`)
    # rather than start a fresh interpreter: 2 s less per trial, as isolated.
    preloaded: bool = True
    # The launcher also imports the installed packages the factory's module imports, once for
    # all trials (`advisor.trial.parent.preload`): 1.2-1.9 s less per trial of a module that
    # imports transformers.
    import_ahead: bool = True

    def lasting(self, seconds: float) -> TrialLaunch:
        """The same launch for a trial that trains `seconds` (a race): its timeout grows by
        twice the difference, for the evaluations."""
        timeout_s = self.timeout_s + 2 * max(0.0, seconds - self.trial_seconds)
        return dataclasses.replace(self, trial_seconds=seconds, timeout_s=timeout_s)


class Nodes(Protocol):
    """The other machines of a tune over several, as node 0 hears them
    (`advisor.trial.parent.nodes.NodeHost`)."""

    rendezvous: Rendezvous

    def gone(self, wait_s: float = 0.0) -> dict[int, str]:
        """The machines heard gone, and how (listening `wait_s` for one); `NodeLostError` where
        nothing over several machines can run any more."""


class ProcessRunner:
    """The real `TrialRunner`: every order runs in a fresh, isolated child process. With `nodes`
    (node 0 of a tune over several machines), an order whose ranks span machines runs its part
    here and is posted to the others through node 0's store (`advisor.trial.nodes`)."""

    def __init__(self, launch: TrialLaunch, nodes: Nodes | None = None) -> None:
        self.launch = launch
        self.nodes = nodes

    def run(
        self,
        order: TrialOrder,
        log_path: Path,
        *,
        on_phase: PhaseCallback | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> TrialResult:
        """Run one trial in a fresh child process and return what it measured (or why it failed).

        `on_progress` sees the projected samples/s from the warm-up on and may stop the trial:
        in its window, the result measures the shorter window and says `stopped_early`; before,
        its status is `stopped`, with the projection as its samples/s. Either way `reason` says
        why. A race or noise order trains for its own seconds, and its timeout grows with them.
        Across machines, a machine that stopped answering fails every trial that spans it;
        where that leaves nothing over machines to run (node 1 gone), every order raises
        `NodeLostError`: the tune ends in one line, its finished trials kept.
        """
        launch = self._launch_for(order)
        if self.nodes is not None and (lost := self._lost(order.config)) is not None:
            return TrialResult(config=order.config, status="crashed", reason=lost)
        part = self._node_part(order.config)
        watched = on_progress is not None

        def request(scratch: Path) -> TrialRequest:
            return _request(order, launch, scratch, watched=watched, node=part)

        result = _run(request, launch, log_path, on_phase, on_progress)
        if part is not None and not result.feasible and self.nodes is not None:
            self.nodes.gone(wait_s=NODE_CHECK_S)  # a failure may be a machine gone
        return result

    def serve(self, posted: TrialRequest, log_path: Path) -> TrialResult:
        """Run this machine's part of a trial node 0 posted (`posted.node` says which), in this
        machine's folder, through a channel of its own."""
        launch = self._launch_for(posted.order)

        def request(scratch: Path) -> TrialRequest:
            channel = Channel(
                launched_at=time.time(),
                result_path=str(scratch / "result.json"),
                phase_path=str(scratch / "phase"),
            )
            return posted.model_copy(update={"channel": channel, "cwd": str(launch.cwd)})

        return _run(request, launch, log_path, None, None)

    def _lost(self, config: TrialConfig) -> str | None:
        """Why `config` cannot run: a machine it spans is gone (node 1 gone: `NodeLostError`,
        as nothing over machines can run; with more machines, the others go on)."""
        assert self.nodes is not None
        gone = self.nodes.gone()
        needed = sorted(node for node in gone if node < config.nnodes)
        if not needed:
            return None
        return f"{gone[needed[0]]}: a layout over {config.nnodes} machines cannot run"

    def _launch_for(self, order: TrialOrder) -> TrialLaunch:
        if isinstance(order, (RaceOrder, NoiseOrder)):
            return self.launch.lasting(order.seconds)
        return self.launch

    def _node_part(self, config: TrialConfig) -> NodePart | None:
        """Node 0's part of a trial over `config.nnodes` machines, under a fresh key."""
        if config.nnodes == 1:
            return None
        if self.nodes is None:
            raise ValueError(f"{config.label()} spans machines: this runner has no other nodes")
        where = self.nodes.rendezvous
        key = f"trial-{uuid.uuid4().hex[:12]}"
        return NodePart(node_rank=0, host=where.host, port=where.port, key=key)


def _run(
    request_in: Callable[[Path], TrialRequest],
    launch: TrialLaunch,
    log_path: Path,
    on_phase: PhaseCallback | None,
    on_progress: ProgressCallback | None,
) -> TrialResult:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="advisor-trial-") as scratch:
        request = request_in(Path(scratch))
        request_path = Path(scratch) / "request.json"
        request_path.write_text(request.model_dump_json())
        started = time.perf_counter()
        watch = ProgressReader(request, on_phase, on_progress)
        outcome, returncode, load = _supervise(request, request_path, launch, log_path, watch)
        wall_s = time.perf_counter() - started
        result = watch.stopped(outcome or _read_result(request, returncode, log_path))
    return result.model_copy(update={"wall_s": wall_s, "log_path": str(log_path), "load": load})


def _request(
    order: TrialOrder,
    launch: TrialLaunch,
    scratch: Path,
    *,
    watched: bool,
    node: NodePart | None = None,
) -> TrialRequest:
    channel = Channel(
        launched_at=time.time(),
        result_path=str(scratch / "result.json"),
        phase_path=str(scratch / "phase"),
        progress_path=str(scratch / "progress") if watched else None,
        stop_path=str(scratch / "stop") if watched else None,
    )
    return TrialRequest(
        order=order,
        spec=launch.spec,
        cwd=str(launch.cwd),
        seed=replicate_seed(launch.seed, order),
        warmup_steps=launch.warmup_steps,
        trial_seconds=launch.trial_seconds,
        max_measure_steps=launch.max_measure_steps,
        channel=channel,
        node=node,
    )


def _supervise(
    request: TrialRequest,
    request_path: Path,
    launch: TrialLaunch,
    log_path: Path,
    watch: ProgressReader,
) -> tuple[TrialResult | None, int, MachineLoad | None]:
    """Wait for the child, reading the machine's load meanwhile; return a result only when
    the parent decided the outcome."""
    try:
        process = _start_child(request_path, launch, log_path)
    except LauncherGoneError as exc:
        return _launcher_failed(request, exc), 1, None
    meter = _meter(process, request.config)
    try:
        timed_out, phase = _wait(process, request, launch.timeout_s, watch, meter)
    except LauncherGoneError as exc:  # its trial child followed it (advisor.trial.child.worker)
        signal_group(process.pid, signal.SIGKILL)
        return _launcher_failed(request, exc), 1, None
    finally:
        # Also on Ctrl-C: the child is in another session, so the terminal's SIGINT
        # never reached it. Orphaned loader workers die with the group too.
        with contextlib.suppress(LauncherGoneError):
            kill_group(process)
    load, code = meter.stop(), process.returncode or 0  # reaped: its CPU time is counted
    if timed_out and watch.stop is not None and not Path(request.channel.result_path).exists():
        # it did not stop in time, and was killed: what it measured so far is all there is
        return TrialResult(config=request.config, status="stopped"), code, load
    if timed_out:
        return _timed_out(request, launch.timeout_s, phase), code, load
    return None, code, load


def _meter(process: TrialChild, config: TrialConfig) -> LoadMeter:
    """A started meter of the machine's load around `process`, whose reaper is advisor's
    launcher for a forked trial, else this process."""
    reaper = process.launcher_pid if isinstance(process, ForkedTrial) else None
    gpus = tuple(range(max(1, config.world_size))) if config.device == "cuda" else ()
    meter = LoadMeter(reaper, gpus=gpus)
    meter.start()
    return meter


def _start_child(request_path: Path, launch: TrialLaunch, log_path: Path) -> TrialChild:
    """A trial child leading a session of its own, its output going to `log_path`."""
    env = child_env()
    if launch.preloaded and json_safe(env):
        paths = (str(request_path), str(log_path), str(launch.cwd))
        preload = installed_imports(launch.spec, launch.cwd) if launch.import_ahead else ()
        for _ in preload:  # each try leaves one more package to the trials
            try:
                return shared_launcher(env, launch.cwd, preload).fork(*paths, preload=preload)
            except UnsafePreloadError:  # that launcher is gone
                continue
        return shared_launcher(env, launch.cwd, ()).fork(*paths)
    with log_path.open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "advisor.trial.child.worker", str(request_path)],
            cwd=launch.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )


def _launcher_failed(request: TrialRequest, exc: LauncherGoneError) -> TrialResult:
    return TrialResult(config=request.config, status="crashed", reason=str(exc))


def _timed_out(request: TrialRequest, timeout_s: float, phase: str) -> TrialResult:
    return TrialResult(
        config=request.config,
        status="timeout",
        reason=f"no result after {timeout_s:.0f} s (phase: {phase}); "
        "the trial's process group was killed",
        failure_phase=cast(FailurePhase, phase) if phase in get_args(FailurePhase) else None,
    )


def _wait(
    process: TrialChild,
    request: TrialRequest,
    timeout_s: float,
    watch: ProgressReader,
    meter: LoadMeter,
) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout_s
    sampled = 0.0
    result_path = Path(request.channel.result_path)
    result_seen: float | None = None
    while True:
        finished = process.poll() is not None
        if result_seen is None and result_path.exists():
            result_seen = time.monotonic()
        # A written result means the trial is over, even if the child is slow to exit.
        finished = finished or (
            result_seen is not None and time.monotonic() - result_seen > GRACE_S
        )
        watch.read(progress=result_seen is None)  # a finished trial is judged no more
        if time.monotonic() - sampled > GPU_SAMPLE_S:
            meter.sample(process.pid)
            sampled = time.monotonic()
        if finished:
            return False, watch.phase
        if watch.stop is not None and result_seen is None:
            deadline = min(deadline, watch.stop.at + STOP_GRACE_S)
        if time.monotonic() > deadline:
            return True, watch.phase
        _pause(process, POLL_S)


def _pause(process: TrialChild, seconds: float) -> None:
    """Sleep `seconds`, or less: until the child exits, so that a finished trial costs no idle
    wait (at a fixed 0.2-s poll, a third of a short search trial's wall was that wait)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=seconds)


def _read_result(request: TrialRequest, returncode: int, log_path: Path) -> TrialResult:
    result_path = Path(request.channel.result_path)
    if result_path.exists():
        return TrialResult.model_validate_json(result_path.read_text())
    return _died(request, returncode, log_path)


def _died(request: TrialRequest, code: int, log_path: Path) -> TrialResult:
    return died_without_result(request.config, "the trial process", code, f"; see {log_path}")
