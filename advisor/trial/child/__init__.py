"""Child side of a trial, run in its own process group: build the task and carry out the order
(`worker`, `measure`), report it (`outcome`), train it (`loop`, `batches`, `blocks`,
`distributed`), time it (`steps`, `warmup`, `window`, `budget`, `early_end`, `agreement`), record
memory (`memory`), race it (`racing`, `racer_state`), measure its gradient noise
(`gradient_noise`), and probe the hardware (`hardware`)."""
