"""GenAI semantic conventions (collectors/genai.py): warmscope's client writes the registry's
cached-token attributes on the current span, spans from any library are read back into hit
rates, and an openai client built after ``WarmscopeInstrumentor().instrument()`` is counted."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from warmscope.collectors import genai, request_context
from warmscope.collectors.gateway import serve
from warmscope.collectors.openai_client import InstrumentedTransport, instrument_openai
from warmscope.model import schema
from warmscope.model.schema import ATTR

from tests.helpers import total

from .llm_upstream import make_upstream

LOOKUPS = schema.CACHE_LOOKUPS.name


@pytest.fixture(scope="module")
def upstream():
    with serve(make_upstream()) as url:
        yield url


def _tokens(tel, **attrs) -> dict[str, float]:
    return {
        r: total(tel.reader, LOOKUPS, {ATTR.RESULT: r, ATTR.LAYER: "prefix_kv", **attrs})
        for r in ("hit", "miss")
    }


def test_registry_names_are_the_current_ones():
    # the attribute names as the installed semantic-conventions package spells them
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as g

    assert genai.INPUT_TOKENS == g.GEN_AI_USAGE_INPUT_TOKENS
    assert genai.CACHE_READ_TOKENS == g.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS
    assert genai.CACHE_CREATION_TOKENS == g.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS


def test_client_requests_carry_the_registry_attributes_on_the_current_span(make_tel, upstream):
    tel = make_tel()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("a-service")
    client = httpx.Client(base_url=upstream, transport=InstrumentedTransport(telemetry=tel))
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are terse. " * 40},
            {"role": "user", "content": "hi"},
        ],
    }
    for _ in range(2):  # the second request finds the prefix cached
        with tracer.start_as_current_span("chat"):
            usage = client.post("/v1/chat/completions", json=body).json()["usage"]
    first, second = (dict(s.attributes) for s in exporter.get_finished_spans())
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and first[genai.CACHE_READ_TOKENS] == 0
    assert second == {
        genai.INPUT_TOKENS: usage["prompt_tokens"],
        genai.CACHE_READ_TOKENS: cached,
        genai.RECORDED: True,
    }
    hits = _tokens(tel)
    assert hits["hit"] == cached and hits["miss"] == 2 * usage["prompt_tokens"] - cached
    # the cache-creation count where a response reports it (Anthropic-style usage)
    attrs = genai.usage_attributes(100, 64, {"cache_creation_input_tokens": 36})
    assert attrs[genai.CACHE_CREATION_TOKENS] == 36
    assert genai.CACHE_CREATION_TOKENS not in genai.usage_attributes(
        100, 64, {"prompt_tokens": 100}
    )


def test_spans_from_another_library_give_hit_rates_counted_once(make_tel, tmp_path):
    tel = make_tel()
    provider = TracerProvider()
    proc = genai.GenAIUsageSpanProcessor(tel)
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("some-other-genai-instrumentation")
    with request_context(tenant="acme"):
        with tracer.start_as_current_span("chat gpt-x") as span:  # as another library emits them
            span.set_attributes(
                {
                    "gen_ai.request.model": "gpt-x",
                    genai.INPUT_TOKENS: 1000,
                    genai.CACHE_READ_TOKENS: 750,
                }
            )
        with tracer.start_as_current_span("counted by warmscope already") as span:
            span.set_attributes(
                {genai.INPUT_TOKENS: 10, genai.CACHE_READ_TOKENS: 10, genai.RECORDED: True}
            )
        with tracer.start_as_current_span("no usage"):
            pass
    assert proc.counted == 1
    assert _tokens(tel, **{ATTR.TENANT: "acme", ATTR.MODEL: "gpt-x"}) == {"hit": 750, "miss": 250}
    tel.flush()
    lk = tel.store.frame("lookups")
    lk = lk[lk.layer == "prefix_kv"]
    by = lk.groupby("result")["count"].sum()
    assert by["hit"] / (by["hit"] + by["miss"]) == pytest.approx(0.75)


def test_openai_clients_built_after_instrument_are_counted(make_tel, upstream):
    from warmscope.collectors.autoinstrument import WarmscopeInstrumentor

    tel = make_tel()
    seen: list[str] = []
    inst = WarmscopeInstrumentor()
    inst.instrument(
        telemetry=tel,
        redis=False,
        genai_spans=False,
        request_hook=lambda span, request: seen.append(request.url.path),
        response_hook=lambda span, request, response: seen.append(str(response.status_code)),
    )
    try:
        client = openai.OpenAI(base_url=upstream + "/v1", api_key="-")
        msgs = [
            {"role": "system", "content": "You are terse. " * 40},
            {"role": "user", "content": "q"},
        ]
        with request_context(tenant="acme"):
            for _ in range(2):
                client.chat.completions.create(model="m", messages=msgs, max_tokens=1)
            # instrumented by hand as well: counted once
            instrument_openai(client, telemetry=tel).chat.completions.create(
                model="m", messages=msgs, max_tokens=1
            )
        got = _tokens(tel, **{ATTR.TENANT: "acme"})
        assert got["hit"] > 0 and got["miss"] > 0
        assert total(tel.reader, schema.REQUESTS.name, {ATTR.TENANT: "acme"}) == 3
        assert (
            seen == ["/v1/chat/completions", "200"] * 2
        )  # the hooks (the hand-made client has none)

        async def async_client() -> None:  # AsyncOpenAI the same way
            aclient = openai.AsyncOpenAI(base_url=upstream + "/v1", api_key="-")
            with request_context(tenant="globex"):
                await aclient.chat.completions.create(model="m", messages=msgs, max_tokens=1)
            await aclient.close()

        asyncio.run(async_client())
        assert total(tel.reader, schema.REQUESTS.name, {ATTR.TENANT: "globex"}) == 1
        assert _tokens(tel, **{ATTR.TENANT: "globex"})["hit"] > 0  # the prefix was cached before
    finally:
        inst.uninstrument()
    assert not hasattr(openai.OpenAI.__init__, "__wrapped__")  # restored
