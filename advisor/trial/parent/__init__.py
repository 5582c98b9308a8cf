"""Parent side of a trial: start the child in its own process group (`runner`), from a
pre-imported launcher (`launcher`, `preload`, `environment`), watch it (`watch`), kill its whole
group (`group`), read its result and how busy the machine was meanwhile (`load`); and the
hardware probe run the same way (`hardware`), and the task validated before any search
(`preflight`); over several machines, node 0's store and the other machines' serving loop
(`nodes`); a helper's JSON-line answers (`lines`). No torch at module level: the launcher
process imports it, once, for the trials it forks."""
