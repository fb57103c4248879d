"""Simulation settings and the cost model's constants, in one frozen dataclass.

Read from the ``[simulator]`` table of the TOML file (``WARMSCOPE_CONFIG``) and
overridden by ``warmscope simulate`` options. Every constant of the cost model
is here, with its unit:

=========================  ==========  ============================================
setting                    default     meaning
=========================  ==========  ============================================
hours                      24          virtual duration
rps                        12.0        mean requests per second over the day (all tenants)
diurnal_amplitude          0.5         rate(t) = rps * (1 + a*sin(2π(h-9)/24)), peak at 15:00
bursts_per_day             4           short bursts (Poisson count), each burst_minutes long
burst_factor               2.5         rate multiplier during a burst
tenants                    8           tenant count (names are letters only)
models                     2           model count; each tenant uses one
replicas                   2           replicas per variant pool (A and B pools)
tick_s                     60          flush interval / frame resolution (virtual seconds)
block_tokens               512         prefix-KV block size in tokens
kv_capacity_tokens         400000      prefix-KV capacity per replica (LRU, tokens)
lora_slots                 4           LoRA adapters resident per replica (LRU)
embedding_capacity         20000       embedding cache entries per replica (LRU)
response_capacity          20000       response cache entries per pool (LRU, TTL)
response_ttl_s             3600        response cache TTL
weights_load_s             120         model weights load time at replica start
slots                      16          concurrent sequences per replica (continuous batching)
prefill_s_per_token        0.00004     GPU time to prefill one uncached prompt token
decode_s_per_token         0.012       wall time per output token (shared by the batch)
lora_load_s                0.4         adapter load on a LoRA miss
embed_s                    0.015       embedding computation on an embedding miss
base_ttft_s                0.03        fixed TTFT overhead
slo_ttft_s                 1.0         TTFT SLO (SLA met when TTFT <= this)
conv_base                  0.12        conversion probability at zero latency
conv_tau_s                 6.0         conversion probability *= exp(-latency / conv_tau_s)
value_per_conversion       4.0         currency units (tenant i gets value*(1+i/10))
warm_keys                  400         keys per layer a warm-up run may warm
warm_s_per_key             0.05        wall time a warm-up spends per key
warm_horizon_s             3600        predictive: how far ahead its forecast looks (s): a key is
                                       warmed for the reads it gets within this, or within the
                                       cache's residence time when shorter (an unread entry's life
                                       in the LRU, or the TTL)
warm_min_prob              0.15        predictive: warm a key (a LoRA adapter, an embedding, a
                                       response) only when the forecast gives at least this chance
                                       that it is read before the cache drops it
warm_min_prob_kv           0.6         predictive: the same for prefix-KV blocks (higher: an unread
                                       block takes LRU space from the conversations being served)
peak_warmup_at_h           8.5         a pre-peak warm-up (trigger forecast_peak); <0 disables
content_drift_h            0           trending content: every this many hours the popularity of
                                       fills and RAG chunks beyond the top 20 moves to other items
                                       (yesterday's log is a period earlier); 0 disables
restart_every_h            0           rolling restarts: each replica restarts every this many
                                       hours, staggered across a pool, at the same times in both
                                       pools (deploys, autoscaling); 0 disables
lambda_mode                slo         predictive heat decay: "slo" (λ = 1/max(slo_ms·0.1, 10)
                                       per s) or "fixed"
lambda_fixed               0.0005      λ per second when lambda_mode = "fixed"
strategy_a / strategy_b    none /      warm-up strategy of pool A (the control) / pool B
                           static_topk
strategy_c                 ""          warm-up strategy of a third pool C (a second treatment; the
                                       sessions split three ways); "" runs two pools
b_response_ttl_s,          0           pool B's response TTL / response capacity /
b_response_capacity,                   prefix-KV capacity (0 = as pool A): A/B tests
b_kv_capacity_tokens                   of TTLs and capacities
=========================  ==========  ============================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from warmscope.collectors.config import load_section, setting

__all__ = ["SimConfig", "STRATEGIES"]

STRATEGIES = ("none", "static_topk", "semantic", "predictive")


@dataclass(frozen=True)
class SimConfig:
    hours: float = setting(24.0, gt=0)
    rps: float = setting(12.0, gt=0)
    diurnal_amplitude: float = setting(0.5, ge=0, le=1)
    bursts_per_day: float = setting(4.0, ge=0)
    burst_minutes: float = setting(10.0, ge=0)
    burst_factor: float = setting(2.5, ge=0)
    tenants: int = setting(8, gt=0, le=26 * 26)  # names are one or two letters
    models: int = setting(2, gt=0)
    replicas: int = setting(2, gt=0)
    tick_s: float = setting(60.0, gt=0)
    block_tokens: int = setting(512, gt=0)
    kv_capacity_tokens: int = setting(400_000, gt=0)
    lora_slots: int = setting(4, gt=0)
    embedding_capacity: int = setting(20_000, gt=0)
    response_capacity: int = setting(20_000, gt=0)
    response_ttl_s: float = setting(3600.0, ge=0)
    weights_load_s: float = setting(120.0, ge=0)
    slots: int = setting(16, gt=0)
    prefill_s_per_token: float = setting(0.00004, ge=0)
    decode_s_per_token: float = setting(0.012, ge=0)
    lora_load_s: float = setting(0.4, ge=0)
    embed_s: float = setting(0.015, ge=0)
    base_ttft_s: float = setting(0.03, ge=0)
    slo_ttft_s: float = setting(1.0, gt=0)
    conv_base: float = setting(0.12, ge=0, le=1)
    conv_tau_s: float = setting(6.0, gt=0)
    value_per_conversion: float = setting(4.0, ge=0)
    warm_keys: int = setting(400, ge=0)
    warm_s_per_key: float = setting(0.05, ge=0)
    warm_horizon_s: float = setting(3600.0, gt=0)
    warm_min_prob: float = setting(0.15, ge=0, le=1)
    warm_min_prob_kv: float = setting(0.6, ge=0, le=1)
    peak_warmup_at_h: float = 8.5  # < 0 disables
    lambda_mode: str = setting("slo", choices=("slo", "fixed"))
    lambda_fixed: float = setting(0.0005, ge=0)
    restart_every_h: float = setting(0.0, ge=0)
    content_drift_h: float = setting(0.0, ge=0)
    strategy_a: str = setting("none", choices=STRATEGIES)
    strategy_b: str = setting("static_topk", choices=STRATEGIES)
    strategy_c: str = setting("", choices=STRATEGIES + ("",))  # "" runs two pools
    # Pool B may also differ in cache settings (0 = same as pool A).
    b_response_ttl_s: float = setting(0.0, ge=0)
    b_response_capacity: int = setting(0, ge=0)
    b_kv_capacity_tokens: int = setting(0, ge=0)
    seed: int = setting(1, ge=0)
    start: float = 1_795_824_000.0  # 2026-11-28 00:00 UTC: fixed so runs are reproducible
    experiment: str = "warmup-strategy"

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> SimConfig:
        """``[simulator]`` of the TOML file (``path`` or ``WARMSCOPE_CONFIG``) under ``overrides``
        (``None`` values are skipped, so unset command-line options keep the file's value)."""
        return load_section(cls, "simulator", path, None, overrides)

    @property
    def arms(self) -> tuple[str, ...]:
        """The variant pools: ("A", "B"), or ("A", "B", "C") with a third strategy."""
        return ("A", "B", "C") if self.strategy_c else ("A", "B")

    @property
    def strategies(self) -> dict[str, str]:
        """Warm-up strategy by variant."""
        return dict(
            zip(self.arms, (self.strategy_a, self.strategy_b, self.strategy_c), strict=False)
        )

    def for_variant(self, variant: str, name: str) -> float:
        """A cache setting as pool ``variant`` sees it."""
        if variant == "B":
            v: float = getattr(self, f"b_{name}", 0)
            if v:
                return v
        value: float = getattr(self, name)
        return value

    @property
    def heat_lambda(self) -> float:
        """Decay rate per second of the predictive strategy's heat score.

        SLO-aware (seed 1, :func:`warmscope.analysis.heat.slo_lambda`):
        λ = 1 / max(slo_ms × 0.1, 10) per second of idle time, so a 1 s SLO
        forgets a key with a 100-second time constant.
        """
        if self.lambda_mode == "fixed":
            return self.lambda_fixed
        return 1.0 / max(self.slo_ttft_s * 1000 * 0.1, 10.0)
