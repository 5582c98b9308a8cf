"""The decision: from what the search measured, which configuration to recommend, and what the
evidence lets advisor claim (docs/architecture.md, "Deciding").

- `reruns`: re-measure the finalists and your configuration, interleaved, in numbered rounds;
- `claims`, `paired_ratio`: whether the paired rounds support the speed-up claimed;
- `student_t`: Student's t quantiles, for the race's prediction interval over replicates;
- `race/`: the race to your loss in replicates (plan, grid, run, estimate, verdict, extend)
  and the batch-size schedule;
- `analysis`, `bottleneck`: what the trials show about single knobs, layouts, what limits the
  winner;
- `recommendation`: the `Recommendation`, assembled from its rates and what the trials show;
- `decision`: `conclude`, and the `TuneResult`, fresh or from a stored study.
"""
