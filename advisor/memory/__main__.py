"""`python -m advisor.memory`: the path of mimalloc, for `LD_PRELOAD` (docs/method.md)."""

from advisor.memory._allocator import main

raise SystemExit(main())
