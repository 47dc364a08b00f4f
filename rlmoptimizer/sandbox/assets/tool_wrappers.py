"""Runs inside the sandbox (Pyodide) after each tool registration; never imported on the host.

dspy's tool wrappers convert a JSON result with Pyodide's ``to_py()``, which turns every JSON null into
``pyodide.ffi.jsnull`` instead of None (so ``result['error'] is None`` is False), and raise every host-side
tool error as ``RuntimeError("<HostErrorType>: <message>")``. :func:`_rlmopt_wrap_tools` wraps each
registered tool to turn nulls back into None and to raise an error the host meant for the sandboxed code
(the host class whose name the host passes as ``error_name``) as that name's class here (a ValueError,
defined in builtins so code can catch it by name) carrying the message alone; the signature shown by
help() stays the tool's. A wrapper refuses an argument JSON cannot carry (a function, an object) with an error
naming the argument, instead of the transport's raw "not JSON serializable", a float nan or inf (anywhere in
the argument) with one saying so, instead of the host's "is not valid JSON", an integer beyond 2**53 - 1 (which
the transport would round, or turn into null) with one naming it, and text holding half a character
(a lone surrogate, which no LM can receive) with one naming it, instead of a bare UnicodeEncodeError, and arguments
larger than one message to the host can carry (``max_bytes``) with one saying so, instead of a call the host never
reads, which waited for the cell's time limit. It also
removes the functions of tools no longer registered, and keeps the wrappers by name in ``builtins._rlmopt_tools``
and dspy's ``SUBMIT`` in ``builtins._rlmopt_submit`` (the runner hooks restore a tool or SUBMIT that code rebound).
``SUBMIT`` is wrapped to note the first submission it raises in ``builtins._rlmopt_submitted``: code that catches
it (``try: SUBMIT(...) except BaseException: ...``) does not keep the run from ending, and a tool called after it
raises it again, so nothing is spent after the submission.
A result that carries a ``'summary'`` (the moves') is a :class:`ToolResult`: a dict in every way, shown (printed, or
as a cell's last value) as that summary and the names of its other keys, since the whole dict runs to thousands of
characters that every later turn of the root LM would carry in its history.

The first submission is also reported to the host through the tool named ``submitted_tool``, which then refuses every
tool call after it in that execute and ends the execute with it, whatever the cell does to ``builtins``.

The host appends one call: ``_rlmopt_wrap_tools(names, removed, error_name, submitted_tool, max_bytes)``.
"""


def _rlmopt_wrap_tools(_names, _removed, _error_name, _SUBMITTED, _max_bytes=None):
    import builtins
    import functools
    import inspect
    import json

    from pyodide.ffi import jsnull

    # The tools as registered, by name: after each execute the runner hooks put back one the code rebound.
    registry = getattr(builtins, "_rlmopt_tools", None)
    if registry is None:
        registry = {}
        builtins._rlmopt_tools = registry
    for _name in _removed:
        globals().pop(_name, None)
        registry.pop(_name, None)
    # SUBMIT as dspy just defined it (with the output fields' signature), noting the first submission it raises: the
    # runner hooks put it back when code rebinds it, and end the cell with a submission that code caught.
    submit = globals().get("SUBMIT")
    if submit is not None and not getattr(submit, "_rlmopt_noted", False):

        def noted_submit(*args, _submit=submit, **kwargs):
            try:
                return _submit(*args, **kwargs)
            except TypeError as exc:  # called with other arguments than the output fields: say which it takes
                try:
                    fields = ", ".join(f"{name}=..." for name in inspect.signature(_submit).parameters)
                except (TypeError, ValueError):
                    raise exc from None
                raise error_type(f"SUBMIT(): {exc} -> call SUBMIT({fields})") from None
            except BaseException as final:
                if type(final).__name__ == "_DSPyFinalOutput" and getattr(builtins, "_rlmopt_submitted", None) is None:
                    builtins._rlmopt_submitted = final  # the first: uncaught, it would have ended the cell
                    note = registry.get(_SUBMITTED)  # and the host's record, which no cell can undo
                    if note is not None and final.args and isinstance(final.args[0], dict):
                        plain = getattr(builtins, "_rlmopt_plain", None)  # as the runner hooks send it back
                        try:
                            note(plain(final.args[0]) if plain is not None else final.args[0])
                        except Exception:
                            pass
                raise

        functools.update_wrapper(noted_submit, submit)
        noted_submit._rlmopt_noted = True
        globals()["SUBMIT"] = submit = noted_submit
    if submit is not None:
        builtins._rlmopt_submit = submit

    error_type = getattr(builtins, _error_name, None)
    if error_type is None:
        error_type = type(
            _error_name,
            (ValueError,),
            {
                "__module__": "builtins",
                "__doc__": "A tool call to correct; the message says what went wrong and what to do.",
            },
        )
        setattr(builtins, _error_name, error_type)
    prefix = _error_name + ": "

    tool_result = getattr(builtins, "ToolResult", None)
    if tool_result is None:

        class ToolResult(dict):
            """A tool's result: a dict (index it, slice its lists, ``dict(result)`` for all of it), shown as its
            summary and the names of its other keys."""

            __slots__ = ()
            __module__ = "builtins"

            def __repr__(self):
                summary = self.get("summary")
                if not isinstance(summary, str):  # (code deleted or replaced it: a plain dict again)
                    return dict.__repr__(self)
                keys = ", ".join(repr(key) for key in self if key != "summary")
                return f"{summary}\n(a dict: result[key] reads one of {keys}; print(dict(result)) shows all)"

            __str__ = __repr__

        builtins.ToolResult = tool_result = ToolResult

    def clean(value, top=False):
        if value is jsnull:
            return None
        if isinstance(value, dict):
            cleaned = {key: clean(item) for key, item in value.items()}
            return tool_result(cleaned) if top and isinstance(cleaned.get("summary"), str) else cleaned
        if isinstance(value, list):
            return [clean(item) for item in value]
        return value

    SAFE = 2**53 - 1  # (JavaScript's largest exact integer: a larger one reaches the host rounded, or as null)

    def too_big(dumped):
        """The first integer in the JSON text ``dumped`` that JavaScript cannot carry exactly (at any depth)."""
        found = []

        def number(digits):
            value = int(digits)
            if abs(value) > SAFE and not found:
                found.append(value)
            return value

        json.loads(dumped, parse_int=number)
        return found[0] if found else None

    def refuse_big(name, where, shown):
        return error_type(
            f"{name}(): argument {where!r} is or holds {shown}, beyond what a tool can take exactly (the "
            f"transport's numbers stop at 2**53 - 1 = {SAFE:,}) -> pass a smaller number"
        )

    def argument_name(tool, where):
        """A positional argument's index as the tool's parameter name (a keyword is its own name)."""
        try:
            params = list(inspect.signature(tool).parameters)
            return params[where] if isinstance(where, int) and where < len(params) else where
        except (TypeError, ValueError):
            return where

    for name in _names:
        tool = globals().get(name)
        if tool is None or getattr(tool, "_rlmopt_clean", False):
            continue

        def wrapper(*args, _tool=tool, _name=name, **kwargs):
            submitted = getattr(builtins, "_rlmopt_submitted", None)
            if submitted is not None and not _name.startswith("_"):
                raise submitted  # code caught SUBMIT's exception: nothing is spent after the submission
            # what the check below and dspy's stub use (json.dumps, run_sync), put back if the cell rebound it
            put_back = getattr(builtins, "_rlmopt_put_back", None)
            if put_back is not None:
                put_back(globals())
            carried = 0  # the bytes of the arguments the call's message carries
            for where, value in [*enumerate(args), *kwargs.items()]:
                try:
                    dumped = json.dumps(value, allow_nan=False, ensure_ascii=False)
                    carried += len(dumped.encode("utf-8"))
                    big = too_big(dumped)
                    if big is not None:
                        shown = (
                            f"the integer {big}" if big.bit_length() <= 200 else f"a {big.bit_length():,}-bit integer"
                        )
                        raise refuse_big(_name, argument_name(_tool, where), shown)
                except (TypeError, ValueError, RecursionError) as exc:
                    if isinstance(exc, error_type):
                        raise
                    where = argument_name(_tool, where)
                    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):  # (too many digits)
                        raise refuse_big(_name, where, "an integer of thousands of digits") from None
                    shown = repr(value)
                    if isinstance(exc, UnicodeEncodeError):
                        raise error_type(
                            f"{_name}(): argument {where!r} holds half a character (a lone surrogate such as "
                            f"{exc.object[exc.start : exc.end]!r}), which no LM can receive -> remove it, e.g. "
                            "text.encode('utf-8', 'replace').decode('utf-8'), or write the whole character"
                        ) from None
                    if isinstance(exc, ValueError) and "float" in str(exc):
                        raise error_type(
                            f"{_name}(): argument {where!r} is or holds a float nan or inf ({shown[:60]}), which a "
                            "tool cannot take (JSON has no NaN or infinity) -> pass a finite number, or None"
                        ) from None
                    raise error_type(
                        f"{_name}(): argument {where!r} is a {type(value).__name__} ({shown[:60]}), which a tool "
                        "cannot take -> pass text, numbers, True/False, None, lists or dicts (e.g. the instructions "
                        "as a string, or call your function first and pass what it returns)"
                    ) from None
            if _max_bytes is not None and carried > _max_bytes - 4096:  # (the message's own fields need room)
                raise error_type(
                    f"{_name}(): its arguments come to {carried / 2**20:.1f} MiB, more than the "
                    f"{_max_bytes / 2**20:.0f} MiB one tool call carries to the host -> pass less (a slice, a "
                    "summary), or split it over several calls"
                )
            try:
                result = _tool(*args, **kwargs)
            except RuntimeError as exc:
                message = str(exc.args[0]) if exc.args else ""
                if message.startswith("RuntimeError: "):  # (the host's own RuntimeError, named once, not twice)
                    raise RuntimeError(message[len("RuntimeError: ") :]) from None
                if not message.startswith(prefix):
                    raise
                raise error_type(message[len(prefix) :]) from None
            return clean(result, top=True)

        functools.update_wrapper(wrapper, tool)
        wrapper._rlmopt_clean = True
        globals()[name] = wrapper
        registry[name] = wrapper
