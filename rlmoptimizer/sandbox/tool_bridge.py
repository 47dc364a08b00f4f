"""The host tools as sandboxed code sees them: wrapped so the watchdog does not count their time, registered
in the sandbox again when they change (with the Python run inside Pyodide around them), and the internal tool
through which each execute reports the REPL's global names.

May import: the standard library, ``rlmoptimizer.errors`` and ``rlmoptimizer.sandbox.deno``, ``.process`` and
``.watchdog``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
from collections.abc import Callable
from typing import Any

from rlmoptimizer.errors import AgentToolError, SandboxError
from rlmoptimizer.sandbox import deno
from rlmoptimizer.sandbox.process import DenoInterpreter
from rlmoptimizer.sandbox.protocol import MAX_LINE_BYTES
from rlmoptimizer.sandbox.watchdog import Watchdog

# A cheap expression listing the REPL's global names that are not private and not modules (``js`` is a
# JsProxy, hence the sys.modules check). It defines nothing and works even if the agent shadowed print.
GLOBAL_NAMES_EXPR = (
    "(lambda _modules: __import__('json').dumps([_n for _n, _v in globals().items() "
    "if not _n.startswith('_') and type(_v).__name__ != 'module' and id(_v) not in _modules]))"
    "({id(_m) for _m in __import__('sys').modules.values()})"
)

# Sandbox-side code run with each tool registration (see the docstrings of the asset files): the tools'
# wrappers, then the runner hooks. The host appends the one call each file's docstring names.
_TOOL_WRAPPERS = (deno.ASSETS_DIR / "tool_wrappers.py").read_text(encoding="utf-8")
_RUNNER_HOOKS = (deno.ASSETS_DIR / "runner_hooks.py").read_text(encoding="utf-8")

# The internal host tool through which each execute reports the REPL's global names as it ends (private, so
# never listed itself, and not in ``Sandbox.tools``): one tool round trip (~0.5 ms) instead of a second
# execute listing them (dspy's runner sets up every execute: ~5 ms).
NAMES_TOOL = "_rlmopt_names"
# The internal host tool through which SUBMIT's wrapper reports the first submission of an execute as it raises it:
# the host then refuses every tool call after it in that execute and ends it with that submission, whatever the
# cell did to the sandbox's own record (a builtin it can write) or however it reached a tool (``__wrapped__``).
SUBMITTED_TOOL = "_rlmopt_submitted"


def registration_code(names: list[str], removed: list[str]) -> str:
    """What runs in the sandbox after dspy registered the tools ``names`` (``removed`` are gone since)."""
    wrap = (
        f"_rlmopt_wrap_tools({json.dumps(names)}, {json.dumps(removed)}, {json.dumps(AgentToolError.__name__)}, "
        f"{json.dumps(SUBMITTED_TOOL)}, {MAX_LINE_BYTES})"
    )
    hooks = f"_rlmopt_install_hooks(globals().get({json.dumps(NAMES_TOOL)}), {MAX_LINE_BYTES})"
    return "\n".join(
        [
            _TOOL_WRAPPERS,
            wrap,
            "del _rlmopt_wrap_tools",
            _RUNNER_HOOKS,
            hooks,
            "del _rlmopt_install_hooks, _hide_host_paths, _no_processes, _HARDEN_JS",
            "del _KEPT_BUILTINS, _RUNNER_GLOBALS, _STUB_BUILTINS",
        ]
    )


class ToolBridge:
    """The tool registration state of one sandbox: the wrapped tools, what the running process has
    registered, and the global names the running execute reported through :data:`NAMES_TOOL`.

    ``watchdog`` returns the sandbox's current watchdog; a tool call pauses it while the tool runs."""

    def __init__(
        self, watchdog: Callable[[], Watchdog | None], cpu_clock: Callable[[], Callable[[], float | None] | None]
    ) -> None:
        """``watchdog``: the session's current watchdog; ``cpu_clock()``: the current process's CPU clock (None
        when it cannot be read), which counts toward the cell's time limit while a tool call runs."""
        self._watchdog = watchdog
        self._cpu_clock = cpu_clock
        self.registration_key: str | None = None
        self.registered_tools: set[str] = set()  # tool functions defined in the current process
        self.wrapped: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        self.reported_names: set[str] | None = None  # what the running execute reported (NAMES_TOOL)
        self.submission: dict | None = None  # the running execute's first submission (SUBMITTED_TOOL)

    def reset(self) -> None:
        """A new process: nothing is registered in it yet."""
        self.registration_key, self.registered_tools = None, set()

    def sync(
        self, interp: DenoInterpreter, tools: dict[str, Callable[..., Any]], output_fields: list[dict] | None
    ) -> bool:
        """Hand ``tools`` (wrapped to pause the watchdog) and ``output_fields`` to the interpreter;
        re-register them in the sandbox when their names, signatures or the outputs changed (True then)."""
        wrapped = {}
        for name, fn in tools.items():
            if not (isinstance(name, str) and name.isidentifier()):
                raise SandboxError(f"Tool names must be Python identifiers, got {name!r}")
            cached = self.wrapped.get(name)
            if cached is None or cached[0] is not fn:
                cached = (fn, self.pausing(fn))
                self.wrapped[name] = cached
            wrapped[name] = cached[1]
        wrapped[NAMES_TOOL] = self.receive_names
        wrapped[SUBMITTED_TOOL] = self.receive_submission
        interp.tools = wrapped
        interp.output_fields = output_fields
        key = json.dumps(
            [[name, interp._extract_parameters(fn)] for name, fn in wrapped.items()] + [output_fields],
            default=repr,
            sort_keys=True,
        )
        if key != self.registration_key or not interp._tools_registered:
            interp._tools_registered = False
            self.registration_key = key
        return not interp._tools_registered and bool(wrapped or self.registered_tools)

    def register(self, interp: DenoInterpreter) -> None:
        """Register the interpreter's tools (dspy's execute does), then wrap them and install the runner hooks."""
        removed = sorted(self.registered_tools - set(interp.tools))
        interp.execute(registration_code(sorted(interp.tools), removed))
        self.registered_tools = set(interp.tools)

    def receive_names(self, names: list) -> None:
        """NAMES_TOOL: each execute reports the REPL's global names through it as it ends."""
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            self.reported_names = set(names)

    def receive_submission(self, outputs: dict) -> None:
        """SUBMITTED_TOOL: SUBMIT's wrapper reports what it raises; the first of an execute is kept."""
        if self.submission is None and isinstance(outputs, dict):
            self.submission = outputs

    def pausing(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with the watchdog paused while it runs (awaiting it too if it is async): the cell's time limit
        counts only the CPU the process uses meanwhile (a Worker, a timer, the cell's other tasks), not the wait."""

        check = _argument_checker(fn)

        @functools.wraps(fn)
        def tool(**kwargs: Any) -> Any:
            if self.submission is not None:
                raise AgentToolError("SUBMIT was called earlier in this cell: nothing runs after a submission")
            kwargs = check(kwargs)
            watchdog = self._watchdog()
            watchdog.pause(self._cpu_clock())
            try:
                result = fn(**kwargs)
                return run_awaitable(result) if inspect.isawaitable(result) else result
            finally:
                watchdog.resume()

        try:
            tool.__signature__ = inspect.signature(fn)
        except (TypeError, ValueError):
            pass  # no introspectable signature: registered as taking no named parameters
        return tool


def _argument_checker(fn: Callable[..., Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A check of a tool call's arguments against the tool's type hints: the arguments as the hints take them
    (``"10"`` or ``10.0`` for an ``int`` is 10, but ``True`` is not 1: a bool is taken only where the hint takes
    bools), or :class:`AgentToolError` naming the argument, the type it got and the type it takes. Arguments without
    a hint, or hinted ``Any``, are the tool's to check."""
    import typing

    target = inspect.unwrap(fn)
    try:
        parameters = inspect.signature(fn).parameters
        hints = typing.get_type_hints(target)
    except Exception:  # no introspectable signature or hints: dspy's own check is all there is
        return lambda kwargs: kwargs
    name = getattr(target, "__name__", "the tool")
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    adapters: dict[str, Any] = {}

    def adapter(argument: str) -> Any:
        if argument not in adapters:
            from pydantic import TypeAdapter

            hint = hints.get(argument)
            adapters[argument] = None if hint is None or hint is Any else (TypeAdapter(hint), hint)
        return adapters[argument]

    def check(kwargs: dict[str, Any]) -> dict[str, Any]:
        checked = dict(kwargs)
        for argument, value in kwargs.items():
            if argument not in parameters:
                if takes_any:
                    continue
                raise AgentToolError(
                    f"{name}() has no argument {argument!r:.80} -> use its arguments: {list(parameters)}"
                )
            checker = adapter(argument)
            if checker is None:
                continue
            from pydantic import ValidationError

            try:
                # True is not 1: a bool reaches only an argument that takes one (the moves refuse bools for counts).
                checked[argument] = checker[0].validate_python(value, strict=isinstance(value, bool) or None)
            except ValidationError:
                hint = checker[1]
                plain = isinstance(hint, type) and not typing.get_args(hint)  # list[str] says what its items are
                wanted = hint.__name__ if plain else str(hint).replace("typing.", "")
                raise AgentToolError(
                    f"{name}(): argument {argument!r} takes {wanted}, got {type(value).__name__} {value!r:.80}"
                    f" -> pass {argument}= a value of type {wanted}"
                ) from None
        return checked

    return check


def run_awaitable(awaitable: Any) -> Any:
    """Await an async tool's result from sync code, on a helper thread if this one runs an event loop."""

    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()
