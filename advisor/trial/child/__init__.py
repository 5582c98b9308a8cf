"""Child side of a trial, run in its own process group: build the task (`worker`, `measure`),
train it (`loop`, `batches`, `distributed`), time it (`warmup`, `window`, `budget`, `early_end`,
`agreement`), record memory (`memory`), race it or measure its gradient noise (`racing`), and
probe the hardware (`probe`)."""
