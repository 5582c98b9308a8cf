"""Isolated trials behind one seam. `orders` is what the search asks for (one typed order per kind
of trial) and the `TrialRunner` that carries it out; `protocol` is what crosses the process
boundary; `nodes` is what machines of a tune over several share. `parent/` starts a trial,
watches and kills its process group and reads its result; `child/` runs in that group and trains
and measures."""
