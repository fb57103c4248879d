"""GenAI semantic conventions: cached prompt tokens under the registry's names, both ways.

Written: each request :class:`~warmscope.collectors.llm.LLMRecorder` records (the OpenAI-client
transport, the gateway) also sets, on the current span when one is recording (a contrib
instrumentation's client span, or the caller's own), the registry attributes of
:data:`SPAN_ATTRS` beside warmscope's own metrics.

Read back: :class:`GenAIUsageSpanProcessor`, added to an SDK ``TracerProvider``, turns every
span that carries ``gen_ai.usage.input_tokens`` and ``gen_ai.usage.cache_read.input_tokens`` —
whatever library emitted it — into a ``prefix_kv`` lookup in tokens (cache-read tokens hit, the
rest miss) and a request record, so a team that already emits the conventions gets warmscope's
hit rates without warmscope's client. Spans warmscope recorded itself (marked
``warmscope.recorded``) are not counted twice. For teams that export the registry's token
*metrics* to Prometheus, ``rules/engines.rules.yml`` records their ratio
(``warmscope:genai_cache_read_ratio:rate5m``).

Names and status (all ``development``) from the GenAI registry, open-telemetry/
semantic-conventions-genai ``model/gen-ai/registry.yaml`` and ``token-metrics.yaml``; the same
attribute names are in opentelemetry-semantic-conventions 0.66b2 (``gen_ai_attributes``), marked
as moved to that repository.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import SpanProcessor
from warmscope.model.records import ATTR
from warmscope.model.schema import UNKNOWN

from .aggregator import LayerBinding
from .context import RequestContext
from .pipeline import Telemetry, current_telemetry

__all__ = [
    "INPUT_TOKENS",
    "CACHE_READ_TOKENS",
    "CACHE_CREATION_TOKENS",
    "SPAN_ATTRS",
    "RECORDED",
    "METRIC_INPUT_TOKENS",
    "METRIC_CACHE_READ_TOKENS",
    "METRIC_CACHE_WRITE_TOKENS",
    "usage_attributes",
    "annotate_current_span",
    "GenAIUsageSpanProcessor",
]

# Span attributes (registry.yaml). cache_read and cache_creation are subsets of input_tokens.
INPUT_TOKENS = "gen_ai.usage.input_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
SPAN_ATTRS = (INPUT_TOKENS, CACHE_READ_TOKENS, CACHE_CREATION_TOKENS)
# Counters (token-metrics.yaml); note the metric says cache_write where the attribute says
# cache_creation.
METRIC_INPUT_TOKENS = "gen_ai.client.inference.usage.input_tokens"
METRIC_CACHE_READ_TOKENS = "gen_ai.client.inference.usage.cache_read.input_tokens"
METRIC_CACHE_WRITE_TOKENS = "gen_ai.client.inference.usage.cache_write.input_tokens"
RECORDED = "warmscope.recorded"  # set beside them: this request is already in warmscope's counts
MODEL = ATTR.MODEL  # gen_ai.request.model


def usage_attributes(prompt: int, cached: int, usage: dict[Any, Any] | None) -> dict[str, Any]:
    """The registry attributes of one request's usage: input and cache-read tokens, and the
    cache-creation tokens when the response reports them (Anthropic-style
    ``cache_creation_input_tokens``; OpenAI-compatible engines do not)."""
    out: dict[str, Any] = {INPUT_TOKENS: prompt, CACHE_READ_TOKENS: cached, RECORDED: True}
    created = usage.get("cache_creation_input_tokens") if usage else None
    if isinstance(created, int) and not isinstance(created, bool) and created >= 0:
        out[CACHE_CREATION_TOKENS] = created
    return out


def annotate_current_span(attrs: dict[str, Any]) -> None:
    """Set ``attrs`` on the current span if it is recording (never raises)."""
    try:
        from opentelemetry import trace

        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(attrs)
    except Exception:  # no tracing API, or a span that refuses: the request is recorded anyway
        pass


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class GenAIUsageSpanProcessor(SpanProcessor):
    """A ``SpanProcessor`` that reads the GenAI usage attributes of ended spans back into
    warmscope's ``prefix_kv`` (or ``layer``) token counts."""

    def __init__(self, telemetry: Telemetry | None = None, layer: str = "prefix_kv") -> None:
        self._tel = telemetry
        self._layer = layer
        self._binding: LayerBinding | None = None
        self._bound: Telemetry | None = None
        self.counted = 0
        self.active = True  # False: ignore spans (the instrumentor was uninstrumented)
        self.provider: Any = None  # the tracer provider it was added to (by the instrumentor)

    def _bind(self) -> tuple[Telemetry, LayerBinding]:
        tel = self._tel or current_telemetry()
        if self._binding is None or self._bound is not tel:
            self._binding, self._bound = tel.aggregator.bind_layer(self._layer), tel
        return tel, self._binding

    def on_end(self, span: Any) -> None:
        if not self.active:
            return
        try:
            attrs = span.attributes or {}
            if attrs.get(RECORDED):
                return
            prompt, cached = _int(attrs.get(INPUT_TOKENS)), _int(attrs.get(CACHE_READ_TOKENS))
            if prompt is None or cached is None:
                return
            cached = min(cached, prompt)
            tel, b = self._bind()
            ctx = tel.context()
            model = attrs.get(MODEL)
            if model and ctx.model == UNKNOWN:  # the request context did not name the model
                ctx = RequestContext(
                    tel.aggregator,
                    ctx.tenant,
                    ctx.unit,
                    ctx.experiment,
                    ctx.variant,
                    str(model),
                    prompt,
                )
            duration = ((span.end_time or 0) - (span.start_time or 0)) / 1e9
            ttft = attrs.get("gen_ai.response.time_to_first_chunk")
            key = f"genai:{model or 'unknown'}"  # spans carry no prompt: one family per model
            tel.aggregator.record_llm(
                b,
                key,
                cached,
                prompt - cached,
                ctx,
                float(ttft) if isinstance(ttft, int | float) else None,
                max(duration, 0.0),
            )
            self.counted += 1
        except Exception as e:  # never break the host's tracing
            try:
                (self._tel or current_telemetry()).aggregator.count_error("hook", "genai span", e)
            except Exception:
                pass
