"""DDP and FSDP trials: the trial child supervises `world_size` ranks and combines what they
measured.

The ranks are started with torch's own launcher (`torch.multiprocessing.start_processes`), which
stops every rank as soon as one fails. They are forks of this supervisor, which has imported
torch and run nothing else, so a rank starts in milliseconds, not seconds (the CUDA ranks set up
their devices after the fork). They rendezvous through a `TCPStore` that this supervisor binds to
port 0 after forking them (its server thread must not be forked) and holds for the whole trial,
so concurrent trials can never race for a port. Ranks stay in the trial's process group: the
runner's timeout kills them all.

Each rank writes its own `TrialResult` to a file instead of gathering them with a collective, so
a dead rank cannot leave the others waiting to report. Throughput is the samples of all ranks
divided by the slowest rank's window (the ranks start their windows at a barrier).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict
from torch.multiprocessing import start_processes
from torch.multiprocessing.spawn import ProcessContext, ProcessException

from advisor.knobs import TrialConfig
from advisor.results import RankResult, TrialResult
from advisor.trial.child import nodes
from advisor.trial.child.measure import measure_request
from advisor.trial.nodes import NodeOrder, NodeReport
from advisor.trial.protocol import NodePart, TrialRequest, died_without_result

__all__ = ["combine_ranks", "run_distributed"]

LOCALHOST = "127.0.0.1"
RANK_GRACE_S = 1.0  # after one rank fails, how long the others get before SIGTERM
RENDEZVOUS_TIMEOUT = timedelta(minutes=5)
# How long a collective may wait for a peer (gloo's default is 30 min): the trial's timeout in the
# parent ends a hung trial first; this bounds what a rank of another machine waits.
GROUP_TIMEOUT = timedelta(minutes=10)
CHECK_S = 1.0  # across machines: how often the other nodes' beats are read while ranks run
PORT_FILE = "store-port"
NO_STORE = 0  # written instead of a port when the store could not be opened


class RankReport(BaseModel):
    """What one rank leaves behind: its result and when it finished (to order failures)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    finished_ns: int
    result: TrialResult


def run_distributed(request: TrialRequest) -> TrialResult:
    """Run one DDP or FSDP trial: start the ranks, wait for all of them, combine their results.
    A trial whose ranks span several machines runs this machine's part (`_across_nodes`)."""
    config = request.config
    # Inside the trial's scratch folder: where the runner kills this process group (a timeout),
    # the runner's own clean-up removes it.
    trial_scratch = Path(request.channel.result_path).parent
    with tempfile.TemporaryDirectory(prefix="advisor-ranks-", dir=trial_scratch) as scratch:
        reports = Path(scratch)
        # Forked before the store's server thread exists: this process has imported torch but
        # run nothing, so the ranks start without importing it again.
        context = start_processes(
            _rank_main,
            args=(request, str(reports)),
            nprocs=config.per_node,
            join=False,
            start_method="fork",
        )
        if request.node is not None:
            return _across_nodes(request, request.node, context, reports)
        try:
            store = dist.TCPStore(LOCALHOST, 0, is_master=True, wait_for_workers=False)
        except (RuntimeError, OSError) as exc:
            _write_atomically(reports / PORT_FILE, str(NO_STORE))  # the ranks give up at once
            _stop(context)
            return _supervisor_failed(config, f"could not open the rendezvous store: {exc}")
        _write_atomically(reports / PORT_FILE, str(store.port))
        exit_codes = _wait_for_ranks(context)
        if isinstance(exit_codes, dict):  # no check: never a reason
            _stop(context)
            return _rank_failure(config, _read_reports(reports), exit_codes)
        results = [report.result for report in _read_reports(reports).values()]
    if len(results) != config.world_size:
        return _supervisor_failed(config, "a rank exited without a result")
    return combine_ranks(config, results)


def _across_nodes(
    request: TrialRequest, part: NodePart, context: ProcessContext, reports: Path
) -> TrialResult:
    """This machine's part of a trial over several: node 0 posts the trial to the others,
    watches their beats while its ranks train, gathers their ranks' results and combines all;
    another node reports its ranks' results to node 0 (its own result is for its log)."""
    config, lead = request.config, part.node_rank == 0
    try:
        store = nodes.connect(part.host, part.port)
        if lead:
            nodes.post_order(store, NodeOrder(request=request))
        others = range(1, config.nnodes) if lead else ()
        watch = nodes.BeatWatch(store, others if lead else (0,))  # node 0 watches the rest
    except (RuntimeError, OSError) as exc:
        _stop(context, at_once=True)
        return _supervisor_failed(config, f"could not reach node 0's store: {exc}")
    offset = part.node_rank * config.per_node
    outcome = _wait_for_ranks(context, offset, watch.silent)
    local = _read_reports(reports)
    if outcome is not None:
        _stop(context, at_once=isinstance(outcome, str))
        failed = (
            _supervisor_failed(config, outcome)
            if isinstance(outcome, str)
            else _rank_failure(config, local, outcome)
        )
        if not lead:
            with contextlib.suppress(RuntimeError, OSError):  # node 0 may be gone
                nodes.post_report(store, part, nodes.failed_part(part, failed))
        return failed
    mine = {report.rank: report.result for report in local.values()}
    if not lead:
        with contextlib.suppress(RuntimeError, OSError):
            nodes.post_report(store, part, NodeReport(node=part.node_rank, results=mine))
        return combine_ranks(config, list(mine.values()))
    gathered = nodes.gather_reports(store, part, others, watch)
    if isinstance(gathered, str):
        return _supervisor_failed(config, gathered)
    return _combine_nodes(config, mine, gathered)


def _combine_nodes(
    config: TrialConfig, mine: dict[int, TrialResult], others: dict[int, NodeReport]
) -> TrialResult:
    """One result from every node's ranks, or the first node's failure."""
    results = dict(mine)
    for node, report in sorted(others.items()):
        if report.failure is not None:
            return report.failure.model_copy(
                update={"config": config, "reason": f"node {node}: {report.failure.reason}"}
            )
        results.update(report.results)
    if sorted(results) != list(range(config.world_size)):
        return _supervisor_failed(config, "a rank exited without a result")
    return combine_ranks(config, [results[rank] for rank in range(config.world_size)])


def _stop(context: ProcessContext, *, at_once: bool = False) -> None:
    """Stop and reap the ranks still running, after one failed (SIGTERM, then SIGKILL after the
    grace period); `at_once` where none failed (another machine is gone): SIGKILL."""
    if at_once:
        for process in context.processes:
            process.kill()
    with contextlib.suppress(ProcessException):
        context.join(grace_period=RANK_GRACE_S)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _store_port(reports: Path) -> int:
    """The rendezvous port, once the supervisor has written it."""
    path = reports / PORT_FILE
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT.total_seconds()
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the supervisor did not open the rendezvous store")
        time.sleep(0.005)
    port = int(path.read_text())
    if port == NO_STORE:
        raise RuntimeError("the supervisor could not open the rendezvous store")
    return port


def _wait_for_ranks(
    context: ProcessContext, offset: int = 0, check: Callable[[], str | None] | None = None
) -> dict[int, int] | str | None:
    """Wait for every rank to exit; None when all succeeded.

    Otherwise, as soon as one fails, the exit codes of the ranks already gone at that moment,
    by global rank (`offset` + local rank): a rank that died without a report (a signal, a
    crash) is the cause, not the ranks that failed after it because their peer was gone. Where
    `check` says why the trial cannot go on (another machine stopped answering), that reason.
    """
    processes = context.processes
    pending = {process.sentinel: rank for rank, process in enumerate(processes)}
    while pending:
        for sentinel in wait(list(pending), timeout=None if check is None else CHECK_S):
            process = processes[pending.pop(sentinel)]
            process.join()
            if process.exitcode != 0:
                return {
                    offset + rank: other.exitcode
                    for rank, other in enumerate(processes)
                    if other.exitcode is not None
                }
        if check is not None and (reason := check()) is not None:
            return reason
    return None


def combine_ranks(config: TrialConfig, results: list[TrialResult]) -> TrialResult:
    """One trial result from every rank's: all samples over the slowest rank's window."""
    if all(r.status == "stopped" for r in results):  # the parent stopped every rank
        return results[0].model_copy(update={"config": config})
    failed = [(rank, r) for rank, r in enumerate(results) if not r.feasible]
    if failed:
        rank, first = failed[0]
        return _as_rank_failure(config, rank, first)
    slowest = max(results, key=lambda r: r.window_s or 0.0)
    window_s = slowest.window_s or 0.0
    samples = sum(r.samples_measured for r in results)
    rate = samples / window_s if window_s else None
    siblings = {}
    if slowest.estimated:  # the ranks keep the pace of the slowest at every optimizer step
        rate = len(results) * min(r.samples_per_s or 0.0 for r in results)
        siblings = {
            acc: len(results) * min(r.sibling_rates.get(acc, 0.0) for r in results)
            for acc in slowest.sibling_rates
        }
    peaks = [r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None]
    waits = [r.data_wait_fraction for r in results if r.data_wait_fraction is not None]
    starts = [r.startup_s for r in results if r.startup_s is not None]
    warmups = [r.warmup_s for r in results if r.warmup_s is not None]
    return results[0].model_copy(
        update={
            "config": config,
            "samples_per_s": rate,
            "sibling_rates": {a: r for a, r in siblings.items() if r > 0},
            "samples_measured": samples,
            "window_s": window_s,
            "step_time_median_s": slowest.step_time_median_s,
            "step_time_p10_s": slowest.step_time_p10_s,
            "step_time_p90_s": slowest.step_time_p90_s,
            "data_wait_fraction": max(waits, default=None),
            # CPU ranks share the host's memory; GPU ranks each have a device of their own.
            "peak_memory_bytes": (max if config.device == "cuda" else sum)(peaks)
            if peaks
            else None,
            "startup_s": max(starts, default=None),
            "warmup_s": max(warmups, default=None),
            "ranks": tuple(_rank_summary(rank, r) for rank, r in enumerate(results)),
        }
    )


def _rank_summary(rank: int, result: TrialResult) -> RankResult:
    return RankResult(
        rank=rank,
        samples_per_s=result.samples_per_s or 0.0,
        window_s=result.window_s or 0.0,
        data_wait_fraction=result.data_wait_fraction,
        peak_memory_bytes=result.peak_memory_bytes,
        startup_s=result.startup_s,
    )


def _rank_main(local_rank: int, request: TrialRequest, reports: str) -> None:
    """Entry point of one rank (a forked process): join the group, measure, report, exit."""
    config, part = request.config, request.node
    rank = local_rank + (part.node_rank * config.per_node if part is not None else 0)
    try:
        if config.device == "cuda":
            torch.cuda.set_device(local_rank)
        store = _rank_store(part, Path(reports), config.world_size)
        backend = "nccl" if config.device == "cuda" else "gloo"
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=config.world_size, timeout=GROUP_TIMEOUT
        )
    except Exception as exc:  # reported as this rank's failure
        result = TrialResult(
            config=config, status="error", reason=f"could not join the process group: {exc}"
        )
    else:
        result = measure_request(request, rank)
    report = RankReport(rank=rank, finished_ns=time.monotonic_ns(), result=result)
    _write_atomically(Path(reports) / f"rank-{rank}.json", report.model_dump_json())
    sys.stdout.flush()
    sys.stderr.flush()
    # A failed rank exits non-zero so that the launcher stops the others at once (they may be
    # waiting for it in a collective). No interpreter shutdown: user threads cannot hang it.
    os._exit(0 if result.feasible else 1)


def _rank_store(part: NodePart | None, reports: Path, world_size: int) -> dist.Store:
    """Where the ranks meet: this supervisor's store, or, across machines, node 0's under the
    trial's own prefix (a fresh rendezvous per trial: a failed one leaves nothing behind)."""
    if part is not None:
        store = nodes.connect(part.host, part.port, RENDEZVOUS_TIMEOUT)
        return dist.PrefixStore(f"{part.key}/pg", store)
    port = _store_port(reports)
    return dist.TCPStore(LOCALHOST, port, world_size, is_master=False, timeout=RENDEZVOUS_TIMEOUT)


def _read_reports(reports: Path) -> dict[int, RankReport]:
    found = (
        RankReport.model_validate_json(path.read_text()) for path in reports.glob("rank-*.json")
    )
    return {report.rank: report for report in sorted(found, key=lambda report: report.rank)}


def _rank_failure(
    config: TrialConfig, reports: dict[int, RankReport], exit_codes: dict[int, int]
) -> TrialResult:
    """The trial's failure: a rank that died without a report, else the earliest failure."""
    for rank, code in sorted(exit_codes.items()):
        if code != 0 and rank not in reports:
            return died_without_result(config, f"rank {rank}", code)
    failed = sorted(
        (report for report in reports.values() if not report.result.feasible),
        key=lambda report: report.finished_ns,
    )
    if failed:
        return _as_rank_failure(config, failed[0].rank, failed[0].result)
    return _supervisor_failed(config, "a rank failed without a result")


def _as_rank_failure(config: TrialConfig, rank: int, result: TrialResult) -> TrialResult:
    return result.model_copy(update={"config": config, "reason": f"rank {rank}: {result.reason}"})


def _supervisor_failed(config: TrialConfig, reason: str) -> TrialResult:
    return TrialResult(config=config, status="crashed", reason=reason)
