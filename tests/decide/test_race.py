"""The convergence race: races on scripted workloads where a big batch loses or wins, run
in-process by a `ScriptedRunner`, in replicates on one sample grid; the verdict's statistics on
described racers (a clear win, a close call, a loss that does not fall, a challenger that never
reaches the target, an unconfirmed samples/s, replicates that disagree); an interrupt keeps the
finished racers."""

import itertools
import math
import tempfile
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist

import optuna
import pytest

from advisor.decide.claims import COVERAGE
from advisor.decide.decision import race_choice
from advisor.decide.race.estimate import (
    PROCESS_DRIFT_SD,
    RATE_DRIFT_SD,
    RateBook,
    rate_drift,
    replicate_targets,
    samples_to_loss,
)
from advisor.decide.race.extend import (
    MAX_PRECISION_REPLICATES,
    MIN_REPLICATES,
    race_in_replicates,
)
from advisor.decide.race.grid import sample_grid
from advisor.decide.race.plan import RacePlan, lr_rule
from advisor.decide.race.run import Heat, race_grid, race_replicate
from advisor.decide.race.verdict import MARGIN, decide_race, needs_replicates, too_wide
from advisor.decide.reruns import Selection
from advisor.knobs import TrialConfig
from advisor.noise_scale import predict_batches, race_finalists
from advisor.progress import Progress
from advisor.report.verdicts import race_verdict
from advisor.results import (
    BatchPrediction,
    LrPlan,
    NoiseScale,
    RaceCurve,
    RacePoint,
    Racer,
    Tie,
    TrialRecord,
    TrialResult,
    stop_index,
)
from advisor.search.context import SearchContext
from advisor.search.records import read_racers
from advisor.settings import TuneSettings
from advisor.trial.orders import RaceOrder
from tests.scripted_runner import ScriptedRunner, scripted_context
from tests.search.interrupts import StopAfterFirstRacer

SMALL = TrialConfig(batch_size=8)
BIG = TrialConfig(batch_size=256)
RACE_S = 2.5
TWO = ((SMALL, "yours"), (BIG, "linear"))  # your baseline, and the big batch at the rule's lr


def _context(
    tmp_path: Path, runner: ScriptedRunner, progress: Progress | None = None
) -> SearchContext:
    settings = TuneSettings(
        spec="train.py:task", race_seconds=RACE_S, max_world_size=1, out=tmp_path
    )
    return scripted_context(settings, runner, tmp_path, progress=progress)


def _progress(config: TrialConfig, lr: LrPlan, samples: int, noise_scale: float) -> float:
    """What SGD has learnt after `samples`: each optimizer step is worth its learning rate (ramped
    up linearly over the warm-up) times B / (B + phi), so a step of a global batch B far above
    the noise scale phi is worth little more than one of phi samples."""
    batch = config.global_batch_size
    steps, warmup = samples / batch, lr.warmup_steps
    lr_steps = steps - warmup / 2 if steps >= warmup else steps**2 / (2 * warmup)
    return lr.scale * lr_steps * batch / (batch + noise_scale)


def big_batch_loses() -> ScriptedRunner:
    """Samples/s that do not grow with the batch, and exact labels (phi 8): per sample, batch 256
    learns at most half as much as batch 8, even at the linear rule's 8x lr."""

    def loss(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        return 0.3 + 2.0 * math.exp(-_progress(config, lr, samples, noise_scale=8.0) / 150.0)

    return ScriptedRunner(rate=lambda config: 2000.0, loss=loss)


def big_batch_wins() -> ScriptedRunner:
    """Steps that cost 20 ms whatever the batch, and noisy labels (phi 200): batch 256 takes as
    many steps as batch 8, each worth 15x one of batch 8's, and 8x that at the linear rule's lr."""

    def loss(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        return 0.3 + 2.0 * math.exp(-_progress(config, lr, samples, noise_scale=200.0) / 12.0)

    return ScriptedRunner(rate=lambda config: 50.0 * config.global_batch_size, loss=loss)


def _plans(runner: ScriptedRunner | None = None) -> list[RacePlan]:
    """Batch 8 (the user's), and 32x that with the user's SGD lr and with the linear rule; each
    at the samples/s `runner` measures (1,000 without one)."""
    rule = lr_rule("SGD", 8, 256)
    assert (rule.scale, rule.warmup_steps, rule.rule) == (8.0, 20, "linear")  # capped at 8

    def rate(config: TrialConfig) -> float:
        return float(runner.rate(config)) if runner is not None else 1000.0

    return [
        RacePlan("baseline", 0, SMALL, LrPlan(), rate(SMALL)),
        RacePlan("candidate", 1, BIG, LrPlan(), rate(BIG)),
        RacePlan("candidate", 1, BIG, rule, rate(BIG)),
    ]


def _race(tmp_path: Path, runner: ScriptedRunner, progress: Progress | None = None):
    """A whole race in replicates, its samples/s ratios the plans' own."""
    context = _context(tmp_path, runner, progress)
    return race_in_replicates(_study(tmp_path), context, _plans(runner), RateBook())


def _heat(plans: list[RacePlan]) -> Heat:
    return Heat(0, RACE_S, race_grid(plans, RACE_S))


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")


def _raced(runner: ScriptedRunner) -> list[tuple[TrialConfig, LrPlan]]:
    return [(o.config, o.lr) for o in runner.orders if isinstance(o, RaceOrder)]


def test_the_race_keeps_the_small_batch_where_a_big_one_loses(tmp_path):
    """Samples/s do not grow with the batch and the labels are exact (`big_batch_loses`): batch
    8 takes 32x the steps of batch 256 at the same samples/s, each worth half of one of batch
    256's, or a sixteenth at the linear rule's 8x lr."""
    runner = big_batch_loses()
    race = _race(tmp_path, runner)
    assert race.loss_kind == "held-out"
    assert race.racers[race.winner].config == SMALL, race.verdict
    assert race.verdict.kind == "kept" and race.time_to_loss is None
    assert "no other global batch" in race_verdict(race)
    # Batch 256 reached nothing in replicate 1 and yours stands: no later replicate could
    # change that (`settled_at_once`).
    assert race.replicates == 1
    # The baseline sets the target with all of its race time; a candidate stops once, at its
    # samples/s, it would take longer than the baseline took.
    baseline = race.racers[0]
    assert baseline.curve.points[-1].seconds >= RACE_S * 0.99
    for candidate in race.racers[1:3]:
        assert candidate.samples_to_target is None
        assert candidate.curve.points[-1].samples < 1.5 * baseline.samples_to_target


def test_the_race_picks_the_big_batch_and_its_lr_where_it_wins(tmp_path):
    """Each step costs the same whatever the batch and the labels are noisy (`big_batch_wins`):
    batch 256 takes as many steps, each far less noisy, and the linear rule's 8x lr pays off."""
    race = _race(tmp_path, big_batch_wins())
    winner = race.racers[race.winner]
    assert winner.config == BIG and winner.lr.rule == "linear", race.verdict
    assert race.verdict.kind == "won"
    claim = race.time_to_loss
    # the replicates after the first, which chose it (`estimate`), as many as a claim needs
    assert claim is not None and claim.low >= 1 + MARGIN and claim.replicates == MIN_REPLICATES
    assert race.replicates == MIN_REPLICATES + 1
    assert claim.low <= claim.speedup <= claim.high
    assert "sooner than yours" in race_verdict(race)


def test_a_win_too_wide_to_inform_races_more_replicates_while_they_cost_less_than_the_first(
    tmp_path,
):
    """Seeds that take batch 256 0.7x-1.5x as far per sample as the first: the three
    replicates after the first claim a win too wide to plan with; where your loss levelled off
    (later replicates share its target and are cheap), the race adds replicates, each narrowing
    it, up to six and while those added cost less than the first replicate (each racing the
    winner and yours alone); replicates that agree stop where the claim counts three (above),
    and so does a race whose baseline trains every replicate's whole race."""
    spread = (1.0, 1.5, 0.7, 1.3, 0.8, 1.1)
    runner = big_batch_wins()
    wins = runner.loss
    # your loss levels off at 2.0 early in the race: later replicates share it, and are cheap
    runner.loss = lambda config, lr, samples: max(2.0, wins(config, lr, samples))
    runner.seed = lambda config, replicate: spread[replicate] if config == BIG else 1.0
    race = _race(tmp_path, runner)
    assert race.verdict.kind == "won" and race.replicates > MIN_REPLICATES
    three = decide_race([r for r in race.racers if r.replicate <= MIN_REPLICATES], RACE_S)
    claim = race.time_to_loss
    assert claim.replicates == race.replicates - 1 and too_wide(three)
    assert three.time_to_loss.high / three.time_to_loss.low > claim.high / claim.low

    def wall(replicates: range) -> float:
        return sum(r.result.wall_s for r in race.racers if r.replicate in replicates)

    first, added = wall(range(1)), range(MIN_REPLICATES, race.replicates)
    assert wall(range(MIN_REPLICATES, race.replicates - 1)) < first  # the last was affordable
    assert race.replicates == MAX_PRECISION_REPLICATES or wall(added) >= first or not too_wide(race)
    # a replicate that only narrows the win races its claim's two, the winner and yours
    winner = race.racers[race.winner]
    narrowing = [r for r in race.racers if r.replicate > MIN_REPLICATES]
    assert narrowing and {r.entrant for r in narrowing} == {race.racers[0].entrant, winner.entrant}
    assert len({r.entrant for r in race.racers if r.replicate == MIN_REPLICATES}) == 3
    falling = big_batch_wins()  # still falling at the race's end: each baseline trains it all
    falling.seed = runner.seed
    (tmp_path / "falling").mkdir()
    dear = _race(tmp_path / "falling", falling)
    assert too_wide(dear) and dear.replicates == MIN_REPLICATES + 1  # its claim counts three


def test_where_the_first_replicate_leaves_nothing_to_decide_the_race_stops_there(tmp_path):
    """Two loader workers at your batch (2x your samples/s) compute your steps: their claim is
    their samples/s ratio alone, too wide to inform (a ratio between different numbers of
    processes drifts between tunes) and the same in every replicate, so no replicate narrows
    it. Batch 256 reaches your loss, later than they do by more than its later replicates could
    make up (`LIFT`): the first replicate settles the race."""
    runner = big_batch_wins()
    wins = runner.loss
    runner.loss = lambda config, lr, samples: max(2.0, wins(config, lr, samples))  # levels off
    loader = TrialConfig(batch_size=8, num_workers=2)
    runner.rate = lambda config: {SMALL: 1000.0, loader: 2000.0}.get(config, 2400.0)
    context = _context(tmp_path, runner)
    plans = [*_plans(runner), RacePlan("your batch", 2, loader, LrPlan(), 2000.0)]
    race = race_in_replicates(_study(tmp_path), context, plans, RateBook())
    stands = race.racers[race.winner]
    assert race.verdict.kind == "kept" and stands.steps_of_baseline, race.verdict
    assert any(r.role == "candidate" and r.samples_to_target for r in race.racers)
    assert too_wide(race) and race.replicates == 1


def test_a_close_call_no_replicate_could_settle_races_no_more_replicates(tmp_path):
    """Batch 256 learns as much per sample as yours, its seeds within 6 % of each other: at 1.12x
    your samples/s its claim is a close call at about 1.13x after two replicates, inside the
    drift between tunes around the margin, which no replicate narrows, so the race stops there.
    At 1.2x it could settle: the race adds the replicates the claim needs (three readings after
    the one that chose it) and the batch wins."""

    def race_at(rate: float, folder: Path):
        runner = big_batch_wins()
        runner.loss = lambda config, lr, samples: 0.3 + 2.0 * math.exp(-samples / 3000.0)
        runner.rate = lambda config: 1000.0 * (rate if config == BIG else 1.0)
        spread = (1.0, 1.06, 0.97, 1.08, 0.95, 1.0)
        runner.seed = lambda config, replicate: spread[replicate] if config == BIG else 1.0
        folder.mkdir()
        return _race(folder, runner)

    close = race_at(1.12, tmp_path / "close")
    claim = close.verdict.best_claim
    assert close.verdict.kind == "close-call" and claim.replicates == claim.reached == 2
    assert 1 + MARGIN < claim.speedup < (1 + MARGIN) * math.exp(_z() * RATE_DRIFT_SD)
    assert close.replicates == 2
    wins = race_at(1.2, tmp_path / "wins")
    assert wins.verdict.kind == "won" and wins.replicates == MIN_REPLICATES + 1


def test_a_batch_too_far_behind_after_one_replicate_is_no_close_call(tmp_path):
    """Your loss levels off early; batch 256 needs 1.6x your samples to it at 1.5x your
    samples/s: its one reading, about 0.94x, has no interval, so it cannot rule out a win, but
    no later replicate could lift it past the margin (`LIFT`). The race stops at one replicate
    and says yours stands, not a close call."""
    runner = big_batch_wins()

    def loss(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        return max(0.5, 0.3 + 2.0 * math.exp(-samples / (300.0 * (1.6 if config == BIG else 1))))

    runner.loss = loss
    runner.rate = lambda config: 1700.0 if config == BIG else 1000.0
    race = _race(tmp_path, runner)
    claim = race.verdict.best_claim
    assert race.replicates == 1 and claim is not None and claim.low == 0
    assert 0.85 < claim.speedup < 1.0 and claim.reached == 1
    assert race.verdict.kind == "kept" and race.racers[race.winner].role == "baseline"
    said = race_verdict(race)
    assert f"{claim.speedup:.2f}x (1 replicate: no interval) against yours" in said, said
    assert "too far below 1.05x for more replicates to lift it" in said, said


def test_every_racer_of_every_replicate_is_evaluated_on_one_grid_of_samples(tmp_path):
    """One grid for all: a coarser grid would read a later crossing for its racer. Each
    replicate trains from a seed of its own; later ones race each lr that reached the target in
    the first within WIN_SLACK of the samples the soonest took; of a batch where none did,
    none where the race cannot go on (tests/decide/test_race_went_on.py has where it can)."""
    runner = big_batch_wins()
    _race(tmp_path, runner)
    orders = [o for o in runner.orders if isinstance(o, RaceOrder)]
    assert len({o.grid for o in orders}) == 1
    first = [o for o in orders if o.replicate == 0]
    assert len(first) == 3 and all(o.target is not None for o in first[1:])  # both stop there
    later = [(o.replicate, o.config, o.lr.rule) for o in orders if o.replicate]
    # Both lrs reached it; yours took far more than WIN_SLACK times the rule's samples.
    assert later == [(r, config, rule) for r in (1, 2, 3) for config, rule in TWO]
    # Batch 256 reaches nothing (`big_batch_loses`); bf16 at your batch, which learns as yours
    # does, keeps the race going, without 256: no racer saved a state to go on from.
    slow, amp = big_batch_loses(), TrialConfig(batch_size=8, amp="bf16")
    (tmp_path / "loses").mkdir()
    plans = [*_plans(slow)[:1], RacePlan("your batch", 2, amp, LrPlan(), 2400.0), *_plans(slow)[1:]]
    context = _context(tmp_path / "loses", slow)
    race_in_replicates(_study(tmp_path / "loses"), context, plans, RateBook())
    later = [o for o in slow.orders if isinstance(o, RaceOrder) and o.replicate]
    assert [(o.config, o.lr.rule) for o in later] == [(SMALL, "yours"), (amp, "yours")] * 2
    grid = orders[0].grid
    assert all(count % 8 == 0 for count in grid)  # whole batches of the smallest
    steps = [b / a for a, b in itertools.pairwise(grid) if a >= 20 * 8]
    assert max(steps) < 1.15  # resolved to a tenth or so of the samples, wherever it falls


def test_later_replicates_race_only_what_can_still_stand_or_win(tmp_path):
    """Where another global batch won replicate 0, a racer that did not reach your loss there
    cannot stand or win over the replicates (a claim needs every replicate to reach it), and
    the race will not go on from it: bf16 at your batch that learns a third as much per sample,
    and batch 64 with an lr that barely learns, race in replicate 0 only."""
    amp, mid = TrialConfig(batch_size=8, amp="bf16"), TrialConfig(batch_size=64)
    wins = big_batch_wins()

    def loss(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        slower = {amp: 0.3, mid: 0.01}.get(config, 1.0)
        return wins.loss(config, lr, int(samples * slower))

    runner = ScriptedRunner(rate=wins.rate, loss=loss)
    plans = [
        *_plans(runner)[:1],
        RacePlan("your batch", 1, amp, LrPlan(), float(runner.rate(SMALL)) * 1.2),
        RacePlan("candidate", 2, mid, LrPlan(), float(runner.rate(mid))),
        *[replace(plan, trial=3) for plan in _plans(runner)[1:]],
    ]
    race = race_in_replicates(_study(tmp_path), _context(tmp_path, runner), plans, RateBook())
    assert race.racers[race.winner].config == BIG and race.verdict.kind == "won"
    raced = [o for o in runner.orders if isinstance(o, RaceOrder)]
    assert {(o.config, o.lr.rule) for o in raced if o.replicate} == set(TWO)
    assert race.replicates >= MIN_REPLICATES


def test_where_your_loss_levelled_off_later_replicates_share_its_target_and_stop_there(
    tmp_path,
):
    """The first replicate's baseline trains the whole race to set the target. Where it reached
    it within half the race (its loss levelled off), every later replicate is timed to that
    loss and its baseline stops there like any racer; where it was still falling at its end,
    each later baseline trains the whole race and sets its own."""

    def levels_off(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        return max(0.5, 0.3 + 2.0 * math.exp(-samples / 300))  # 0.5 from 700 samples on

    runner = ScriptedRunner(
        rate=lambda config: 2000.0 if config == SMALL else 2600.0, loss=levels_off
    )
    race = _race(tmp_path, runner)
    first, *later = [o for o in runner.orders if isinstance(o, RaceOrder) and o.config == SMALL]
    assert first.target is None and later and all(o.target == race.target_loss for o in later)
    baselines = [r for r in race.racers if r.role == "baseline"]
    assert baselines[0].curve.points[-1].seconds >= RACE_S * 0.99
    for baseline in baselines[1:]:
        assert baseline.curve.points[-1].seconds < RACE_S / 2
        assert baseline.samples_to_target is not None

    still_falling = big_batch_wins()
    (tmp_path / "falling").mkdir()
    _race(tmp_path / "falling", still_falling)
    orders = [o for o in still_falling.orders if isinstance(o, RaceOrder) and o.config == SMALL]
    assert len(orders) >= MIN_REPLICATES and all(o.target is None for o in orders)


class _SlowSecondReplicate(ScriptedRunner):
    """Your configuration's run in replicate 1 goes at three quarters of its re-runs'
    samples/s (the machine was busy meanwhile)."""

    def _race(self, order: RaceOrder):
        if order.replicate != 1 or order.config != SMALL:
            return super()._race(order)
        usual = self.rate
        self.rate = lambda config: float(usual(config)) * 3 / 4
        try:
            return super()._race(order)
        finally:
            self.rate = usual


def test_your_configuration_trains_the_same_samples_in_every_replicate_whatever_its_clock():
    """It sets the target where its curve ends: at the samples its re-runs' samples/s trains
    in the race time, so that a slow run does not set an earlier stage's loss as the target."""
    scripted = big_batch_wins()  # yours still falling at the race's end, in every replicate
    runner = _SlowSecondReplicate(rate=scripted.rate, loss=scripted.loss)
    race = _race(Path(tempfile.mkdtemp()), runner)
    baselines = [r for r in race.racers if r.role == "baseline"]
    ends = {r.curve.points[-1].samples for r in baselines}
    assert len(ends) == 1 and ends.pop() >= RACE_S * runner.rate(SMALL)
    slow = next(r for r in baselines if r.replicate == 1)
    assert RACE_S < slow.curve.points[-1].seconds <= RACE_S * 1.5
    assert len(set(replicate_targets(race.racers).values())) == 1  # one loss function alike


def test_a_racer_stops_at_two_evaluations_in_a_row_at_or_below_its_target():
    assert stop_index([3.0, 0.9, 1.1, 0.95, 0.9], 1.0) == 4  # one dip does not stop it
    assert stop_index([3.0, 1.1, 1.2], 1.0) is None
    assert stop_index([3.0, 0.9], 1.0, in_a_row=1) == 1


def test_a_baseline_that_trained_on_is_read_as_if_it_had_stopped_at_the_target():
    """Overfitting after its fall: the rise pools into a settled curve that would reach the
    target later; read as stopped where a racer timed to it stops, it reaches it where its
    fall did, as a challenger that stopped there would."""
    rising = [4.0, 2.0, 0.95, 0.9, 1.2, 1.3, 1.4]
    curve = _racer("baseline", SMALL, rising).curve
    assert samples_to_loss(curve, 1.0) == pytest.approx(8 + 8 * (2.0 - 1.0) / (2.0 - 0.95))
    assert samples_to_loss(curve.model_copy(update={"points": curve.points[:4]}), 1.0) == (
        samples_to_loss(curve, 1.0)
    )


def test_the_sample_grid_grows_geometrically_in_whole_smallest_batches():
    grid = sample_grid(32, baseline_samples=32_000, most_samples=100_000)
    assert grid[0] == 1024 and grid[-1] >= 400_000 and all(c % 32 == 0 for c in grid)
    assert 30 < sum(count <= 32_000 for count in grid) < 45  # the baseline's evaluations
    assert sample_grid(1000, 10, 10)[0] == 1000


def test_an_interrupted_race_keeps_its_finished_racers_and_resumes_after_them(tmp_path):
    progress = StopAfterFirstRacer()
    plans = _plans()
    with pytest.raises(KeyboardInterrupt):
        context = _context(tmp_path, big_batch_wins(), progress)
        race_replicate(_study(tmp_path), context, plans, _heat(plans))
    study = optuna.load_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")
    [kept] = read_racers(study)
    assert kept.config == SMALL and kept.curve is not None

    resumed = StopAfterFirstRacer()
    resumed.started.append("(already stopped once)")
    runner = big_batch_wins()
    racers = race_replicate(study, _context(tmp_path, runner, resumed), plans, _heat(plans))
    assert len(resumed.started) == 1 + 2  # only the two racers that had not finished
    assert _raced(runner) == [(p.config, p.lr) for p in plans[1:]]
    assert racers[0] == kept
    assert len(read_racers(study)) == 3


def test_a_loss_that_does_not_fall_decides_no_race_and_skips_the_other_racers(tmp_path):
    """At lr 0 the held-out loss stays where it started: time to it says nothing about a
    global batch, so only the baseline trains and the user's global batch is kept."""
    progress = StopAfterFirstRacer()
    progress.started.append("(never stop)")
    runner = ScriptedRunner(loss=lambda config, lr, samples: 2.30)  # lr 0: the weights stay
    race = _race(tmp_path, runner, progress)
    assert [r.role for r in race.racers] == ["baseline"] and len(progress.started) == 1 + 1
    assert _raced(runner) == [(SMALL, LrPlan())]
    assert not race.racers[0].curve.fell

    assert race.winner is None and race.target_loss is None
    assert race.verdict.kind == "no-fall"
    assert race_verdict(race).startswith("your loss did not fall beyond its noise")


def test_a_loss_that_rises_from_the_start_did_not_fall():
    """Overfitting from the first steps (e.g. labels it cannot learn): its lowest loss is its
    initial one, which every racer matches at once."""
    rising = [2.30, 2.32, 2.33, 2.36, 2.35, 2.41, 2.45, 2.52, 2.60, 2.67, 2.78]
    racers = [
        _racer("baseline", SMALL, rising),
        _racer("candidate", BIG, [2.30, 2.29, 2.31, 2.33, 2.34, 2.36, 2.40, 2.41, 2.45, 2.5, 2.6]),
    ]
    assert not racers[0].curve.fell

    race = decide_race(racers, 10)

    assert race.winner is None and race.target_loss is None
    assert "2.3 at the start, lowest 2.3, 2.78 after 10.0 s" in race_verdict(race)


def test_a_short_flat_curve_did_not_fall_though_one_evaluation_dipped():
    """Seven evaluations (steps of seconds): too few for the noise about the trend, but a dip
    of one evaluation within the others' wobble is not a fall, nor a racer's win."""
    flat = [2.302, 2.3015, 2.305, 2.31, 2.32, 2.33, 2.34]
    racers = [
        _racer("baseline", SMALL, flat),
        _racer("candidate", BIG, [2.302, 2.3012, 2.306, 2.31, 2.32, 2.33, 2.34]),
    ]
    assert racers[0].curve.noise == 0.0 and not racers[0].curve.fell
    assert decide_race(racers, 6).winner is None


def test_one_spike_does_not_hide_a_fall():
    falling = [1.0 - 0.39 * (1 - 0.86**i) for i in range(21)]
    falling[12] += 0.8  # one evaluation of a bad batch of held-out samples, say
    assert _racer("baseline", SMALL, falling).curve.fell


def test_a_loss_that_fell_then_rose_sets_its_lowest_as_the_target():
    """Overfitting after a fall (a small dataset): the race is timed to the lowest loss."""
    curve = _racer("baseline", SMALL, [0.64, 0.50, 0.52, 0.57, 0.61, 0.64, 0.70, 0.8]).curve
    assert curve.fell and curve.target_losses[0] == 0.50


def _racer(role: str, config: TrialConfig, losses: list[float], lr: LrPlan | None = None) -> Racer:
    """A racer evaluated every second, after 8 samples a second (its samples/s, every racer's
    alike unless `_rated` says otherwise)."""
    lr = lr or LrPlan()
    points = tuple(
        RacePoint(seconds=float(i), samples=i * 8, steps=i, loss=loss)
        for i, loss in enumerate(losses)
    )
    result = TrialResult(
        config=config, status="ok", race=RaceCurve(loss_kind="held-out", lr=lr, points=points)
    )
    return Racer(
        role=role,
        config=config,
        lr=lr,
        race_seconds=len(losses) - 1,
        samples_per_s=8.0,
        result=result,
    )


def test_samples_to_loss_interpolates_between_evaluations():
    curve = _racer("baseline", SMALL, [4.0, 2.0, 1.0]).curve
    assert samples_to_loss(curve, 3.0) == pytest.approx(4.0)
    assert samples_to_loss(curve, 1.0) == pytest.approx(16.0)
    assert samples_to_loss(curve, 0.5) is None


def test_a_chance_dip_on_a_plateau_neither_sets_the_target_nor_wins():
    """Both reach a plateau of 2.3025 after 3 evaluations and wobble about it; your lowest
    evaluation is a dip at the end, the candidate dips as low at once. On the raw curves the
    candidate would be 2.5x sooner; on the settled ones both reach the plateau together."""
    wobble = [0.0002, -0.0001, 0.0003, -0.0002, 0.0001, -0.0003, 0.0002]
    plateau = [2.3164, 2.31, 2.305] + [2.3025 + w for w in wobble]
    yours = [*plateau[:-1], 2.3020]
    dipping = [*plateau[:3], 2.3019, *plateau[4:]]
    racers = _replicates(
        ("baseline", SMALL, 100.0, [yours, yours]),
        ("candidate", BIG, 100.0, [dipping, dipping]),
    )
    race = decide_race(racers, 9)
    assert race.winner == 0 and race.verdict.kind == "kept"
    assert 2.3021 < race.target_loss < 2.3026  # on the plateau, not the dip
    claim = race.verdict.best_claim
    assert claim.high < 1.05


def test_a_falling_curve_keeps_its_targets_close():
    losses = [2.0 * 0.8**i + 0.1 for i in range(21)]  # still falling at the end, noiseless
    curve = _racer("baseline", SMALL, losses).curve
    assert max(curve.target_losses) - curve.best_loss < 0.01 * (losses[0] - losses[-1])


def test_a_curve_too_short_for_its_noise_has_its_lowest_loss_as_its_one_target():
    curve = _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0]).curve
    assert curve.noise == 0.0 and curve.target_losses == (1.0,)


def _rated(racer: Racer, rate: float, trial: int, replicate: int = 0) -> Racer:
    return racer.model_copy(update={"samples_per_s": rate, "trial": trial, "replicate": replicate})


YOURS = [4, 3, 2, 1.5, 1.2, 1.0, 1.0, 1.0]  # 1.0 after 40 samples, and settled there


def _replicates(*curves: tuple[str, TrialConfig, float, list[list[float]]]) -> list[Racer]:
    """Racers of every replicate: (role, config, samples/s, one curve per replicate)."""
    racers = []
    for trial, (role, config, rate, by_replicate) in enumerate(curves):
        for replicate, losses in enumerate(by_replicate):
            racers.append(_rated(_racer(role, config, losses), rate, trial, replicate))
    return racers


def test_a_clear_win_claims_the_samples_ratio_times_the_samples_per_s_ratio():
    """The same samples to the loss at 3x the samples/s: 3x sooner, in every replicate."""
    racers = _replicates(
        ("baseline", SMALL, 100.0, [YOURS, YOURS]),
        ("candidate", BIG, 300.0, [YOURS, YOURS]),
    )
    race = decide_race(racers, 5)
    assert race.verdict.kind == "won" and race.racers[race.winner].config == BIG
    claim = race.time_to_loss
    # Replicates that agree add no width; the samples/s ratio may drift between tunes.
    drift = _z() * RATE_DRIFT_SD
    expected = (3.0, 3.0 * math.exp(-drift), 3.0 * math.exp(drift))
    assert (claim.speedup, claim.low, claim.high) == pytest.approx(expected)
    assert claim.replicates == 2 and claim.target_loss == 1.0


def test_a_claim_counts_the_replicates_after_the_one_that_chose_its_candidate():
    """Replicate 1 chose the candidate (it raced on because it read among the soonest there):
    its lucky 5x there is a selected reading, so its claim is the later replicates' 2.5x. Your
    batch's pick was chosen by the re-runs, not the race: its claim counts every replicate."""
    lucky = [4, 1.0, 0.9, 0.8, 0.7, 0.6]  # 1.0 after 8 samples: 5x fewer than yours
    usual = [4, 3, 1.0, 0.9, 0.8, 0.7]  # 1.0 after 16 samples: 2.5x fewer
    racers = _replicates(
        ("baseline", SMALL, 100.0, [YOURS, YOURS, YOURS]),
        ("candidate", BIG, 100.0, [lucky, usual, usual]),
        ("your batch", TrialConfig(batch_size=8, amp="bf16"), 100.0, [lucky, usual, usual]),
    )
    race = decide_race(racers, 5)
    assert race.verdict.best_claim.speedup == pytest.approx(2.5)
    assert race.verdict.best_claim.replicates == 2
    assert race.verdict.kept_claim.speedup == pytest.approx((5 * 2.5 * 2.5) ** (1 / 3))
    assert race.verdict.kept_claim.replicates == 3
    two = decide_race([r for r in racers if r.replicate < 2], 5)
    assert two.verdict.best_claim.replicates == 2  # one later replicate alone has no spread


def _z() -> float:
    return NormalDist().inv_cdf((1 + COVERAGE) / 2)


def test_of_two_winning_batches_the_nearer_stands_unless_the_farther_wins_against_it():
    """Batches 64 and 256 both reach your loss 2.5x sooner in samples: at 1.04x the samples/s
    of 64, 256 is within the margin of it, and 64, fewer changes from yours, wins; at 2x,
    256 beats 64 by the margin too, and wins."""
    fast = [4, 2, 1.0, 0.9, 0.8, 0.7]
    mid = TrialConfig(batch_size=64)

    def winner(rate: float) -> TrialConfig:
        racers = _replicates(
            ("baseline", SMALL, 100.0, [YOURS, YOURS]),
            ("candidate", BIG, rate, [fast, fast]),
            ("candidate", mid, 100.0, [fast, fast]),
        )
        race = decide_race(racers, 5)
        assert race.verdict.kind == "won"
        return race.racers[race.winner].config

    assert winner(104.0) == mid
    assert winner(200.0) == BIG


def test_replicates_that_disagree_widen_the_interval_to_a_close_call():
    """One replicate 2.5x sooner in samples, the other 0.83x: the interval, where a
    re-measurement of two replicates would fall, holds a win and a loss, wider than the two,
    so the user's configuration, with fewer changes, stands, and the verdict says why."""
    fast = [4, 2, 1.0, 0.9, 0.8, 0.7]  # 1.0 after 16 samples: 2.5x fewer than yours
    slow = [4, 3.2, 2.4, 1.8, 1.4, 1.1, 1.0]  # 1.0 after 48 samples
    racers = _replicates(
        ("baseline", SMALL, 100.0, [YOURS, YOURS]),
        ("candidate", BIG, 100.0, [fast, slow]),
    )
    race = decide_race(racers, 5)
    assert race.verdict.kind == "close-call" and race.racers[race.winner].config == SMALL
    assert race.time_to_loss is None
    best = race.verdict.best_claim
    assert best.low < 40 / 48 and best.high > 2.5
    assert best.speedup == pytest.approx(math.sqrt(2.5 * 40 / 48))  # their geometric mean
    more = _replicates(("baseline", SMALL, 100.0, [YOURS]), ("candidate", BIG, 100.0, [fast]))
    agreeing = racers + [_rated(r, r.samples_per_s, r.trial, i) for i in (2, 3) for r in more]
    # counted after the first (`estimate`): slow, fast, fast narrow it
    assert decide_race(agreeing, 5).verdict.best_claim.low > best.low
    assert "a close call" in race_verdict(race) and "fewer changes" in race_verdict(race)
    assert needs_replicates(race, RateBook())  # 1.44x: replicates that agree could settle it


def test_a_close_call_inside_the_part_no_replicate_narrows_races_no_more_replicates():
    """One replicate 1.25x sooner in samples, the other 0.83x, at your samples/s: a close call
    at 1.02x. However many replicates agreed on 1.02x, the samples/s part of its interval (the
    drift between tunes) would still hold both a win by the margin and none: no replicate is
    raced for it. At 1.25x it would not."""
    sooner = [4, 3, 2, 1.5, 1.0, 0.9, 0.8, 0.7]  # 1.0 after 32 samples
    later = [4, 3, 2, 1.5, 1.2, 1.1, 1.0, 0.9]  # 1.0 after 48 samples
    racers = _replicates(
        ("baseline", SMALL, 100.0, [YOURS, YOURS]),
        ("candidate", BIG, 100.0, [sooner, later]),
    )
    race = decide_race(racers, 5)
    claim = race.verdict.best_claim
    assert race.verdict.kind == "close-call" and claim.speedup == pytest.approx(1.0206, rel=1e-3)
    assert claim.speedup * math.exp(_z() * RATE_DRIFT_SD) > 1 + MARGIN  # the drift holds a win
    assert not needs_replicates(race, RateBook())
    faster = [_rated(r, 125.0, 1, r.replicate) if r.role == "candidate" else r for r in racers]
    assert needs_replicates(decide_race(faster, 5), RateBook())


def test_a_challenger_that_never_reaches_the_target_cannot_win():
    """Never within its race, it might have been sooner had it trained on: no more than its
    samples bound it to (1.2x the samples/s), never a win; where it reached the target in one
    replicate only, the interval's low end is unknown: a close call at best."""
    never = [4, 3.5, 3, 2.8, 2.6, 2.5]
    sooner = [4, 2, 1.0, 0.9, 0.8, 0.7]
    racers = _replicates(
        ("baseline", SMALL, 100.0, [YOURS, YOURS]),
        ("candidate", BIG, 120.0, [never, never]),
    )
    race = decide_race(racers, 5)
    assert race.verdict.kind == "kept" and race.winner == 0
    best = race.verdict.best_claim
    assert best.low == 0.0 and best.high == pytest.approx(1.2 * math.exp(_z() * RATE_DRIFT_SD))
    racers[3] = _rated(_racer("candidate", BIG, sooner), 120.0, 1, 1)
    once = decide_race(racers, 5)
    assert once.verdict.kind == "close-call" and once.winner == 0


def test_an_unconfirmed_samples_per_s_ratio_widens_the_claim():
    """Paired re-run rounds of 1.5x and 3x: the samples/s interval, and so the claim's, holds
    both; the same samples to the loss make it the claim's whole width."""
    racers = _replicates(
        ("baseline", SMALL, 100.0, [YOURS, YOURS]),
        ("your batch", TrialConfig(batch_size=8, num_workers=2), 200.0, [YOURS, YOURS]),
    )
    rounds = _rounds({0: (100.0, 100.0), 1: (150.0, 300.0)})
    race = decide_race(racers, 5, RateBook(rounds))
    claim = race.verdict.kept_claim
    typical = math.sqrt(1.5 * 3.0)  # their Hodges-Lehmann estimate
    drift = _z() * PROCESS_DRIFT_SD  # 3 processes against 1: loader workers
    low = typical * math.exp(-math.hypot(math.log(typical / 1.5), drift))
    high = typical * math.exp(math.hypot(math.log(3.0 / typical), drift))
    assert claim.rounds == 2 and (claim.low, claim.high) == pytest.approx((low, high))
    assert race.racers[race.winner].role == "your batch"  # low end 1.5x: it stands
    assert race.verdict.kind == "kept" and race.time_to_loss == claim


def test_a_ratio_between_different_numbers_of_processes_may_drift_more_between_tunes():
    """Loader workers or ranks share the machine's cores differently from tune to tune: their
    samples/s ratio against one process drifts more than a batch's or a precision's does."""
    yours = TrialConfig(batch_size=32)
    assert rate_drift(yours, yours) == 0.0
    for same_processes in (TrialConfig(batch_size=512, amp="bf16"), TrialConfig(batch_size=16)):
        assert rate_drift(same_processes, yours) == RATE_DRIFT_SD
    workers = TrialConfig(batch_size=32, num_workers=2, persistent_workers=True)
    ranks = TrialConfig(parallel_mode="ddp", world_size=2, batch_size=16)
    for more_processes in (workers, ranks):
        assert rate_drift(more_processes, yours) == PROCESS_DRIFT_SD > RATE_DRIFT_SD
    assert rate_drift(ranks, TrialConfig(batch_size=32, num_workers=1)) == RATE_DRIFT_SD


def _rounds(rates: dict[int, tuple[float, ...]]) -> tuple[TrialRecord, ...]:
    """Re-runs of each trial, one per round."""
    return tuple(
        TrialRecord(
            number=number,
            role="confirm",
            round=index + 1,
            result=TrialResult(config=TrialConfig(batch_size=8), status="ok", samples_per_s=rate),
        )
        for number, by_round in rates.items()
        for index, rate in enumerate(by_round)
    )


def test_each_candidate_ships_the_lr_that_reaches_your_loss_sooner_over_the_replicates():
    """The rule's lr ends lower in replicate 0 (examples/teacher.py's case) but reaches your
    loss later in every replicate: yours ships, not the one that happened to end lower."""
    rule = LrPlan(scale=2.0, rule="sqrt")
    yours_lr = [4, 1.0, 0.9, 0.8, 0.8, 0.8]
    rule_lr = [4, 2.0, 1.5, 1.1, 0.6, 0.3]
    racers = []
    for replicate in range(3):
        racers += [
            _rated(_racer("baseline", SMALL, YOURS), 100.0, 0, replicate),
            _rated(_racer("candidate", BIG, yours_lr), 100.0, 1, replicate),
            _rated(_racer("candidate", BIG, rule_lr, rule), 100.0, 1, replicate),
        ]
    race = decide_race(racers, 5)
    assert race.verdict.kind == "won" and race.racers[race.winner].lr == LrPlan()


def test_a_faster_config_at_your_batch_that_learns_worse_gives_way_to_yours():
    """E.g. low precision that costs more in samples than it gains in speed: 1.2x the
    samples/s, 1.8x the samples."""
    worse = [4, 3.5, 3, 2.5, 2.2, 2.0, 1.8, 1.6, 1.4, 1.2, 1.0]
    racers = _replicates(
        ("baseline", SMALL, 100.0, [YOURS, YOURS]),
        ("your batch", TrialConfig(batch_size=8, amp="bf16"), 120.0, [worse, worse]),
    )
    race = decide_race(racers, 10)
    assert race.winner == 0 and race.verdict.kind == "kept"


def _record(number: int, batch: int, rate: float) -> TrialRecord:
    config = TrialConfig(batch_size=batch)
    result = TrialResult(config=config, status="ok", samples_per_s=rate)
    return TrialRecord(number=number, role="baseline" if batch == 8 else "search", result=result)


def test_the_noise_scale_chooses_which_batches_race():
    """phi = 100: batch 64 needs (100 + 64)/(100 + 8) = 1.5x the samples, so at 4x the samples/s
    it is predicted 2.6x sooner; batch 1024 at 5x the samples/s needs 10.3x the samples."""
    records = [_record(0, 8, 100.0), _record(1, 64, 400.0), _record(2, 1024, 500.0)]
    noise = NoiseScale(value=100.0, low=80.0, high=120.0, small_batch=8, big_batch=64, steps=50)
    predictions = predict_batches(noise, records, SMALL)
    by_batch = {p.global_batch: p for p in predictions}
    assert by_batch[64].predicted_speedup == pytest.approx(4 / (164 / 108))
    assert by_batch[1024].predicted_speedup == pytest.approx(5 / (1124 / 108))
    marked, finalists = race_finalists(predictions, noise, records, SMALL)
    assert [p.global_batch for p in marked if p.raced] == [64]
    assert [r.number for r in finalists] == [0, 1]


def test_when_no_batch_is_predicted_to_win_the_best_faster_one_races_anyway():
    """phi = 10 at batch 8: every larger batch is predicted slower to the loss, but phi grows
    as training goes on; the race measures the best-predicted batch with more samples/s."""
    records = [_record(0, 8, 100.0), _record(1, 64, 110.0), _record(2, 1024, 90.0)]
    noise = NoiseScale(value=10.0, low=8.0, high=12.0, small_batch=8, big_batch=64, steps=50)
    predictions = predict_batches(noise, records, SMALL)
    assert all(p.predicted_speedup < 1 for p in predictions if p.global_batch != 8)
    marked, finalists = race_finalists(predictions, noise, records, SMALL)
    assert [p.global_batch for p in marked if p.raced] == [64]  # 1024 has fewer samples/s
    assert [r.number for r in finalists] == [0, 1]


def test_the_three_best_predicted_batches_race():
    """Four batches predicted to win (phi = 1000: samples barely grow with the batch): the three
    with the most samples/s race, the fourth does not."""
    rates = {8: 100.0, 16: 190.0, 32: 350.0, 64: 600.0, 128: 900.0}
    records = [_record(n, batch, rate) for n, (batch, rate) in enumerate(rates.items())]
    noise = NoiseScale(value=1000.0, low=900.0, high=1100.0, small_batch=8, big_batch=64, steps=50)
    marked, finalists = race_finalists(
        predict_batches(noise, records, SMALL), noise, records, SMALL
    )
    assert [p.global_batch for p in marked if p.raced] == [32, 64, 128]
    assert [r.result.config.global_batch_size for r in finalists] == [8, 32, 64, 128]


def test_without_a_noise_scale_the_fastest_batches_race():
    records = [_record(0, 8, 100.0), _record(1, 64, 400.0), _record(2, 1024, 500.0)]
    predictions = predict_batches(None, records, SMALL)
    marked, _ = race_finalists(predictions, None, records, SMALL)
    assert [p.global_batch for p in marked if p.raced] == [64, 1024]
    assert isinstance(marked[0], BatchPrediction)


def test_without_a_race_a_tie_at_your_batch_goes_as_the_re_runs_broke_it():
    """--race-seconds 0: the re-runs found bf16 and the baseline within the noise and kept the
    baseline, which changes fewer knobs; the recommendation must be that one, not the higher
    median the tie-break judged to be noise."""
    baseline = _record(0, 8, 100.0)
    bf16 = TrialRecord(
        number=1,
        role="search",
        result=TrialResult(config=SMALL.model_copy(update={"amp": "bf16"}), status="ok"),
    )
    tied = Selection(
        winner=baseline,
        winner_runs=(100.0, 101.0),
        baseline_runs=(100.0, 101.0),
        confirmations=(),
        close_call=Tie(fast=1, slow=0, runs=2, gap=0.01, kept=0),
        finalists=(baseline, bf16),
        confirmed_rates={0: 100.5, 1: 102.0},
    )
    assert race_choice(tied, None, SMALL) == (baseline, LrPlan())
    ahead = replace(tied, winner=bf16, close_call=None)
    assert race_choice(ahead, None, SMALL)[0] is bf16


def _loader_and_bf16(
    workers: TrialConfig, both: TrialConfig, bf16_rates: tuple[float, float]
) -> Selection:
    """Re-runs at your batch 8: yours at 100 samples/s, `workers` (a loader change) at 150,
    `both` (it and bf16) at `bf16_rates`, each in two rounds."""
    records = [_record(0, 8, 100.0)]
    for number, config in ((1, workers), (2, both)):
        result = TrialResult(config=config, status="ok", samples_per_s=100.0)
        records.append(TrialRecord(number=number, role="search", result=result))
    rounds = _rounds({0: (100.0, 100.0), 1: (150.0, 150.0), 2: bf16_rates})
    confirmations = tuple(
        c.model_copy(update={"result": c.result.model_copy(update={"config": config})})
        for c, config in zip(rounds, [SMALL, SMALL, workers, workers, both, both], strict=True)
    )
    return Selection(
        winner=records[2], winner_runs=bf16_rates, baseline_runs=(100.0, 100.0),
        confirmations=confirmations, finalists=tuple(records),
        confirmed_rates={0: 100.0, 1: 150.0, 2: sum(bf16_rates) / 2},
    )  # fmt: skip


def test_at_each_batch_the_racer_is_the_one_with_fewer_changes_unless_clearly_faster():
    """bf16 with a loader worker re-ran 2 % faster than fp32 with one, within the noise: fp32,
    one change from yours, races for your batch; 20 % faster, bf16 does."""
    from advisor.decide.race.plan import fastest_at

    workers = TrialConfig(batch_size=8, num_workers=1)
    both = TrialConfig(batch_size=8, num_workers=1, amp="bf16")

    def chosen(bf16_rates: tuple[float, float]) -> TrialConfig:
        selection = _loader_and_bf16(workers, both, bf16_rates)
        return fastest_at(selection, SMALL)[8].result.config

    assert chosen((153.0, 153.0)) == workers
    assert chosen((180.0, 180.0)) == both


def test_a_precision_change_at_your_batch_races_beside_the_loader_change_it_must_beat():
    """bf16 with a loader worker re-ran clearly faster than fp32 with one: both race for your
    batch, fp32's read from your curve, so that bf16 must beat it and not only yours; where
    fp32 with the worker is the fastest, it races alone."""
    from advisor.decide.race.plan import plan_racers

    workers = TrialConfig(batch_size=8, num_workers=1)
    both = TrialConfig(batch_size=8, num_workers=1, amp="bf16")

    def at_your_batch(bf16_rates: tuple[float, float]) -> list[TrialConfig]:
        selection = _loader_and_bf16(workers, both, bf16_rates)
        plans = plan_racers(selection, (), SMALL, "SGD")
        return [plan.config for plan in plans if plan.role == "your batch"]

    assert at_your_batch((180.0, 180.0)) == [workers, both]
    assert at_your_batch((153.0, 153.0)) == [workers]


def test_a_precision_change_no_sooner_than_the_loader_change_leaves_the_loader_change(tmp_path):
    """At your batch bf16 with two loader workers runs 4 % faster than fp32 with them and
    learns alike: its interval against fp32's holds both a win by the margin and none, so fp32
    with the workers stands (1.5x your samples/s, clear of yours), not your configuration."""
    runner = big_batch_loses()
    loader = TrialConfig(batch_size=8, num_workers=2)
    both = TrialConfig(batch_size=8, num_workers=2, amp="bf16")
    plans = [
        RacePlan("baseline", 0, SMALL, LrPlan(), 1000.0),
        RacePlan("your batch", 2, loader, LrPlan(), 1500.0),
        RacePlan("your batch", 3, both, LrPlan(), 1560.0),
    ]
    context = _context(tmp_path, runner)
    race = race_in_replicates(_study(tmp_path), context, plans, RateBook())
    assert both in {o.config for o in runner.orders if isinstance(o, RaceOrder)}
    assert race.verdict.kind == "close-call", race.verdict
    assert race.replicates == 2  # 1.04x: no replicate could settle it
    assert race.racers[race.winner].config == loader
    assert race.racers[race.verdict.best].config == both
    assert race.time_to_loss is not None and race.time_to_loss.low >= 1 + MARGIN
    said = race_verdict(race)
    assert said.startswith("a close call: bs=8 acc=1 amp=bf16 workers=2") and said.endswith(
        "bs=8 acc=1 amp=off workers=2, your lr (global batch 8), with fewer changes from yours, "
        "stands"
    )


def test_a_loader_change_at_your_batch_is_read_from_your_curve_not_trained_again(tmp_path):
    """Loader workers change how batches arrive, not the steps: at your batch and lr the pick
    reaches every loss after your samples, so its time to your loss is your samples at its own
    samples/s (issue 50's loader-bound case: a race of its own only added noise), and where no
    other batch reached the loss, later replicates could change nothing."""
    runner = big_batch_loses()
    loader = TrialConfig(batch_size=8, num_workers=2)
    plans = [
        RacePlan("baseline", 0, SMALL, LrPlan(), 1000.0),
        RacePlan("your batch", 2, loader, LrPlan(), 1600.0),
        *_plans(runner)[1:],
    ]
    progress = StopAfterFirstRacer()
    progress.started.append("(never stop)")
    context = _context(tmp_path, runner, progress)
    race = race_in_replicates(_study(tmp_path), context, plans, RateBook())
    assert loader not in {o.config for o in runner.orders if isinstance(o, RaceOrder)}
    assert "race 2/4, your steps: read from your curve" in progress.started  # not yours again
    for replicate in range(race.replicates):
        yours, twin = (r for r in race.racers if r.replicate == replicate and r.trial in (0, 2))
        assert twin.steps_of_baseline and twin.config == loader
        assert [(p.samples, p.loss) for p in twin.curve.points] == [
            (p.samples, p.loss) for p in yours.curve.points
        ]
        assert twin.curve.points[-1].seconds == pytest.approx(yours.curve.points[-1].seconds / 1.6)
    assert race.racers[race.winner].config == loader and race.verdict.kind == "kept"
    assert race.time_to_loss is not None and race.time_to_loss.speedup == pytest.approx(1.6)
    # Batch 256 reached nothing and the pick's samples ratio is 1 in any replicate: one
    # replicate decides, and its claim has a low end (`settled_at_once`).
    assert race.replicates == 1 and race.time_to_loss.low > 1 + MARGIN


def test_of_two_learning_rates_that_never_reached_the_one_raced_in_every_replicate_is_shown():
    """Neither lr of batch 256 reached your loss; the one raced in one replicate only has a
    bound, not a measurement: the best shown is the one the later replicates raced."""
    never = [4, 3.5, 3, 2.8, 2.6, 2.5]
    rule = LrPlan(scale=2.0, rule="sqrt")
    racers = []
    for replicate in range(3):
        racers += [
            _rated(_racer("baseline", SMALL, YOURS), 100.0, 0, replicate),
            _rated(_racer("candidate", BIG, never, rule), 100.0, 1, replicate),
        ]
    racers.append(_rated(_racer("candidate", BIG, [4, 3.4, 2.9, 2.7, 2.5, 2.4]), 120.0, 1, 0))
    race = decide_race(racers, 5)
    best = race.racers[race.verdict.best]
    assert race.verdict.kind == "kept" and best.lr == rule
    assert race.verdict.best_claim.replicates == 2  # after the first, which chose it
