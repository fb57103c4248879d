"""Prefix-cache telemetry for OpenAI-compatible inference APIs, without touching the
engine.

vLLM and SGLang return the prompt tokens they served from their prefix cache
(``usage.prompt_tokens_details.cached_tokens``; vLLM needs
``--enable-prompt-tokens-details``), and a streamed response gives the time to
the first token. :class:`LLMRecorder` turns each request into:

* a ``prefix_kv`` lookup **measured in tokens**: ``cached_tokens`` hits and
  ``prompt_tokens - cached_tokens`` misses, for the request's tenant, model,
  experiment and variant, keyed by the request's *prompt prefix* (the messages
  before the last one, else the first message, else the prompt's first
  characters);
* a request record (TTFT from the first streamed chunk — none for a request
  that is not streamed —, duration, prompt and cached tokens), and the A/B
  unit (a session) from the request context or a session header.

The prefix key, ``KIND:ROLE:TEMPLATE:0DIGEST`` (:mod:`.request`), is made of
keyed hashes of the prefix and of its template (the system prompt, or a
prompt's first block); its family ``KIND:ROLE:TEMPLATE:*`` gathers every
conversation that starts from one system prompt, and carries no prompt text.
The recorder registers this rule on its layer (before any
``family_rules``), so a warm-up run's keys get the same family. Like every
key, a prefix key leaves the process only as its keyed hash. The prefix texts
stay in process, in a bounded library that the warm-up runner
(:mod:`warmscope.collectors.warmup_runner`) reads for its ``hot`` warm set.

Labels: tenant from the request context, else the tenant header
(``x-warmscope-tenant``), else the body's ``user`` field; the A/B unit from the
context, else the session header (``x-warmscope-session``); experiment and
variant from the context, else the recorder's defaults.

Never raises into the caller. Engine errors (HTTP status >= 400), timeouts,
connection failures and cut streams count as ``error`` lookups and in
:attr:`LLMRecorder.stats`; a response without usage details is counted and
logged once with what to enable; a body that is not JSON is counted
(``bad_body``) and passed through unchanged.

The parts: :mod:`.request` reads a request (prefix, key, key family, tenant
and session headers, the prompt library file), :mod:`.stream` reads a response
(:class:`Exchange`: usage, time to first token, the usage chunk taken out of a
stream), :mod:`.recorder` records (:class:`LLMRecorder`), and
:mod:`.jsonbytes` parses JSON bytes for both sides.

httpx (the ``client`` extra) is needed only by :mod:`..openai_client`; this
package uses the standard library alone (orjson when installed), so the
gateway and the client share it.
"""

from .recorder import LLMRecorder
from .request import SESSION_HEADER, TENANT_HEADER, prefix_of, read_library, template_of
from .stream import Exchange

__all__ = [
    "LLMRecorder",
    "Exchange",
    "prefix_of",
    "template_of",
    "read_library",
    "TENANT_HEADER",
    "SESSION_HEADER",
]
