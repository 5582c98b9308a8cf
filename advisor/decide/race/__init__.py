"""The race that decides a time-to-loss recommendation (docs/method.md, "The race
and its verdict").

- `plan`: each racer's role and learning rate, for the batches the noise scale sends to race;
- `grid`: the sample counts every racer of a race is evaluated at;
- `run`: one replicate of the race, each racer in a fresh trial, stopped once it cannot win;
- `estimate`: samples to the loss from the race, samples/s from the re-runs: the claim and its
  interval;
- `verdict`: won, kept or a close call, by the intervals;
- `extend`: the race in replicates, and its finalists going on to a longer horizon;
- `schedule`, `schedule_verdict`: `--schedule auto`: phi along a long run, stages by goodput,
  the schedule race and its verdict.
"""
