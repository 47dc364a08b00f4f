"""Runs inside the sandbox (Pyodide) with each tool registration; never imported on the host.

Two hooks on the functions dspy's runner.js calls through ``pyodide.runPython`` / ``runPythonAsync``, which
look up ``pyodide.code.eval_code`` and ``eval_code_async`` on every call:

- ``eval_code`` (the runner's own snippets around every execute: stdout/SUBMIT setup, reading the captured
  output, restoring stdout) compiles each distinct short source once and runs the same code object again,
  which is what recompiling would produce: about 5 ms less WebAssembly CPU per execute;
- ``eval_code_async`` (the code of each execute) reports, in a ``finally``, the REPL's public non-module
  global names to the host through the tool ``report``: after success, an error or a SUBMIT alike. The
  result and the exception are untouched, and nothing is added to the REPL's namespace. Where a report does
  not arrive, the host lists the names with a separate execute.

The host appends one call: ``_rlmopt_install_hooks(globals().get(<report tool name>))`` and deletes the
function again.
"""


def _rlmopt_install_hooks(report):
    import sys

    import pyodide.code
    from _pyodide._base import CodeRunner

    code = pyodide.code
    if getattr(code.eval_code_async, "_rlmopt_hooked", False):
        code.eval_code_async.report = report  # the tool's function was defined again by this registration
        return
    original, original_async = code.eval_code, code.eval_code_async
    compiled = {}
    _id, _type, _list, _isinstance, _len, _str = id, type, list, isinstance, len, str

    def eval_code(source, globals=None, locals=None, **kwargs):
        if kwargs or not _isinstance(source, _str) or _len(source) > 20_000:
            return original(source, globals, locals, **kwargs)
        runner = compiled.get(source)
        if runner is None:
            runner = CodeRunner(source).compile()
            if _len(compiled) < 256:
                compiled[source] = runner
        return runner.run(globals, locals)

    async def eval_code_async(source, globals=None, locals=None, **kwargs):
        try:
            return await original_async(source, globals, locals, **kwargs)
        finally:
            try:
                if globals is not None:
                    modules = {_id(module) for module in _list(sys.modules.values())}
                    eval_code_async.report(names=[
                        name for name, value in _list(globals.items())
                        if not name.startswith("_") and _type(value).__name__ != "module" and _id(value) not in modules
                    ])
            except BaseException:
                pass

    eval_code.__wrapped__, eval_code_async.__wrapped__ = original, original_async
    eval_code_async._rlmopt_hooked, eval_code_async.report = True, report
    code.eval_code, code.eval_code_async = eval_code, eval_code_async
