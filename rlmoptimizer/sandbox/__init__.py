"""The optimizer agent's REPL: dspy's Deno/Pyodide ``PythonInterpreter``, made to start anywhere, bounded in
time and memory, and able to come back from a dead process.

Rooms:
    sandbox.py   :class:`Sandbox`, the REPL (dspy's CodeInterpreter protocol): tools, replay, recovery
    deno.py      the Deno command, its environment and TLS trust, versions and cache directory
    process.py   the running Deno process: bounded stderr, memory cap, CPU between cells
    protocol.py  the bounded, validated reader of Deno's stdout (untrusted: sandboxed code can write to it)
    start_failure.py  what a failed start tells the user: Deno's words, the failed download, the fix
    watchdog.py  the per-cell time limit
    check.py     ``python -m rlmoptimizer.sandbox``: prefetch Pyodide, start, isolation self-check, report
    _dspy.py     every private dspy name this wing uses, checked at import
    assets/      files the sandbox runs: the deno.land std stand-in, and the Python run inside Pyodide

May import: the standard library, dspy (private names only through ``_dspy``), ``rlmoptimizer.errors`` and
``rlmoptimizer.dspy_contract``. Nothing above it (agent, evaluation, optimizer).
"""

from rlmoptimizer.sandbox.deno import DENO_FLAGS, build_import_map, deno_environment, tls_trust
from rlmoptimizer.sandbox.sandbox import Sandbox

__all__ = ["Sandbox", "DENO_FLAGS", "build_import_map", "deno_environment", "tls_trust"]
