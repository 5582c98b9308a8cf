"""Parent side of a trial: start the child in its own process group (`runner`), from a
pre-imported launcher (`launcher`, `preload`), watch it, kill its whole group, read its result;
and the hardware probe run the same way (`probe`). No torch at module level: the launcher
process imports it, once, for the trials it forks."""
