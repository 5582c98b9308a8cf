"""Child side of a trial, run in its own process group: build the task and carry out the order
(`worker`, `measure`), report it (`outcome`), train it (`loop`, `batches`, `blocks`,
`distributed`), time it (`steps`, `warmup`, `window`, `budget`, `early_end`, `agreement`), record
memory (`memory`), race it (`racing`, `racer_state`), measure its gradient noise
(`gradient_noise`), probe the hardware (`hardware`); over several machines, talk to node 0's
store (`nodes`) and host it (`store_host`)."""
