"""Child side of a trial, run in its own process group: build the task and carry out the order
(`worker`, `measure`), report it (`outcome`), train it (`loop`, `batches`, `blocks`,
`distributed`), time it (`steps`, `warmup`, `window`, `budget`, `early_end`, `agreement`), record
memory (`memory`), race it or measure its gradient noise (`racing`, `racer_state`), and probe
the hardware (`hardware`)."""
