"""What the warm-up advisor's tuning can maximise: one list for :mod:`analysis.advisor` and the
``warmscope advise --objective`` choices (a light module: the command line reads it when it builds
its parser, before any analysis is loaded)."""

from __future__ import annotations

__all__ = ["OBJECTIVES"]

# value: GPU-s and TTFT saved, TTFT priced by the conversion response to latency; slo: TTFT priced
# by the SLO penalty; net_gpu_s: GPU-s saved minus warm-up GPU-s; roi: (saved − cost) / cost.
OBJECTIVES = ("value", "slo", "net_gpu_s", "roi")
