"""The search: which configurations to measure, measured through the trial runner
(docs/architecture.md, "Searching"). It proposes and measures; `advisor.decide` decides.

- `space`, `machine`: the searchable domains on this machine, the fixed knobs and the baseline;
  the device and the facts the knob rules read;
- `study`: the Optuna study that proposes and measures configurations;
- `proposals`, `staging`, `seeding`: what advisor queues before the sampler's proposals;
- `siblings`, `dominance`, `pruning`: what the search derives, rejects and stops early;
- `ranking`, `noise`: what the search ranks by, and the noise trial it is measured from;
- `storage`: opening the Optuna storage a study lives in;
- `records`: what advisor stores in a study, and reading it back;
- `checks`, `memory`: memory headroom and budget, numerics of knobs that change the maths;
- `context`: what the search and the decision share while a tune runs (the runner among it).
"""
