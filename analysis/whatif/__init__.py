"""What would fix it: replay an engine's prefix cache from a recorded block trace.

* :mod:`.kernels` — the compiled loops: vLLM's block pool, LRU stack distances;
* :mod:`.replay` — :func:`replay` a trace on engines of a given capacity behind a routing
  policy;
* :mod:`.curves` — miss-ratio curves (token hit rate against capacity): LRU in one pass,
  the vLLM policy at chosen sizes, SHARDS-style sampling beyond memory;
* :mod:`.fixes` — what each fix buys (capacity, routing, salts, drift, warm-up), priced.

See docs/whatif.md.
"""
