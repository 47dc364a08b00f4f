"""Code in the REPL is written by an LM: whatever comes out of it is untrusted. These tests run hostile code in a
real Deno/Pyodide sandbox and check, on the host, that it cannot crash the host, grow its memory, hold more
memory than the limit, keep a core busy after its cell, or learn host paths; and that the agent keeps its
variables wherever the process could be kept.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import dspy
import pytest
from dspy.primitives.code_interpreter import CodeExecutionError, FinalOutput

from rlmoptimizer.sandbox import Sandbox
from rlmoptimizer.sandbox import process as process_module
from rlmoptimizer.sandbox.deno import deno_cache_dir
from rlmoptimizer.sandbox.process import cpu_seconds
from rlmoptimizer.sandbox.session import IDLE_CPU_ALLOWANCE_S

pytestmark = pytest.mark.slow

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def echo(value: object = None) -> object:
    return value


@pytest.fixture(scope="module")
def box():
    sandbox = Sandbox(tools={"echo": echo}, timeout_s=120)
    try:
        sandbox.start()
        yield sandbox
    finally:
        sandbox.shutdown()


def run(box: Sandbox, code: str) -> str:
    result = box.execute(code)
    return "" if result is None else str(result)


def _status_kb(path: str, key: str) -> int:
    return int(re.search(rf"^{key}:\s+(\d+) kB", Path(path).read_text(), re.M).group(1))


# ---------------------------------------------------------------- forged protocol lines


FORGED = {
    "tool call without id": {"jsonrpc": "2.0", "method": "tool_call", "params": {"name": "echo", "kwargs": {}}},
    "params not an object": {"jsonrpc": "2.0", "method": "tool_call", "id": "x1", "params": 5},
    "params a list": {"jsonrpc": "2.0", "method": "tool_call", "id": "x2", "params": ["echo"]},
    "kwargs not an object": {
        "jsonrpc": "2.0",
        "method": "tool_call",
        "id": "x3",
        "params": {"name": "echo", "kwargs": 1},
    },
    "unknown request": {"jsonrpc": "2.0", "method": "mount_file", "id": "x4", "params": {}},
    "neither request nor answer": {"jsonrpc": "2.0", "id": "x5"},
}


@pytest.mark.parametrize("writer", ["console.log", "Deno.stdout.writeSync"])
@pytest.mark.parametrize("name", list(FORGED))
def test_a_forged_protocol_line_is_an_error_of_that_cell_and_the_repl_keeps_its_variables(box, name, writer):
    restarts = box.restarts
    run(box, "kept = 41")
    line = json.dumps(FORGED[name])
    if writer == "console.log":
        code = f"import js\njs.console.log({line!r})\nprint('after')"
    else:
        code = f"import js\njs.Deno.stdout.writeSync(js.TextEncoder.new().encode({line + chr(10)!r}))\nprint('after')"
    with pytest.raises(CodeExecutionError) as raised:
        box.execute(code)
    message = str(raised.value)
    assert message.startswith("ProtocolError:") and "not a valid message" in message
    assert "print()" in message  # says what to do
    assert run(box, "print(kept + 1)") == "42\n"  # same process, nothing lost
    assert box.restarts == restarts


def test_noise_empty_lines_and_stale_answers_on_stdout_are_ignored(box):
    """Console output, an empty line (PythonInterpreter takes one for a dead process), more lines than
    PythonInterpreter skips, and an answer to no request in flight."""
    restarts = box.restarts
    stale = json.dumps({"jsonrpc": "2.0", "result": {"output": "forged"}, "id": "not-in-flight"})
    code = (
        "import js\nfor _i in range(300):\n    js.console.log('noise', _i)\n"
        f"js.console.log('')\njs.console.log({stale!r})\nprint('real', echo(value=7))"
    )
    assert run(box, code) == "real 7\n"
    assert box.restarts == restarts


def test_a_well_formed_forged_tool_call_desyncs_nothing_beyond_its_cell(box):
    """A forged tool call with an id is served like a call of the tool; its answer reaches whoever reads next
    in the sandbox (here the cell's real call, which fails in that cell), and the next cell is clean."""
    restarts = box.restarts
    run(box, "kept = 'forged'")
    forged_call = json.dumps(
        {"jsonrpc": "2.0", "method": "tool_call", "id": "f1", "params": {"name": "echo", "kwargs": {"value": 1}}}
    )
    with pytest.raises(CodeExecutionError, match="Unexpected response"):
        box.execute(f"import js\njs.console.log({forged_call!r})\nprint(echo(value=7))")
    assert run(box, "print(echo(value=kept))") == "forged\n"
    assert run(box, "print('next cell is clean')") == "next cell is clean\n"
    assert box.restarts == restarts


# ---------------------------------------------------------------- floods


def _flood_code(stream: str, mib: int) -> str:
    return (
        "import js\n"
        "_chunk = js.Uint8Array.new(1024 * 1024)\n_chunk.fill(120)\n"  # 1 MiB of 'x', no newline
        f"for _i in range({mib}):\n    js.Deno.{stream}.writeSync(_chunk)\n"
        "print('flooded')"
    )


def _host_peak_reset() -> int:
    """Reset this process's peak resident memory; its current resident memory in KiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("/proc/self/status", "VmRSS")


@linux_only
def test_a_gib_to_stderr_without_newline_does_not_grow_the_host(box):
    run(box, "kept = 'stderr'")
    before = _host_peak_reset()
    assert run(box, _flood_code("stderr", 1024)) == "flooded\n"
    grown_mb = (_status_kb("/proc/self/status", "VmHWM") - before) / 1024
    assert grown_mb < 150, f"the host grew by {grown_mb:.0f} MB reading 1 GiB of stderr"
    assert run(box, "print(kept)") == "stderr\n"


@linux_only
def test_a_gib_to_stdout_without_newline_is_an_error_of_that_cell_and_does_not_grow_the_host(box):
    restarts = box.restarts
    run(box, "kept = 'stdout'")
    before = _host_peak_reset()
    with pytest.raises(CodeExecutionError) as raised:
        box.execute(_flood_code("stdout", 1024))
    grown_mb = (_status_kb("/proc/self/status", "VmHWM") - before) / 1024
    assert grown_mb < 150, f"the host grew by {grown_mb:.0f} MB reading 1 GiB of stdout"
    message = str(raised.value)
    assert message.startswith("OutputTooLarge:") and "MiB" in message and "Print less" in message
    assert run(box, "print(kept)") == "stdout\n"
    assert box.restarts == restarts


def test_printing_more_than_the_host_accepts_is_an_error_of_that_cell(box):
    with pytest.raises(CodeExecutionError, match="OutputTooLarge"):
        box.execute("print('y' * (40 * 1024 * 1024))")
    assert run(box, "print('fine')") == "fine\n"


def test_a_print_far_past_the_limit_keeps_the_repl_and_its_variables(box):
    """Regression: ``print('A' * 50_000_000)`` exhausted the process's memory in copies of the output (the
    buffer, the JavaScript string, its JSON) and the REPL restarted, losing every variable."""
    restarts = box.restarts
    with pytest.raises(CodeExecutionError) as raised:
        box.execute("kept = 'still here'\nprint('A' * 200_000_000)\nimport sys\n_ = sys.stderr.write('e' * 60_000_000)")
    message = str(raised.value)
    assert message.startswith("OutputTooLarge:") and "191 MiB" in message and "keeps its variables" in message
    assert box.restarts == restarts and run(box, "print(kept)") == "still here\n"
    assert run(box, "import sys\nsys.stderr.write('e' * 60_000_000)\nprint(len('ok'))") == "2\n"  # never sent back


# ---------------------------------------------------------------- uncaught JavaScript errors


@pytest.mark.parametrize(
    "code, shown",
    [
        ("import js\njs.Deno.env.get('HOME')", "env access"),
        ("import js\njs.eval('null.x')", "TypeError"),
        ("raise ValueError(object(), float('nan'))", "ValueError: ('<object object"),
        ("raise ValueError('the plain message')", "ValueError: the plain message"),
    ],
    ids=["permission", "js-type-error", "unserializable-args", "one-arg-as-python-shows-it"],
)
def test_an_uncaught_javascript_error_is_an_ordinary_error_of_that_cell(box, code, shown):
    restarts = box.restarts
    run(box, "kept = [1, 2]")
    with pytest.raises(CodeExecutionError) as raised:
        box.execute(code)
    assert shown in str(raised.value)
    assert run(box, "print(kept)") == "[1, 2]\n"  # the process lived: nothing lost
    assert box.restarts == restarts


def test_submit_of_values_json_cannot_carry_is_an_answer_not_a_crash(box):
    restarts = box.restarts
    assert box.execute("SUBMIT({'n': float('nan'), 's': {3}})") == FinalOutput({"output": {"n": "nan", "s": "{3}"}})
    assert box.restarts == restarts


def spending_sandbox(calls: list) -> Sandbox:
    """A sandbox whose tool ``spend`` (an evaluation that would spend budget) records each call in ``calls``, and
    whose SUBMIT takes one field, ``answer``."""

    def spend(value: object = None) -> object:
        calls.append(value)
        return value

    box = Sandbox(tools={"spend": spend}, timeout_s=120)
    box.output_fields = [{"name": "answer", "type": "str"}]
    return box


def test_the_first_submit_ends_the_cell_even_when_caught_and_no_tool_runs_after_it():
    """Uncaught, the first SUBMIT ends the cell: caught (``try: SUBMIT(...) except BaseException: ...``), it still
    does, and a tool called after it (an evaluation that would spend budget) raises it again instead of running."""
    calls = []
    with spending_sandbox(calls) as box:
        code = (
            "for value in ['first', 'second']:\n"
            "    try:\n        SUBMIT(answer=value)\n    except BaseException:\n        pass\n"
            "try:\n    spend('after')\nexcept BaseException:\n    pass\n"
            "print('went on')"
        )
        assert box.execute(code) == FinalOutput({"answer": "first"})
        assert calls == []
        assert run(box, "spend('next cell')\nprint('ok')") == "ok\n" and calls == ["next cell"]


@pytest.mark.parametrize(
    "after",
    [
        "import builtins\nbuiltins._rlmopt_submitted = None\nspend('after')",  # the sandbox's own record undone
        "spend.__wrapped__('after')",  # dspy's tool function under the wrapper that checks the record
        "import builtins\nbuiltins._rlmopt_submitted = None\nraise ValueError('and an error')",
        "import builtins\nbuiltins._rlmopt_submitted = None\nSUBMIT(answer='second')",  # a second SUBMIT
    ],
)
def test_a_cell_that_undoes_the_sandboxs_record_of_its_submit_still_ends_with_it_and_spends_nothing(after):
    """Regression: the record of a caught SUBMIT was a builtin the cell could reset, and the unchecked tool was
    reachable as ``__wrapped__``: evaluations ran after the submission, and the submission was lost. The host keeps
    its own record now."""
    calls = []
    with spending_sandbox(calls) as box:
        code = f"try:\n    SUBMIT(answer='first')\nexcept BaseException:\n    pass\ntry:\n    {after.replace(chr(10), chr(10) + '    ')}\nexcept ValueError:\n    raise\nexcept BaseException:\n    pass\nprint('went on')"
        assert box.execute(code) == FinalOutput({"answer": "first"})
        assert calls == []
        assert run(box, "spend('next cell')\nprint('ok')") == "ok\n" and calls == ["next cell"]


@pytest.mark.parametrize(
    "after",
    [
        "import builtins\nbuiltins._rlmopt_submitted = None\nspend('after')",  # a payload JSON cannot carry
        "import js\njs.Deno.exit(3)",  # the process dies after the caught SUBMIT
    ],
)
def test_a_caught_submit_of_values_json_cannot_carry_or_before_the_process_dies_still_ends_the_cell(after):
    calls = []
    with spending_sandbox(calls) as box:
        code = f"try:\n    SUBMIT(answer={{1, 2}})\nexcept BaseException:\n    pass\n{after}\nprint('went on')"
        assert box.execute(code) == FinalOutput({"answer": "{1, 2}"})
        assert calls == []
        assert run(box, "spend('next cell')\nprint('ok')").endswith("ok\n") and calls == ["next cell"]


def test_the_capped_output_buffer_is_still_a_string_buffer(box):
    code = (
        "import io, sys\n"
        "print(isinstance(sys.stdout, io.StringIO), isinstance(sys.stdout, io.TextIOBase))\n"
        "sys.stdout.writelines(['a', 'b\\n'])\n"
        "with open('/tmp/x.txt', 'w') as f:\n    print('to a file', file=f)\n"
        "print(sys.stdout.getvalue().splitlines()[0])"
    )
    assert run(box, code) == "True True\nab\nTrue True\n"
    with pytest.raises(CodeExecutionError, match="OutputTooLarge"):  # writelines is counted too
        box.execute("import sys\nsys.stdout.writelines(['y' * 2**20] * 40)")
    with pytest.raises(CodeExecutionError, match="OutputTooLarge"):  # a value after it does not hide the loss
        box.execute("import sys\nsys.stdout.writelines(['y' * 2**20] * 40)\n'the value, not the output'")


def test_submit_rebound_by_a_cell_is_restored_after_it():
    """Regression: a cell that rebound SUBMIT (``SUBMIT = lambda **k: print('FAKE SUBMIT')``) kept it, so every later
    SUBMIT printed and nothing ended the run until the root LM's turns ran out. Like the tools, SUBMIT is back after
    every cell, with a notice; within the cell the agent's own definition is what it calls."""
    with Sandbox(tools={"echo": echo}, timeout_s=120) as box:
        box.output_fields = [{"name": "answer", "type": "str"}]
        first = run(box, "SUBMIT = lambda **k: print('FAKE SUBMIT')\nSUBMIT(answer='x')")
        assert "FAKE SUBMIT" in first
        assert "[Notice] SUBMIT is reserved" in first
        assert box.execute("SUBMIT(answer='real')") == FinalOutput({"answer": "real"})
        assert "[Notice] SUBMIT is reserved" in run(box, "del SUBMIT")
        assert box.execute("SUBMIT(answer='after del')") == FinalOutput({"answer": "after del"})
        assert "[Notice]" not in run(box, "print('quiet')")  # nothing rebound: no notice


@pytest.mark.parametrize(
    "rebind, shown",
    [
        ("import json\njson.dumps = lambda *a, **k: '{}'", "json.dumps"),
        ("import json\njson.loads = None", "json.loads"),
        ("run_sync = None", "run_sync"),
        ("JsProxy = None", "JsProxy"),
        ("json = None", "json"),
        ("import builtins\nbuiltins.isinstance = lambda *a: False", "isinstance"),
        ("import builtins\nbuiltins.print = lambda *a, **k: None", "print"),
        ("import json\njson.dumps = lambda obj: 'x'", "json.dumps"),  # (takes none of the keywords a check passes)
        ("import builtins\nbuiltins.setattr = None", "setattr"),  # (what putting back itself would use)
        ("dict = {'a': 1}", "dict"),  # a variable named like a builtin the tools' stubs call
    ],
)
def test_what_the_tools_and_submit_use_is_put_back_after_a_cell_that_rebound_it(rebind, shown):
    """Regression: a cell that patched ``json.dumps`` (which dspy's tool stubs call) made every later tool call lose
    its arguments (an evaluation asked for 1 example ran on all of them, run_gepa(budget=5) spent 24 units) and every
    SUBMIT fail; rebinding ``run_sync`` or ``JsProxy`` broke every later call, and patching ``print`` silenced every
    later turn. Each is put back after the cell, with a notice, as a rebound tool is."""
    calls = []
    with spending_sandbox(calls) as box:
        assert f"[Notice] {shown}" in run(box, rebind)
        assert run(box, "print(spend(value={'asked': 1}))") == "{'asked': 1}\n" and calls == [{"asked": 1}]
        assert box.execute("SUBMIT(answer='real')") == FinalOutput({"answer": "real"})
        assert "[Notice]" not in run(box, "import json\nprint(json.dumps([1]))")  # nothing rebound: no notice
        # rebound and used in the same cell: the tool still gets its arguments, and the cell's end says so
        same_cell = run(box, f"{rebind}\nanswer = spend(value={{'asked': 2}})\nimport builtins\nbuiltins.print(answer)")
        assert same_cell.startswith("{'asked': 2}\n") and f"[Notice] {shown}" in same_cell
        assert calls == [{"asked": 1}, {"asked": 2}]


@pytest.mark.parametrize("code", ["import os\nos.system('ls')", "import os\nos.kill(os.getpid(), 9)"])
def test_starting_or_signalling_a_process_is_an_error_of_the_cell_not_the_end_of_the_process(box, code):
    """Regression: os.system and os.kill aborted Pyodide (the agent lost every variable), where subprocess raises."""
    restarts = box.restarts
    run(box, "kept = 'alive'")
    with pytest.raises(CodeExecutionError, match="OSError: the sandbox runs no processes"):
        box.execute(code)
    assert run(box, "print(kept)") == "alive\n" and box.restarts == restarts


def test_an_error_thrown_later_in_a_timer_does_not_end_the_process(box):
    restarts = box.restarts
    run(box, "kept = 'timer'")
    run(box, "import js\njs.setTimeout(js.eval('() => { globalThis.fired = true; throw new Error(\"late\") }'), 0)")
    fired = "False\n"
    for _ in range(100):  # the timer fires while the process waits for the next cell: ask until it has
        fired = run(box, "import js\nprint(js.eval('globalThis.fired === true'))")
        if fired == "True\n":
            break
    assert fired == "True\n"
    assert run(box, "print(kept)") == "timer\n"
    assert box.restarts == restarts  # the same process throughout


# ---------------------------------------------------------------- host paths


def test_the_sandbox_reveals_no_host_path(box):
    code = (
        "import js, json\n"
        "_seen = {\n"
        "    'cwd': js.Deno.cwd(), 'execPath': js.Deno.execPath(), 'mainModule': js.Deno.mainModule,\n"
        "    'args': list(js.Deno.args), 'stack': js.eval('new Error(\"where\").stack'),\n"
        "    'captured': js.eval('(() => { const o = {}; Error.captureStackTrace(o); return o.stack; })()'),\n"
        "}\n"
        "try:\n    js.eval('undefinedFunction()')\nexcept Exception as e:\n    _seen['thrown'] = str(e) + str(getattr(e, 'stack', ''))\n"
        "try:\n    js.eval('Error.prepareStackTrace = (e, frames) => frames.map(f => f.getFileName()).join()')\n"
        "    _seen['override'] = js.eval('new Error().stack')\nexcept Exception as e:\n    _seen['override'] = str(e)\n"
        "import os, posix, sys, sysconfig\n"
        "_seen['python'] = {name: repr(getattr(sys, name, None)) for name in dir(sys)}\n"
        "_seen['environ'] = dict(os.environ)\n"
        "_seen['posix'] = {k.decode(): v.decode() for k, v in posix.environ.items()}\n"
        "_seen['sysconfig'] = sysconfig.get_config_var('projectbase')  # the others: Pyodide's build machine\n"
        "print(json.dumps(_seen))"
    )
    seen = json.loads(run(box, code))
    assert seen["cwd"] == "/" and seen["execPath"] == "deno" and seen["args"] == []
    assert "at " in seen["stack"]  # still a useful trace
    text = json.dumps(seen)
    secrets_of_the_host = {
        "working directory": os.getcwd(),
        "virtualenv": sys.prefix,
        "home": os.path.expanduser("~"),
        "dspy": os.path.dirname(dspy.__file__),
        "sandbox package": str(Path(__file__).resolve().parents[2]),
    }
    for what, path in secrets_of_the_host.items():
        assert path not in text, f"the sandbox can see the host's {what}: {path}"


# ---------------------------------------------------------------- memory


@linux_only
def test_javascript_buffers_are_capped_with_the_rest_of_the_process():
    """3 GiB of ArrayBuffers (outside the WebAssembly heap) against a 512 MB limit."""
    box = Sandbox(timeout_s=120, memory_limit_mb=512)
    try:
        box.start()
        pid = box.process_id
        started_kb = _status_kb(f"/proc/{pid}/status", "VmRSS")
        box.execute("kept = 'buffers'")
        bomb = (
            "import js\njs.eval('''globalThis.held = []; for (let i = 0; i < 30; i++) {"
            " const b = new Uint8Array(100 * 1024 * 1024); b.fill(1); held.push(b); }''')"
        )
        with pytest.raises(CodeExecutionError) as raised:
            box.execute(bomb)
        assert "RangeError: Array buffer allocation failed" in str(raised.value)
        # refused inside the process: it lived, and its peak stayed near the limit
        assert box.process_id == pid and box.restarts == 0
        peak_mb = (_status_kb(f"/proc/{pid}/status", "VmHWM") - started_kb) / 1024
        assert peak_mb < 512 + 200, f"the process grew by {peak_mb:.0f} MB with a 512 MB limit"
        assert box.execute("print(kept)") == "buffers\n"
        # A JavaScript heap that cannot be refused gracefully: the process ends and the agent is told it was memory.
        with pytest.raises(CodeExecutionError) as raised:
            box.execute(
                "import js\njs.eval('globalThis.held = null; const a = []; for (;;) a.push({i: a.length, s: \"x\" + a.length})')"
            )
        message = str(raised.value)
        assert message.startswith("MemoryError:") and "512 MB" in message and "restarted" in message
        assert box.execute("print(1 + 1)") == "2\n"
    finally:
        box.shutdown()


# ---------------------------------------------------------------- what a cell leaves running


BUSY_WORKER = (  # (the Web Worker constructor is gone; Node's worker_threads still start a thread)
    "import js\n"
    "js.eval(\"import('node:worker_threads').then((m) => new m.Worker('let n = 0; for (;;) { n++ }', {eval: true}))\")\n"
    "print('started')"
)
BUSY_TIMER = "import js\njs.eval('setInterval(() => { const t = Date.now(); while (Date.now() - t < 50) {} }, 0)')\nprint('started')"


class CountingClock:
    """Stands in for ``process.cpu_seconds`` and counts the watchdog's samples of one process."""

    def __init__(self, samples: int) -> None:
        self.pid: int | None = None
        self.samples = samples
        self.taken = 0
        self.done = threading.Event()

    def __call__(self, pid: int) -> float | None:
        if pid == self.pid:
            self.taken += 1
            if self.taken >= self.samples:
                self.done.set()
        return cpu_seconds(pid)


@linux_only
@pytest.mark.parametrize("code", [BUSY_WORKER, BUSY_TIMER], ids=["worker", "interval"])
def test_work_a_cell_leaves_running_is_stopped_and_the_agent_told(code, monkeypatch):
    box = Sandbox(timeout_s=60)
    try:
        box.start()
        box.execute("setup_value = 3")
        box.mark_setup_complete()
        assert box.execute(code) == "started\n"
        process = box._interp.deno_process
        at_end = last = cpu_seconds(process.pid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            last = cpu_seconds(process.pid) or last
            time.sleep(0.1)
        assert process.poll() is not None, "the busy process was left running"
        # stopped after about IDLE_CPU_ALLOWANCE_S of CPU (a wide margin for a loaded machine), not left to burn
        assert last - at_end < IDLE_CPU_ALLOWANCE_S + 4
        clock = CountingClock(samples=8)  # about 2 s of the watchdog's idle samples
        monkeypatch.setattr(process_module, "cpu_seconds", clock)
        output = box.execute("print(setup_value)")
        assert "BackgroundWork" in output and "kept running" in output and output.endswith("3\n")
        restarts = box.restarts
        # The new process is quiet while idle: the watchdog samples it and leaves it running.
        clock.pid = pid = box.process_id
        assert clock.done.wait(60), "the watchdog did not sample the idle process"
        assert box.process_id == pid and box.restarts == restarts
        assert box.execute("print(setup_value)") == "3\n"  # no notice: nothing was stopped
    finally:
        box.shutdown()


@linux_only
def test_cpu_used_while_a_tool_call_waits_counts_toward_the_cells_limit_and_the_wait_does_not():
    """Regression: the time limit paused for a tool call and nothing else watched the process, so a Worker
    spinning while a long tool call (a GEPA run: minutes) waited took a core all that time. The CPU the process uses
    meanwhile now counts toward the cell's limit; the cell's own concurrent work within it still runs."""
    seen: dict = {}

    def waits_for_the_process() -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and seen["process"].poll() is None:
            time.sleep(0.1)
        seen["stopped_during_the_call"] = seen["process"].poll() is not None
        return "done"

    def slow_tool() -> str:
        time.sleep(6)  # longer than the cell's limit: waiting is not charged
        return "done"

    box = Sandbox(tools={"waits_for_the_process": waits_for_the_process, "slow_tool": slow_tool}, timeout_s=120)
    try:
        box.start()
        box.execute("setup_value = 3")
        box.mark_setup_complete()
        box.timeout_s = 4.0  # the two cells below only: a limit shorter than the slow tool's wait
        crunch_beside_the_call = (
            "import asyncio, time\n"
            "async def crunch():\n"
            "    await asyncio.sleep(0.2)\n"
            "    t = time.time()\n"
            "    while time.time() - t < 1.5:\n"
            "        pass\n"
            "    return 'crunched'\n"
            "async def call():\n"
            "    return slow_tool()\n"
            "print(await asyncio.gather(call(), crunch()))"
        )
        assert box.execute(crunch_beside_the_call) == "['done', 'crunched']\n"
        seen["process"] = box._interp.deno_process
        try:
            output = box.execute(BUSY_WORKER.replace("print('started')", "print(waits_for_the_process())"))
        except CodeExecutionError as error:
            output = str(error)
        assert seen["stopped_during_the_call"]
        assert "TimeoutError" in output and "CPU the sandbox uses meanwhile" in output
        box.timeout_s = 120.0
        assert box.execute("print(setup_value)") == "3\n"  # the data is back in the new process
    finally:
        box.shutdown()


# A node:worker_threads thread (which the page's hardening does not reach) reads what an earlier sandbox stored
# with the Cache API, then stores a body of its own.
WORKER_CACHE = r"""
import js
js.globalThis.worker_code = '''
const { parentPort } = require("worker_threads");
(async () => {
  try {
    const cache = await caches.open("left");
    const earlier = await cache.match("http://left/x");
    const said = earlier ? "READ " + (await earlier.text()).slice(0, 20) : "nothing earlier";
    await cache.put("http://left/x", new Response("stored " + "x".repeat(100000)));
    parentPort.postMessage(said + "; STORED");
  } catch (e) { parentPort.postMessage("refused: " + e); }
})();
'''
print(await js.eval('''(async () => {
  const m = await import("node:worker_threads");
  const w = new m.Worker(globalThis.worker_code, { eval: true });
  const said = await new Promise((done) => { w.on("message", done); w.on("error", (e) => done("error " + e)); });
  await w.terminate();
  return said;
})()'''))
"""


def test_nothing_a_cell_stores_reaches_the_host_disk_or_a_later_sandbox():
    """Regression: Deno's localStorage and Cache API need no write permission; they persisted under
    DENO_DIR/location_data (a 20 MB cache body went to the host's disk) and a later sandbox read them back. A
    worker thread still has the Cache API: each sandbox has a Deno directory of its own where it cannot store."""
    attempts = (
        "js.localStorage.setItem('left', 'x')",
        "js.sessionStorage.setItem('left', 'x')",
        "run_sync(js.caches.open('left'))",
        "js.indexedDB.open('left')",
        "js.eval(\"localStorage.setItem('left', 'x')\")",
        "js.eval(\"globalThis.caches.open('left')\")",
    )
    location_data = None
    for _ in range(2):  # the second process would read what the first left
        sandbox = Sandbox(tools={}, timeout_s=120)
        if location_data is None:
            location_data = Path(deno_cache_dir(sandbox.deno_command[0]) or "/nonexistent") / "location_data"
            before = sorted(location_data.rglob("*")) if location_data.exists() else []
        try:
            sandbox.start()
            for attempt in attempts:
                with pytest.raises(CodeExecutionError):
                    sandbox.execute(f"import js\nfrom pyodide.ffi import run_sync\n{attempt}")
            shown = run(sandbox, "import js\nprint([str(getattr(js, n, None)) for n in ('localStorage', 'caches')])")
            assert shown == "['None', 'None']\n"
            from_worker = run(sandbox, WORKER_CACHE)
            assert from_worker.startswith("refused: ") and "READ" not in from_worker, from_worker
        finally:
            sandbox.shutdown()
    assert (sorted(location_data.rglob("*")) if location_data.exists() else []) == before


def test_a_cells_last_value_comes_after_what_it_printed_and_a_tool_result_shows_its_summary(box):
    """Regression: a cell that printed and ended with a value sent back the value alone (dspy's runner drops the
    prints), and a tool's result as the cell's last value showed its whole dict (10k characters on the benchmark)
    where its summary says what it holds."""
    assert run(box, "print('before')\n1 + 1") == "before\n2"
    assert run(box, "print('before')\n'text'") == "before\ntext"
    assert box.execute("1 + 1") == 2  # nothing printed: the value as the runner sends it
    big = "{'summary': 'two groups', 'groups': [1] * 5000, 'note': None}"
    assert run(box, f"echo({big})") == (
        "two groups\n(a dict: result[key] reads one of 'groups', 'note'; print(dict(result)) shows all)"
    )
    assert run(box, f"r = echo({big})\nprint(isinstance(r, dict), r['groups'][:2], len(json.dumps(r)) > 5000)") == (
        "True [1, 1] True\n"
    )
    assert run(box, "print(r['note'] is None, len(repr(dict(r))) > 5000)") == "True True\n"
    assert box.execute("echo({'a': 1})") == {"a": 1}  # no summary: a plain dict


def test_a_tools_runtime_error_is_named_once():
    """Regression: a tool's RuntimeError (the budget's refusal of a sub-LM prompt) reached the agent as
    ``RuntimeError: RuntimeError: budget exhausted ...``."""

    def refuse(value: object = None) -> object:
        raise RuntimeError("budget exhausted: 1 sub_lm_call unit(s) requested, 0 left")

    with Sandbox(tools={"refuse": refuse}, timeout_s=120) as box:
        shown = run(box, "try:\n    refuse()\nexcept RuntimeError as e:\n    print(str(e))")
        assert shown == "budget exhausted: 1 sub_lm_call unit(s) requested, 0 left\n"
