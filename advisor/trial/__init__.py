"""Isolated trials. `parent/` starts a trial, watches and kills its process group and reads its
result; `child/` runs in that group and trains and measures. `protocol` is what they exchange."""
