"""Runs inside the sandbox (Pyodide) with each tool registration; never imported on the host.

Two hooks on the functions dspy's runner.js calls through ``pyodide.runPython`` / ``runPythonAsync``, which
look up ``pyodide.code.eval_code`` and ``eval_code_async`` on every call:

- ``eval_code`` (the runner's own snippets around every execute: stdout/SUBMIT setup, reading the captured
  output, restoring stdout) compiles each distinct short source once and runs the same code object again,
  which is what recompiling would produce: about 5 ms less WebAssembly CPU per execute;
- ``eval_code_async`` (the code of each execute) reports, in a ``finally``, the REPL's public non-module
  global names to the host through the tool ``report``: after success, an error or a SUBMIT alike. The
  result and the exception are untouched, and nothing is added to the REPL's namespace. Where a report does
  not arrive, the host lists the names with a separate execute. An exception whose arguments JSON cannot
  carry (a JavaScript error, an object, NaN) gets them as text: dspy's runner sends them to the host as JSON
  and would otherwise die with the process (the agent would lose every variable over one uncaught error).
  Before that report, a tool whose name the code rebound (``def update_prompt(...)``, ``del compare``) is put
  back (the wrappers are kept in ``builtins._rlmopt_tools``), and so is ``SUBMIT`` (kept in
  ``builtins._rlmopt_submit``); the cell's output says so: the agent is never cut off from a tool or from ending
  the run by its own definitions. A SUBMIT whose exception the code caught (``try: SUBMIT(...) except
  BaseException: ...``) still ends the cell as a SUBMIT, whatever the code did after it. The cell's output buffers
  (dspy's ``buf_stdout`` / ``buf_stderr``) are replaced by ``io.StringIO`` subclasses that keep at most ``max_output_chars``
  UTF-8 bytes, the most the host reads back: past it, a print is only counted, and a cell that printed more fails
  with ``OutputTooLarge`` (its variables kept), where a 50 MB print used to exhaust the process's memory in copies
  and restart the REPL. A cell's last value is sent back after what the cell printed (the runner sends the value
  alone), and a tool's result (``ToolResult``, see ``tool_wrappers.py``) as its summary.

Once per process, the JavaScript side is hardened (:data:`_HARDEN_JS`): ``Deno.cwd()``, ``Deno.execPath()``,
``Deno.mainModule`` and ``Deno.args`` reveal no host path (nor do Python's ``sys.executable``, ``sys.orig_argv``
and ``os.environ``: :func:`_hide_host_paths`), ``os.system`` and ``os.kill`` raise ``OSError`` as ``subprocess``
does instead of aborting the process (:func:`_no_processes`), stack traces name files without their directory, an
uncaught error in a timer or callback does not end the process, and web storage and the Cache API are gone (Deno
keeps them on the host's disk whatever ``--deny-write`` says, unbounded by the memory cap, for every later sandbox to
read).

The host appends one call: ``_rlmopt_install_hooks(globals().get(<report tool name>), <max output chars>)`` and
deletes the function again.
"""


def _rlmopt_install_hooks(report, max_output_chars):
    import builtins
    import io
    import json
    import sys

    import js
    import pyodide.code
    from _pyodide._base import CodeRunner

    code = pyodide.code
    if getattr(code.eval_code_async, "_rlmopt_hooked", False):
        code.eval_code_async.report = report  # the tool's function was defined again by this registration
        return
    js.eval(_HARDEN_JS)
    _hide_host_paths(sys)
    _no_processes()
    original, original_async = code.eval_code, code.eval_code_async
    compiled = {}
    _id, _type, _list, _isinstance, _len, _str, _repr = id, type, list, isinstance, len, str, repr
    _dumps, _float, _dict, _tuple, _print = json.dumps, float, dict, tuple, builtins.print
    # what dspy's tool stubs and SUBMIT, and this hook, look up when they run: put back after a cell that rebound it
    kept_builtins = {name: getattr(builtins, name) for name in _KEPT_BUILTINS if hasattr(builtins, name)}
    kept_json = {name: getattr(json, name) for name in ("dumps", "loads")}
    kept_globals, runner_globals = {}, _RUNNER_GLOBALS  # the runner's own names in the REPL's globals, as first seen
    stub_builtins, _getattr, _setattr = _STUB_BUILTINS, getattr, setattr

    def plain(value, depth=0):
        """``value`` with whatever JSON cannot carry as text."""
        if value is None or _isinstance(value, (bool, int, _str)):
            return value
        if _isinstance(value, _float):
            return value if value == value and value not in (_float("inf"), _float("-inf")) else _str(value)
        if depth < 20 and _isinstance(value, (_list, _tuple)):
            return [plain(item, depth + 1) for item in value]
        if depth < 20 and _isinstance(value, _dict):
            return {_str(key): plain(item, depth + 1) for key, item in value.items()}
        try:
            return _str(value)
        except BaseException:
            return "<" + _type(value).__name__ + ">"

    builtins._rlmopt_plain = plain  # (SUBMIT's wrapper reports a submission to the host as it is sent back)
    substitutes = {}

    def carried(error):
        """``error``, or a stand-in of the same class name, whose arguments JSON can carry."""
        try:
            _dumps(error.args, allow_nan=False)
            return error
        except BaseException:
            pass
        args = _tuple(plain(_list(error.args)))
        try:
            error.args = args
            _dumps(error.args, allow_nan=False)
            return error
        except BaseException:
            pass  # e.g. a JsException, whose args cannot be replaced
        name = _type(error).__name__
        if name not in substitutes:
            base = Exception if _isinstance(error, Exception) else BaseException
            substitutes[name] = _type(name, (base,), {"__module__": _type(error).__module__})
        return substitutes[name](*[_str(arg) for arg in args])

    def eval_code(source, globals=None, locals=None, **kwargs):
        if kwargs or not _isinstance(source, _str) or _len(source) > 20_000:
            return original(source, globals, locals, **kwargs)
        runner = compiled.get(source)
        if runner is None:
            runner = CodeRunner(source).compile()
            if _len(compiled) < 256:
                compiled[source] = runner
        return runner.run(globals, locals)

    OutputTooLarge = _type("OutputTooLarge", (Exception,), {"__module__": "builtins"})  # shown by this name

    class Capped(io.StringIO):
        """The runner's output buffer, keeping at most ``max_output_chars`` (counted in UTF-8 bytes, as the host
        counts the answer): past that, what is written is only counted, so a huge print costs no copies (each would
        be tens of MB in the process's memory)."""

        written = 0

        def write(self, text):
            if not _isinstance(text, _str):
                return io.StringIO.write(self, text)  # StringIO's own error
            size = _len(text) if text.isascii() else _len(text.encode("utf-8", "surrogatepass"))
            self.written += size
            if self.written <= max_output_chars:
                return io.StringIO.write(self, text)
            if self.written - size <= max_output_chars:
                self.seek(0)
                self.truncate()
            return _len(text)

        def writelines(self, lines):
            for line in lines:
                self.write(line)

    def too_large(written):
        return OutputTooLarge(
            f"this code wrote {written / 2**20:.0f} MiB of output (all of a cell's output comes back as one "
            f"message), more than the {max_output_chars / 2**20:.0f} MiB the sandbox passes back; it was discarded "
            "and this execution counts as failed (the REPL keeps its variables). Print less (a summary, a slice) "
            "and keep large data in variables."
        )

    def sent_back(result, output):
        """A cell's last value as the runner sends it back: a tool's result as its summary (``ToolResult``), and after
        what the cell printed, which the runner drops whenever the last value is not None."""
        if result is None or output is None:
            return result
        tool_result = getattr(builtins, "ToolResult", None)
        printed = output.getvalue()
        if not printed and (tool_result is None or _type(result) is not tool_result):
            return result
        try:
            value = (
                result if _isinstance(result, _str) else _str(result) if _type(result) is tool_result else _repr(result)
            )
        except Exception:
            return result
        return printed + value

    restored = []  # put back during the cell (by a tool call), told at its end

    def put_back(globals):
        """Put back each name the runner's stubs need that the cell rebound, noting it in ``restored`` (the cell's
        end tells the agent)."""
        for name, value in _list(kept_builtins.items()):
            if _getattr(builtins, name, None) is not value:
                _setattr(builtins, name, value)
                restored.append(name)
        for name, value in _list(kept_json.items()):
            if _getattr(json, name, None) is not value:
                _setattr(json, name, value)
                restored.append("json." + name)
        for name, value in _list(kept_globals.items()):
            if globals is not None and globals.get(name) is not value:
                globals[name] = value
                restored.append(name)
        for name in stub_builtins:  # a variable named like a builtin the stubs call (dict = {...}) hides it
            if globals is not None and name in globals:
                del globals[name]
                restored.append(name)

    async def eval_code_async(source, globals=None, locals=None, **kwargs):
        builtins._rlmopt_submitted = None  # SUBMIT's wrapper notes what it raises here
        if globals is not None:
            for name in runner_globals:
                if name not in kept_globals and name in globals:
                    kept_globals[name] = globals[name]
        output = None
        if globals is not None:  # dspy's runner reads the output back as the global buf_stdout
            for name in ("stdout", "stderr"):
                if _type(getattr(sys, name)) is io.StringIO and globals.get("buf_" + name) is getattr(sys, name):
                    globals["buf_" + name] = capped = Capped()
                    setattr(sys, name, capped)
                    output = capped if name == "stdout" else output
        try:
            result = await original_async(source, globals, locals, **kwargs)
            if builtins._rlmopt_submitted is not None:  # code caught SUBMIT's exception: the cell still ends with it
                raise builtins._rlmopt_submitted
            if output is not None and output.written > max_output_chars:
                raise too_large(output.written)  # (stderr is capped too, but never sent back)
            return sent_back(result, output)
        except BaseException as error:
            submitted = builtins._rlmopt_submitted
            if submitted is not None and error is not submitted:  # the first SUBMIT ends the cell, caught or not
                raise carried(submitted) from None
            substitute = carried(error)
            if substitute is error:
                raise
            raise substitute from error
        finally:
            try:
                put_back(globals)
                changed = _list(_dict.fromkeys(restored))
                restored.clear()
                if changed:
                    _print(
                        f"\n[Notice] {', '.join(changed)}: this cell rebound what the sandbox's tools and SUBMIT "
                        "use, and the original is back now (your tools would have lost their arguments). Give your "
                        "own variables and functions other names, and leave builtins and the json module as they are."
                    )
            except BaseException:
                pass
            try:
                tools = getattr(builtins, "_rlmopt_tools", None) or {}
                rebound = sorted(
                    name for name, tool in _list(tools.items()) if globals is not None and globals.get(name) is not tool
                )
                for name in rebound:
                    globals[name] = tools[name]
                if rebound:
                    shown = ", ".join(rebound)
                    _print(
                        f"\n[Notice] {shown} {'is one of your tools' if _len(rebound) == 1 else 'are your tools'}: "
                        "this cell rebound the name, and the tool is back under it now. Give your own functions "
                        "other names."
                    )
            except BaseException:
                pass
            try:
                submit = getattr(builtins, "_rlmopt_submit", None)
                if submit is not None and globals is not None and globals.get("SUBMIT") is not submit:
                    globals["SUBMIT"] = submit
                    _print(
                        "\n[Notice] SUBMIT is reserved: it ends the run with your answer. This cell rebound the "
                        "name, and the real SUBMIT is back under it now. Give your own functions other names."
                    )
            except BaseException:
                pass
            try:
                if globals is not None:
                    modules = {_id(module) for module in _list(sys.modules.values())}
                    eval_code_async.report(
                        names=[
                            name
                            for name, value in _list(globals.items())
                            if not name.startswith("_")
                            and _type(value).__name__ != "module"
                            and _id(value) not in modules
                        ]
                    )
            except BaseException:
                pass

    builtins._rlmopt_put_back = put_back  # (a tool's wrapper calls it before the tool's stub runs)
    eval_code.__wrapped__, eval_code_async.__wrapped__ = original, original_async
    eval_code_async._rlmopt_hooked, eval_code_async.report = True, report
    code.eval_code, code.eval_code_async = eval_code, eval_code_async


_KEPT_BUILTINS = (
    "print", "isinstance", "len", "str", "repr", "dict", "list", "tuple", "type", "float", "int", "bool", "getattr",
    "setattr", "hasattr", "id", "sorted", "RuntimeError", "Exception", "BaseException",
)  # fmt: skip
_STUB_BUILTINS = ("isinstance", "dict", "RuntimeError")  # what dspy's tool stubs look up in the REPL's globals
_RUNNER_GLOBALS = ("json", "run_sync", "JsProxy")  # (the same objects at every tool registration)


def _no_processes():
    """``os.system``, ``os.kill`` and ``os.killpg`` abort Pyodide's process (the agent would lose every variable),
    where ``subprocess`` raises ``OSError``: they raise the same."""
    import os

    def refuse(*args, **kwargs):
        raise OSError("the sandbox runs no processes (emscripten does not support processes)")

    for name in ("system", "kill", "killpg"):
        if hasattr(os, name):
            setattr(os, name, refuse)


def _hide_host_paths(sys):
    """Python's own view of how the process started names the host's runner.js (Emscripten's program name: the
    ``_`` variable of the environment, ``sys.executable``, ``sys.orig_argv``, sysconfig's project base): the
    same neutral name as ``Deno.mainModule`` instead."""
    import os
    import posix

    shown = "/sandbox/main.js"
    for name in ("executable", "_base_executable"):
        if isinstance(getattr(sys, name, None), str):
            setattr(sys, name, shown)
    if getattr(sys, "orig_argv", None):
        sys.orig_argv = [shown, *sys.orig_argv[1:]]
    if "_" in os.environ:
        os.environ["_"] = shown
    if b"_" in getattr(posix, "environ", {}):
        posix.environ[b"_"] = shown.encode()
    sysconfig = sys.modules.get("sysconfig")  # imported before: its project base was read from the old name
    if sysconfig is not None:
        if hasattr(sysconfig, "_PROJECT_BASE"):
            sysconfig._PROJECT_BASE = "/sandbox"
        variables = getattr(sysconfig, "_CONFIG_VARS", None)
        if isinstance(variables, dict) and "projectbase" in variables:
            variables["projectbase"] = "/sandbox"


_HARDEN_JS = r"""(() => {
  const fix = (owner, name, descriptor) => {
    try { Object.defineProperty(owner, name, { ...descriptor, enumerable: true, configurable: false }); } catch (e) {}
  };
  fix(Deno, "cwd", { value: () => "/", writable: false });
  fix(Deno, "execPath", { value: () => "deno", writable: false });
  fix(Deno, "mainModule", { get: () => "file:///sandbox/main.js" });
  fix(Deno, "args", { value: Object.freeze([]), writable: false });
  const noDirectories = /(?:file:\/\/)?(?:\/[^\s\/():'"]*)+\/([^\s\/():'"]+)/g;
  const prepare = (error, frames) => {
    let head = "Error";
    try { head = String(error); } catch (e) {}
    return [head, ...frames.map((frame) => "    at " + String(frame).replace(noDirectories, "$1"))].join("\n");
  };
  Object.defineProperty(Error, "prepareStackTrace", { value: prepare, writable: false, configurable: false });
  globalThis.addEventListener("error", (event) => event.preventDefault());
  // Web storage and the Cache API need no write permission in Deno: they persist on the host's disk (under
  // DENO_DIR/location_data), unbounded by the memory cap, and a later sandbox would read them back.
  // A Worker has a global scope of its own, which none of this reaches (its Deno shows host paths, its Cache API
  // persists): sandboxed code needs no thread, so there is none to start.
  for (const name of ["localStorage", "sessionStorage", "caches", "indexedDB", "Worker"]) {
    try { delete globalThis[name]; } catch (e) {}
    fix(globalThis, name, { value: undefined, writable: false });
  }
})()"""
