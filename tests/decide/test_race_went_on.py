"""The race goes on for its finalists where it kept the user's global batch, in every replicate:
racers answered in-process (`ScriptedRunner`) save their state and go on from it; the rule for
when it goes on, and how long a racer trains, on described racers. That a real racer saves and
loads its training state is tests/trial/test_racer_state.py's."""

import math
from pathlib import Path

import optuna

from advisor.decide.race.estimate import RateBook, timed
from advisor.decide.race.extend import go_on, going_on, race_in_replicates, why_not_go_on
from advisor.decide.race.plan import RacePlan, lr_rule
from advisor.decide.race.run import WIN_SLACK, _most_samples
from advisor.decide.race.verdict import MARGIN, decide_race
from advisor.knobs import TrialConfig
from advisor.results import LrPlan, RaceCurve, RacePoint, Racer, RaceSummary, TrialResult
from advisor.search.context import SearchContext
from advisor.search.records import StudyKey, read_racers
from advisor.settings import TuneSettings
from advisor.trial.orders import RaceOrder
from tests.decide.test_race import big_batch_loses
from tests.scripted_runner import ScriptedRunner, scripted_context
from tests.search.interrupts import StopAfterFirstRacer

SMALL = TrialConfig(batch_size=8)
BIG = TrialConfig(batch_size=256)
RACE_S = 1.5


class SavingRunner(ScriptedRunner):
    """A scripted runner whose racers save their state and go on from it, as a trial child does
    (advisor.trial.child.racer_state): a first race writes a file at `RaceOrder.state`; one that
    `continues` a curve needs that file, keeps the curve's points and adds those of the order's
    evaluation grid past its last one, the loss falling on from where it stopped."""

    def _race(self, order: RaceOrder) -> TrialResult:
        if order.continues is None:
            if order.state is not None:
                Path(order.state).write_bytes(b"")
            return super()._race(order)
        assert order.state is not None and Path(order.state).exists(), "no state to go on from"
        # The whole curve from the start on the order's grid; the part past its last point is
        # the part that goes on.
        result = super()._race(order.model_copy(update={"target": None}))
        assert result.race is not None
        last = order.continues.points[-1]
        points = list(order.continues.points)
        for point in (p for p in result.race.points if p.seconds > last.seconds):
            points.append(point)
            if order.target is not None and point.loss <= order.target:
                break
        curve = result.race.model_copy(update={"points": tuple(points)})
        return result.model_copy(update={"race": curve})


def late_big_batch() -> ScriptedRunner:
    """Batch 256 learns nothing for its first 1,200 samples, then fast: at 1,000 samples/s
    each, it is behind batch 8 after the 1.5-s race and reaches batch 8's 3-s loss after 2,100
    samples (batch 8 takes 3,000)."""

    def loss(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        if config == SMALL:
            return 0.3 + 2.0 * math.exp(-samples / 1000)
        return 2.3 if samples < 1200 else 0.3 + 2.0 * math.exp(-(samples - 1200) / 300)

    return ScriptedRunner(rate=lambda config: 1000.0, loss=loss)


def _context(
    tmp_path: Path, progress: StopAfterFirstRacer, scripted: ScriptedRunner | None = None
) -> tuple[SearchContext, SavingRunner]:
    settings = TuneSettings(
        spec="train.py:task",
        race_seconds=RACE_S,
        race_continue=2.0,
        max_world_size=1,
        out=tmp_path,
    )
    scripted = scripted or late_big_batch()
    runner = SavingRunner(rate=scripted.rate, loss=scripted.loss)
    return scripted_context(settings, runner, tmp_path, progress=progress), runner


def _never_stop() -> StopAfterFirstRacer:
    progress = StopAfterFirstRacer()
    progress.started.append("(never stop)")
    return progress


def test_a_race_that_kept_your_batch_goes_on_from_where_its_finalists_stopped(tmp_path):
    """Batch 256 starts late (`late_big_batch`): the race keeps 8 after one replicate (256
    reached nothing: no later one could change that). The baseline and 256 with the lr that
    ended lower go on to twice the race time from their saved states in replicate 1; 256 can
    win there, so each later replicate races them first, then goes on too, until the claim counts
    three replicates after the one that chose it: 256 wins."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")
    progress = _never_stop()
    context, runner = _context(tmp_path, progress)
    plans = [
        RacePlan("baseline", 0, SMALL, LrPlan(), 1000.0),
        RacePlan("candidate", 1, BIG, LrPlan(), 1000.0),
        RacePlan("candidate", 1, BIG, lr_rule("SGD", 8, 256), 1000.0),
    ]
    race = race_in_replicates(study, context, plans, RateBook(), tmp_path / "states")
    assert race.racers[race.winner].config == SMALL, race.verdict
    assert race.replicates == 1 and why_not_go_on(race, 2.0) is None
    assert [r.role for r in going_on(race)] == ["baseline", "candidate"]
    started = len(progress.started)
    first_grid = runner.orders[0].grid
    runner.orders.clear()

    went = go_on(study, context, race, RateBook())

    assert (went.seconds, went.went_on_from) == (2 * RACE_S, RACE_S)
    assert went.first_race is not None and went.first_race.replicates == 4
    assert went.verdict.kind == "won" and went.racers[went.winner].config == BIG, went.verdict
    filled = [o for o in runner.orders if o.continues is None]
    assert [(o.config, o.replicate) for o in filled] == [
        (SMALL, 1), (BIG, 1), (SMALL, 2), (BIG, 2), (SMALL, 3), (BIG, 3)
    ]  # fmt: skip
    assert {o.grid for o in filled} == {first_grid} and all(o.state for o in filled)
    # Each that went on loaded the state its first race saved, and went on from its curve.
    going = [r for replicate in range(4) for r in going_on(went.first_race, replicate)]
    assert len({r.entrant for r in going[1::2]}) == 1  # the same lr in all
    gone_on = [o for o in runner.orders if o.continues is not None]
    assert [(o.config, o.lr, o.state, o.continues, o.replicate) for o in gone_on] == [
        (r.config, r.lr, r.state, r.curve, r.replicate) for r in going
    ]
    assert len({o.grid for o in gone_on}) == 1
    longer = gone_on[0].grid  # the race's grid, to the longer horizon
    assert longer[: len(first_grid)] == first_grid and len(longer) > len(first_grid)
    baseline = went.racers[0]
    first = race.racers[0].curve.points
    assert baseline.curve.points[: len(first)] == first
    assert baseline.curve.points[-1].seconds >= 2 * RACE_S * 0.99
    assert went.target_loss < race.target_loss  # the baseline's lowest over the longer run
    assert len(progress.started) <= started + 14  # the eight that went on, the six filled in
    stored = read_racers(study, StudyKey.RACERS_WENT_ON)
    assert [r.role for r in stored] == ["baseline", "candidate"] * 4

    resumed = _never_stop()  # a resumed tune finds them stored, and trains none again
    context, runner = _context(tmp_path, resumed)
    again = go_on(study, context, race, RateBook())
    assert len(resumed.started) == 1 and again.racers == went.racers
    assert runner.orders == []


def test_where_no_other_batch_reaches_your_loss_in_the_first_replicate_no_other_goes_on(
    tmp_path,
):
    """Batch 256 loses (exact labels, samples/s flat in the batch): in replicate 1 it goes on
    and still does not reach your loss, so it cannot win whatever the others show; they do not
    go on, and the race's verdict stands."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")
    context, runner = _context(tmp_path, _never_stop(), big_batch_loses())
    plans = [
        RacePlan("baseline", 0, SMALL, LrPlan(), 1000.0),
        RacePlan("candidate", 1, BIG, LrPlan(), 1000.0),
    ]
    race = race_in_replicates(study, context, plans, RateBook(), tmp_path / "states")
    assert race.verdict.kind == "kept" and why_not_go_on(race, 2.0) is None
    runner.orders.clear()

    assert go_on(study, context, race, RateBook()) == race
    assert [(o.config, o.replicate) for o in runner.orders] == [(SMALL, 0), (BIG, 0)]


def _racer(role: str, config: TrialConfig, losses: list[float], state: Path | None) -> Racer:
    points = tuple(
        RacePoint(seconds=float(i), samples=i * 8, steps=i, loss=loss)
        for i, loss in enumerate(losses)
    )
    result = TrialResult(
        config=config, status="ok", race=RaceCurve(loss_kind="held-out", points=points)
    )
    if state is not None:
        state.write_bytes(b"saved")
    return Racer(
        role=role,  # type: ignore[arg-type]
        trial={"baseline": 0}.get(role, 1),
        config=config,
        lr=LrPlan(),
        race_seconds=len(losses) - 1,
        samples_per_s=8.0,
        result=result,
        state=str(state) if state else None,
    )


def _in_replicates(*racers: Racer, count: int = 3) -> list[Racer]:
    """The racers again in each of `count` replicates, alike."""
    return [r.model_copy(update={"replicate": i}) for i in range(count) for r in racers]


def test_the_race_goes_on_only_where_it_kept_your_batch_against_another(tmp_path):
    baseline = _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0], tmp_path / "b.pt")
    slower = _racer("candidate", BIG, [4, 3.5, 3, 2.5, 2.0, 1.8], tmp_path / "c.pt")
    sooner = _racer("candidate", BIG, [4, 1.0, 0.5, 0.4, 0.3, 0.2], tmp_path / "d.pt")

    kept = decide_race([baseline, slower], 5)
    assert why_not_go_on(kept, 3.0) is None
    assert why_not_go_on(kept, 1.0) == "continue-1"
    won = decide_race(_in_replicates(baseline, sooner), 5)
    assert won.verdict.kind == "won" and why_not_go_on(won, 3.0) == "another-batch-won"
    assert why_not_go_on(decide_race([baseline], 5), 3.0) == "no-other-batch"
    Path(baseline.state or "").unlink()  # e.g. a resumed tune whose states were cleaned up
    assert why_not_go_on(kept, 3.0) == "state-not-saved"


def test_a_racer_trains_until_it_can_no_longer_win():
    """The baseline reached its loss after 40 samples at 8 samples/s (5 s): a candidate at 32
    samples/s stops once it would take `WIN_SLACK` times that, 200 samples, or `WIN_SLACK` times
    what its configuration took with another lr; the baseline, which sets the target, trains
    on."""
    baseline = _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0], None)
    candidate = RacePlan("candidate", 1, BIG, LrPlan(), 32.0)
    assert _most_samples(candidate, [baseline], 1.0, 10) == int(5 * WIN_SLACK * 32)
    assert _most_samples(candidate, [baseline], None, 10) is None  # no target yet
    yours = RacePlan("baseline", 0, SMALL, LrPlan(), 8.0)
    assert _most_samples(yours, [baseline], 1.0, 10) is None
    # The same configuration with another lr reached it after 32 samples: past `WIN_SLACK`
    # times that, this lr would neither ship nor race on. Another configuration's says nothing.
    sibling = _racer("candidate", BIG, [4, 3, 2, 1.5, 1.0], None)
    assert _most_samples(candidate, [baseline, sibling], 1.0, 10) == int(32 * WIN_SLACK)
    other = sibling.model_copy(update={"config": TrialConfig(batch_size=64)})
    assert _most_samples(candidate, [baseline, other], 1.0, 10) == int(5 * WIN_SLACK * 32)


def test_where_the_other_batch_is_no_sooner_in_the_first_replicate_no_other_goes_on(tmp_path):
    """Batch 256 starts late (`late_big_batch`) and its re-runs measured it at 0.65x your
    samples/s: it reaches your 3-s loss after 2,100 samples against your 3,000, 0.93x as soon.
    Replicate 1 chooses what goes on: only it goes on, and the race's verdict stands."""
    study, context, runner, race = _late_big_batch_raced(tmp_path, 650.0)

    assert go_on(study, context, race, RateBook()) == race  # judged as three replicates would be
    assert [(o.config, o.replicate) for o in runner.orders] == [(SMALL, 0), (BIG, 0)]
    went_on = read_racers(study, StudyKey.RACERS_WENT_ON)
    assert [r.samples_to_target is not None for r in timed(went_on)] == [True, True]


def test_of_batches_that_reached_nothing_later_replicates_race_only_the_one_that_would_go_on(
    tmp_path,
):
    """Batch 64 reaches your loss in replicate 1, a little sooner than yours; batches 256 and
    512 reach nothing. What stands is at your batch, so the race may go on, and only batch 64
    would (it is the nearest to winning): 256 and 512 cannot win at the race's end nor go on,
    and race in replicate 1 only."""
    mid, big, bigger = (TrialConfig(batch_size=size) for size in (64, 256, 512))

    def loss(config: TrialConfig, lr: LrPlan, samples: int) -> float:
        if config in (SMALL, mid):
            return 0.3 + 2.0 * math.exp(-samples / (1000 if config == SMALL else 900))
        return 2.3 - samples / (20000 if config == big else 4000)

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")
    scripted = ScriptedRunner(rate=lambda config: 1000.0, loss=loss)
    context, runner = _context(tmp_path, _never_stop(), scripted)
    plans = [
        RacePlan("baseline", 0, SMALL, LrPlan(), 1000.0),
        RacePlan("candidate", 1, mid, LrPlan(), 1000.0),
        RacePlan("candidate", 2, big, LrPlan(), 1000.0),
        RacePlan("candidate", 3, bigger, LrPlan(), 1000.0),
    ]
    race = race_in_replicates(study, context, plans, RateBook(), tmp_path / "states")
    assert race.replicates >= 2 and why_not_go_on(race, 2.0) is None
    later = {o.config for o in runner.orders if isinstance(o, RaceOrder) and o.replicate}
    assert later == {SMALL, mid}

    # Where no other batch reached it, the one that ended lowest would go on, and races on
    # (bf16 at your batch, which learns as yours does, keeps the race going).
    amp = TrialConfig(batch_size=8, amp="bf16")
    (tmp_path / "none").mkdir()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/none/study.db", study_name="race")
    context, runner = _context(tmp_path / "none", _never_stop(), scripted)
    plans = [plans[0], RacePlan("your batch", 4, amp, LrPlan(), 1500.0), *plans[2:]]
    race_in_replicates(study, context, plans, RateBook(), tmp_path / "none" / "states")
    later = {o.config for o in runner.orders if isinstance(o, RaceOrder) and o.replicate}
    assert later == {SMALL, amp, bigger}


def test_going_on_adds_replicates_only_while_they_could_change_the_verdict(tmp_path):
    """Batch 256 starts late (`late_big_batch`) and its re-runs measured it at 0.77x your
    samples/s: gone on in replicate 1 it reaches your 3-s loss 1.05x as soon as yours. It could
    still win, so replicate 2 races and goes on; it reads the same, a close call inside the
    samples/s part no replicate narrows: the race goes on in no third replicate."""
    study, context, runner, race = _late_big_batch_raced(tmp_path, 770.0)

    went = go_on(study, context, race, RateBook())
    assert went.verdict.kind == "close-call" and went.replicates == 2, went.verdict
    assert 1 < went.verdict.best_claim.speedup < 1 + 2 * MARGIN
    assert {o.replicate for o in runner.orders} == {0, 1}


def _late_big_batch_raced(
    tmp_path: Path, big_rate: float
) -> tuple[optuna.Study, SearchContext, SavingRunner, RaceSummary]:
    """`late_big_batch` raced, batch 256 at `big_rate` samples/s against your 1,000: one
    replicate (256 reached nothing), kept, and the race may go on; the runner's orders cleared."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")
    context, runner = _context(tmp_path, _never_stop())
    plans = [
        RacePlan("baseline", 0, SMALL, LrPlan(), 1000.0),
        RacePlan("candidate", 1, BIG, LrPlan(), big_rate),
    ]
    race = race_in_replicates(study, context, plans, RateBook(), tmp_path / "states")
    assert race.replicates == 1 and why_not_go_on(race, 2.0) is None
    runner.orders.clear()
    return study, context, runner, race
