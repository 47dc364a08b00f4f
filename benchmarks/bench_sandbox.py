"""Sandbox costs, measured in one run: cold start, tool-call round trip, per-execute overhead, and handing
1 MB of JSON in as a ``variables=`` literal versus as a JSON string returned by a tool and read with ``json.loads``.

    PYTHONPATH=. /work/venv/bin/python benchmarks/bench_sandbox.py
"""

from __future__ import annotations

import json
import statistics
import time

from rlmoptimizer.sandbox import Sandbox

TOOL_CALLS = 2_000
EXECUTES = 50
PAYLOAD_BYTES = 1_000_000


def noop(x: int = 0) -> int:
    return x


def payload() -> list[dict]:
    """About PAYLOAD_BYTES of JSON shaped like evaluation records."""
    rows, size = [], 2
    while size < PAYLOAD_BYTES:
        row = {
            "example_id": len(rows),
            "inputs": {"question": "q" * 80},
            "score": 0.5,
            "error": None,
            "feedback": "f" * 60,
            "steps": [{"step_name": "generate.predict", "outputs": {"answer": "a" * 40}}],
        }
        rows.append(row)
        size += len(json.dumps(row)) + 2
    return rows


def main() -> None:
    data = payload()
    text = json.dumps(data)
    size_mb = len(text.encode()) / 1e6

    def fetch_payload() -> str:
        return text

    started = time.perf_counter()
    box = Sandbox(tools={"noop": noop, "fetch_payload": fetch_payload}, timeout_s=600)
    box.start()
    cold_start = time.perf_counter() - started
    try:
        box.execute("noop(x=1)")  # register the tools outside the measurement

        # Tool-call round trip, timed inside the sandbox (no per-execute overhead in it).
        inside = box.execute(
            f"import time\n_t = time.perf_counter()\nfor _i in range({TOOL_CALLS}):\n    noop(x=_i)\n"
            f"print((time.perf_counter() - _t) / {TOOL_CALLS})"
        )
        round_trip_ms = float(inside) * 1e3

        # Whole execute() from the host, including the global-names bookkeeping call after it.
        times = []
        for i in range(EXECUTES):
            t = time.perf_counter()
            box.execute(f"value = {i}")
            times.append(time.perf_counter() - t)
        execute_ms = statistics.median(times) * 1e3
        raw = []  # the same through dspy's PythonInterpreter alone: what the bookkeeping adds
        for i in range(EXECUTES):
            t = time.perf_counter()
            box._interp.execute(f"value = {i}")
            raw.append(time.perf_counter() - t)
        raw_ms = statistics.median(raw) * 1e3

        # 1 MB as a variables= literal.
        t = time.perf_counter()
        box.execute("print(len(rows))", variables={"rows": data})
        literal_s = time.perf_counter() - t

        # The same as a JSON string returned by a tool, parsed inside the sandbox.
        t = time.perf_counter()
        box.execute("import json\nloaded = json.loads(fetch_payload())\nprint(len(loaded))")
        tool_s = time.perf_counter() - t
    finally:
        box.shutdown()

    print(f"cold start (Deno + Pyodide):                  {cold_start:8.2f} s")
    print(f"tool-call round trip (mean of {TOOL_CALLS}):      {round_trip_ms:8.3f} ms")
    print(
        f"execute() of a one-liner (median of {EXECUTES}):    {execute_ms:8.2f} ms "
        f"(PythonInterpreter alone: {raw_ms:.2f} ms)"
    )
    print(f"{size_mb:.2f} MB JSON as variables= literal:         {literal_s:8.3f} s")
    print(f"{size_mb:.2f} MB JSON from a tool + json.loads:      {tool_s:8.3f} s")
    print(f"literal / tool:                               {literal_s / tool_s:8.1f} x")


if __name__ == "__main__":
    main()
