"""Request context: set once per request, read by every wrapper below it.

Serving code sets tenant, experiment unit, variant, model and prompt length
once; cache wrappers deep in the stack label their lookups from it without any
parameter plumbing. It lives in a :mod:`contextvars` variable, so it follows
asyncio tasks, and threads started with ``contextvars.copy_context().run`` or
``asyncio.to_thread``; :func:`propagate` wraps a callable for a thread pool.

Label work (tenant allow-list, interning) happens here, once per request, so a
lookup only reads three ints.

Example::

    from warmscope.collectors import request_context
    with request_context(tenant="acme", unit=session_id, experiment="warmup-2026-11",
                         variant="B", model="llama-3-8b", prompt_tokens=1800):
        answer = serve(prompt)   # wrapped caches inside pick the labels up
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar, cast

from warmscope.model import schema

__all__ = ["RequestContext", "request_context", "current_context", "propagate"]

T = TypeVar("T")


class RequestContext:
    __slots__ = (
        "tenant",
        "experiment",
        "variant",
        "model",
        "unit",
        "prompt_tokens",
        "length_bucket",
        "cid",
        "cid0",
        "tid",
        "ukey",
        "decided",
        "_agg",
    )

    def __init__(
        self,
        agg: Any,
        tenant: str | None = None,
        unit: str | None = None,
        experiment: str | None = None,
        variant: str | None = None,
        model: str | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        self._agg = agg
        self.tenant = agg.tenants.label(tenant)
        cap = agg.cap_label
        self.experiment = cap("experiment", str(experiment)) if experiment else schema.NONE
        self.variant = cap("variant", str(variant)) if variant else schema.NONE
        self.model = cap("model", str(model)) if model else schema.UNKNOWN
        self.unit = None if unit is None else str(unit)
        self.prompt_tokens = prompt_tokens
        self.length_bucket = (
            schema.length_bucket(prompt_tokens) if prompt_tokens is not None else schema.UNKNOWN
        )
        self.cid, self.cid0, self.tid = agg.intern_context(
            self.tenant, self.experiment, self.variant, self.model, self.length_bucket
        )
        # A/B unit records only when the request is in an experiment.
        self.ukey = (
            (self.experiment, self.variant, self.unit) if (self.unit and self.experiment) else None
        )
        # Whether this request's unit records are kept, and when that was decided: its later
        # records (after a flush took the earlier ones) follow the first, however many other
        # units were decided meanwhile (the aggregator's shared memory of decisions is bounded).
        self.decided: tuple[bool, float] | None = None


# The installed pipeline, as collectors.pipeline provides it (set when that
# module loads; importing any collectors module loads it first). Kept as a
# hook so this module needs no import of the pipeline.
_installed: Callable[[], Any] | None = None


def set_installed_telemetry(provider: Callable[[], Any]) -> None:
    global _installed
    _installed = provider


def _telemetry(given: Any) -> Any:
    if given is not None:
        return given
    if _installed is None:  # pragma: no cover - the package __init__ loads the pipeline
        raise RuntimeError("no warmscope pipeline: import warmscope.collectors")
    return _installed()


# True while warmscope itself talks to Redis (a flush): the auto-instrumentation does not count it.
INTERNAL: contextvars.ContextVar[bool] = contextvars.ContextVar("warmscope_internal", default=False)
_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "warmscope_request_context", default=None
)


def current_context() -> RequestContext | None:
    return _current.get()


class _Scope:
    """What :func:`request_context` returns: a context manager with the labelling in
    ``__enter__`` (a class, not a generator: this runs once per request)."""

    __slots__ = ("_args", "_tel", "_token")

    def __init__(self, tel: Any, args: tuple[Any, ...]) -> None:
        self._tel = tel
        self._args = args
        self._token: contextvars.Token[RequestContext | None] | None = None

    def __enter__(self) -> RequestContext:
        ctx = None
        try:  # labelling must never break the request it labels
            tel = _telemetry(self._tel)
            ctx = RequestContext(tel.aggregator, *self._args)
            self._token = _current.set(ctx)
        except Exception as e:
            try:
                tel = _telemetry(self._tel)
                tel.aggregator.count_error("record", "request context", e)
                ctx = tel.default_context  # unlabelled, but the block runs
            except Exception:  # pragma: no cover
                pass
        return cast(RequestContext, ctx)  # None only if even the fallback failed

    def __exit__(self, *exc: object) -> None:
        token = self._token
        if token is not None:
            self._token = None
            _current.reset(token)


def request_context(
    tenant: str | None = None,
    unit: str | None = None,
    experiment: str | None = None,
    variant: str | None = None,
    model: str | None = None,
    prompt_tokens: int | None = None,
    telemetry: Any = None,
) -> AbstractContextManager[RequestContext]:
    """Label every lookup and request record inside the block."""
    return _Scope(telemetry, (tenant, unit, experiment, variant, model, prompt_tokens))


def propagate(fn: Callable[..., T]) -> Callable[..., T]:
    """Wrap ``fn`` so it runs in a copy of the caller's context (thread pools)."""
    ctx = contextvars.copy_context()

    def run(*a: Any, **kw: Any) -> T:
        return ctx.run(fn, *a, **kw)

    return run
