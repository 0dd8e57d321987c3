"""Middleware signals delivered only to the middleware that handle them.

Dramatiq's broker calls every middleware's hook for every signal, and most of those calls are the
base class's no-op: with the workers' eight middleware, the four signals of a message (before and
after it is processed, before and after its ack) make 32 calls, of which eight do something, and
the lookups were a fifth of what Dramatiq spends on a message (docs/benchmarks.md, row 12). This
mix-in keeps, per signal, the hooks the middleware define themselves, in the order Dramatiq calls
them, and calls only those, with Dramatiq's own handling of a hook that raises.
"""

from __future__ import annotations

from typing import Any

from dramatiq.middleware import Middleware, MiddlewareError


def _hooks(middleware: list[Middleware], hook_name: str) -> tuple[Any, ...]:
    """The middleware's own ``hook_name`` methods in the order Dramatiq calls them: a before-hook in
    the middleware's order, an after-hook in reverse."""
    no_op = getattr(Middleware, hook_name, None)
    hooks = tuple(getattr(m, hook_name) for m in middleware if getattr(type(m), hook_name, no_op) not in (None, no_op))
    return hooks[::-1] if hook_name.startswith("after_") else hooks


class DirectSignals:
    """A broker mix-in, first among its bases: signals go only to the middleware that handle them.

    A hook is looked up once per signal name and middleware list, on the first signal after a
    middleware is added, so a hook must be defined on the middleware's class, as Dramatiq's are.
    """

    def __init__(self, *args: Any, **options: Any) -> None:
        self._receivers: dict[str, tuple[Any, ...]] = {}
        super().__init__(*args, **options)

    def add_middleware(self, middleware: Middleware, *, before: Any = None, after: Any = None) -> None:
        super().add_middleware(middleware, before=before, after=after)  # type: ignore[misc]
        self._receivers = {}

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        self._emit("before_" + signal, args, kwargs)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        self._emit("after_" + signal, args, kwargs)

    def _emit(self, hook_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        broker: Any = self
        hooks = self._receivers.get(hook_name)
        if hooks is None:
            hooks = self._receivers[hook_name] = _hooks(broker.middleware, hook_name)
        for hook in hooks:
            try:
                hook(broker, *args, **kwargs)
            except Exception as error:
                # As Dramatiq's: a before-hook's MiddlewareError (SkipMessage) stops the message.
                if isinstance(error, MiddlewareError) and hook_name.startswith("before_"):
                    raise
                middleware = getattr(hook, "__self__", hook)
                broker.logger.critical("Unexpected failure in %s of %r.", hook_name, middleware, exc_info=True)
