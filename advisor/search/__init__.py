"""The search and the decision: which configurations to measure, and which one wins.

- `space`: the searchable domains on this machine, the fixed knobs and the baseline;
- `study`: the Optuna study that proposes and measures configurations;
- `seeding`, `siblings`, `dominance`, `pruning`: what the search proposes, derives, rejects
  and stops early;
- `storage`: opening the Optuna storage a study lives in;
- `records`: what advisor stores in a study, and reading it back;
- `selection`: re-measuring the finalists;
- `race/`: the noise scale and the race to the user's loss (plan, run, verdict);
- `analysis`: what the trials show about single knobs, layouts and the bottleneck;
- `decision`: the recommendation and the `TuneResult`, fresh or from a stored study;
- `checks`: preflight of the task, memory headroom, numerics of knobs that change the maths;
- `context`: what these share while a tune runs.
"""
