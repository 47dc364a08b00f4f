"""The sandboxed REPL, through a real Deno/Pyodide process (no network needed).

One sandbox is shared by most tests (each Deno start takes seconds); tests that restart it leave it usable.
Isolation tests try each escape from inside and check on the host side that it had no effect.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import dspy
import pytest
from dspy.primitives.code_interpreter import (
    CodeExecutionError,
    CodeInterpreter,
    CodeInterpreterError,
    FinalOutput,
    _validate_interpreter,
)
from dspy.primitives.python_interpreter import PythonInterpreter
from support.fakes import FunctionLM

from rlmoptimizer.errors import SandboxError, agent_error
from rlmoptimizer.sandbox import DENO_FLAGS, Sandbox, build_import_map
from rlmoptimizer.sandbox import deno_environment as _deno_environment

pytestmark = pytest.mark.slow

TIMEOUT_S = 2.0
"""The limit of a cell meant to time out (an endless loop): only such cells run under it."""
LIMIT_S = 120.0
"""The limit of every other cell of these tests: a short one failed ordinary cells on a loaded machine (a 2 s limit
stopped the network probes at load 10)."""
TOOL_LIMIT_S = 5.0
"""The limit of the cell whose tool runs past it (the cell's own code takes a fraction of it at any load)."""
ENV_SECRET_NAME = "RLMOPT_SANDBOX_TEST_SECRET"
ENV_SECRET_VALUE = "env-" + secrets.token_hex(8)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid> of the Deno process")


# ---------------------------------------------------------------- fixtures


def add(a: int, b: int = 2) -> dict:
    """Add two numbers."""
    return {"sum": a + b, "inputs": [a, b]}


def echo(value: object = None) -> object:
    return value


def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def fail(message: str) -> None:
    raise ValueError(message)


def refuse(step: str) -> None:
    raise agent_error(f"unknown step {step!r}", "use one of ['route']")


@contextmanager
def limited(box: Sandbox, seconds: float):
    """The cells run inside under a limit of ``seconds``."""
    before, box.timeout_s = box.timeout_s, seconds
    try:
        yield
    finally:
        box.timeout_s = before


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("sandbox-data")
    (directory / "baseline.json").write_text(json.dumps({"score": 0.5, "examples": [1, 2, 3]}))
    (directory / "secret.txt").write_text("host-secret-" + secrets.token_hex(8))
    return directory


@pytest.fixture(scope="module")
def sandbox(data_dir):
    os.environ[ENV_SECRET_NAME] = ENV_SECRET_VALUE
    box = Sandbox(
        tools={"add": add, "echo": echo, "slow": slow, "fail": fail, "refuse": refuse},
        timeout_s=LIMIT_S,
        memory_limit_mb=256,
    )
    try:
        box.start()
        # The setup the agent runs itself: data handed in once, replayed after every restart.
        box.execute(
            "import json\nbaseline = json.loads(baseline_json)",
            {"baseline_json": (data_dir / "baseline.json").read_text()},
        )
        box.mark_setup_complete()
        yield box
    finally:
        os.environ.pop(ENV_SECRET_NAME, None)
        box.shutdown()


def run(box: Sandbox, code: str, variables: dict | None = None) -> str:
    result = box.execute(code, variables)
    return "" if result is None else str(result)


def deno_dir(box: Sandbox) -> str:
    found = PythonInterpreter._get_deno_dir(box.deno_command[0])
    assert found, "the test needs Deno's cache dir"
    return os.path.realpath(found)


# ---------------------------------------------------------------- offline start and protocol


def test_import_map_covers_every_deno_land_import_of_the_runner():
    runner = Path(PythonInterpreter()._get_runner_path()).read_text(encoding="utf-8")
    urls = set(re.findall(r"https://deno\.land/[^'\"]+", runner))
    assert urls, "dspy's runner no longer imports from deno.land; this test can go"
    mapped = build_import_map(runner)["imports"]
    assert set(mapped) == urls
    for target in mapped.values():
        assert target.startswith("file://") and Path(target[len("file://") :]).is_file()


def test_import_map_refuses_a_deno_land_module_it_cannot_serve():
    source = 'import { x } from "https://deno.land/std@0.200.0/fs/mod.ts";'
    with pytest.raises(SandboxError, match="cannot serve offline"):
        build_import_map(source)


def test_deno_command_has_the_import_map_and_the_deny_flags(sandbox):
    command = sandbox.deno_command
    maps = [arg for arg in command if arg.startswith("--import-map=")]
    assert len(maps) == 1
    import_map = json.loads(Path(maps[0].split("=", 1)[1]).read_text())
    assert all(url.startswith("https://deno.land/std@") for url in import_map["imports"])
    for flag in DENO_FLAGS:
        assert flag in command
    assert not any(arg.startswith(("--allow-net", "--allow-env", "--allow-write", "--allow-run")) for arg in command)


def test_starts_offline_in_the_background_and_runs_on_another_thread(monkeypatch):
    """Every proxy points at a closed port: any fetch Deno tried would fail, so a start proves none is needed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert _deno_environment()["HTTPS_PROXY"] == dead  # what Deno is started with (see the /proc test below)
    box = Sandbox(timeout_s=30, replay_limit=2)
    try:
        box.start_in_background()  # starts on a helper thread
        assert box.execute("print(1 + 1)") == "2\n"  # used from this one
        assert box.execute("x = 40") in (None, "")
        assert box.execute("print(x + 2)") == "42\n"
        with pytest.raises(SandboxError, match="replay_limit=2"):  # three executes cannot all be replayed
            box.mark_setup_complete()
    finally:
        box.shutdown()
    with pytest.raises(SandboxError, match="shut down"):
        box.execute("print(1)")


def test_a_failed_background_start_surfaces_on_the_next_execute():
    box = Sandbox(start_timeout_s=0.5)  # Pyodide takes seconds to load
    box.start_in_background()
    with pytest.raises(SandboxError, match="did not start within 0.5 s"):
        box.execute("print(1)")
    assert box.process_id is None  # nothing left running
    box.shutdown()


def test_implements_dspys_interpreter_protocol(sandbox):
    assert isinstance(sandbox, CodeInterpreter)
    _validate_interpreter(sandbox)
    assert "Pyodide" in Sandbox.execution_instructions
    assert f"{LIMIT_S:g} s" in sandbox.execution_instructions


def test_variables_output_submit_and_errors(sandbox):
    assert run(sandbox, "print(n * 2, words)", {"n": 21, "words": ["a", "b"]}) == "42 ['a', 'b']\n"
    assert sandbox.execute("SUBMIT({'answer': 42})") == FinalOutput({"output": {"answer": 42}})
    with pytest.raises(SyntaxError):
        sandbox.execute("def broken(:")
    with pytest.raises(CodeExecutionError, match="ZeroDivisionError"):
        sandbox.execute("1 / 0")
    assert run(sandbox, "print('still here')") == "still here\n"


# ---------------------------------------------------------------- tools


def test_tool_calls_receive_json_values(sandbox):
    output = run(sandbox, "r = add(a=1)\nprint(type(r).__name__, r['sum'], r['inputs'])")
    assert output == "dict 3 [1, 2]\n"
    output = run(sandbox, "v = echo(value={'k': [1, 2.5, None, True]})\nprint(v, type(v['k']).__name__)")
    assert output == "{'k': [1, 2.5, None, True]} list\n"


def test_a_tool_call_whose_arguments_no_message_can_carry_is_refused_at_once_and_the_cell_goes_on(sandbox):
    """Regression: a call whose arguments passed the 32 MiB a message to the host can carry was dropped by the host's
    reader: the cell waited for its time limit, its output and the REPL's variables were lost, and the error blamed
    the code for running too long."""
    code = (
        "print('before the call')\nkept = 1\n"
        "try:\n    echo(value='u' * (40 * 2**20))\nexcept AgentToolError as e:\n    print('refused:', e)\n"
        "print('after', kept)"
    )
    output = run(sandbox, code)
    assert output.startswith("before the call\nrefused: echo(): its arguments come to 40.0 MiB, more than the 32 MiB")
    assert output.endswith("after 1\n") and run(sandbox, "print(kept)") == "1\n"


def test_a_tool_error_is_an_agent_error_and_the_repl_survives(sandbox):
    with pytest.raises(CodeExecutionError, match="bad input"):
        sandbox.execute("fail(message='bad input')")
    assert run(sandbox, "print(add(a=2, b=3)['sum'])") == "5\n"


def test_an_error_meant_for_the_agent_is_raised_as_AgentToolError_with_its_message_alone(sandbox):
    with pytest.raises(CodeExecutionError) as refused:
        sandbox.execute("refuse(step='rout')")
    shown = str(refused.value)
    assert "AgentToolError" in shown and "unknown step 'rout' -> use one of ['route']" in shown
    assert "RuntimeError" not in shown
    code = (
        "try:\n    refuse(step='x')\nexcept AgentToolError as e:\n"
        "    print(isinstance(e, ValueError), e)\n"
        "try:\n    fail(message='plain')\nexcept AgentToolError:\n    print('wrong')\n"
        "except RuntimeError as e:\n    print('host error', 'plain' in str(e))"
    )
    assert run(sandbox, code) == "True unknown step 'x' -> use one of ['route']\nhost error True\n"


def test_tools_changed_between_executes_are_registered(sandbox):
    sandbox.tools["triple"] = lambda x: 3 * x
    try:
        assert run(sandbox, "print(triple(x=5))") == "15\n"
    finally:
        del sandbox.tools["triple"]
    assert run(sandbox, "print('triple' in globals(), add(a=1)['sum'])") == "False 3\n"


def test_time_inside_tools_does_not_count_toward_the_limit(sandbox):
    """A cell whose tool call takes longer than the limit runs to its end in the same process."""
    timeouts, restarts, pid = sandbox.timeouts, sandbox.restarts, sandbox.process_id
    with limited(sandbox, TOOL_LIMIT_S):
        assert run(sandbox, f"kept = 7\nprint(slow(seconds={TOOL_LIMIT_S + 1.0}), kept)") == "slept 7\n"
    assert (sandbox.timeouts, sandbox.restarts, sandbox.process_id) == (timeouts, restarts, pid)


# ---------------------------------------------------------------- data, timeouts, crashes


def test_the_setup_is_loaded(sandbox):
    assert run(sandbox, "print(baseline['score'], baseline['examples'])") == "0.5 [1, 2, 3]\n"


def test_timeout_restarts_reloads_data_and_names_lost_variables(sandbox):
    timeouts, restarts = sandbox.timeouts, sandbox.restarts
    run(sandbox, "import re\nkept_a = 1\n_hidden = 2\ndef helper():\n    return 3\nbaseline['extra'] = True")
    with limited(sandbox, TIMEOUT_S), pytest.raises(CodeExecutionError) as raised:  # the endless loop was stopped
        sandbox.execute("counter = 0\nwhile True:\n    counter += 1", {"given": 1})
    message = str(raised.value)
    assert f"more than {TIMEOUT_S:g} s" in message
    assert "restarted" in message and "baseline" in message
    lost = sandbox.lost_variables_on_last_restart
    assert {"helper", "kept_a"} <= set(lost)
    assert not {"re", "_hidden", "baseline", "given", "add", "triple"} & set(lost)  # modules, private, data, tools
    assert f"lost: [{', '.join(lost)}]" in message
    assert (sandbox.timeouts, sandbox.restarts) == (timeouts + 1, restarts + 1)
    # The next execute works, with the data back as loaded and the agent's variables gone.
    assert run(sandbox, "print(baseline, 'kept_a' in globals())") == ("{'score': 0.5, 'examples': [1, 2, 3]} False\n")
    assert run(sandbox, "print(add(a=1, b=1)['sum'])") == "2\n"  # tools registered again


@pytest.mark.parametrize(
    "code, expected",
    [
        ("import js\njs.Deno.exit(3)", "code 3"),
        ("import os\nos._exit(1)", "died"),
    ],
    ids=["deno-exit", "os-exit"],
)
def test_a_dead_process_is_restarted(sandbox, code, expected):
    restarts = sandbox.restarts
    run(sandbox, "mine = 1")
    with pytest.raises(CodeExecutionError) as raised:
        sandbox.execute(code)
    message = str(raised.value)
    assert "process died" in message and expected in message
    assert "mine" in sandbox.lost_variables_on_last_restart and "mine" in message
    assert sandbox.restarts == restarts + 1
    assert run(sandbox, "print(baseline['score'])") == "0.5\n"


def test_a_flood_of_stderr_does_not_block_the_process(sandbox):
    code = "import js\nfor _ in range(3000):\n    js.console.error('e' * 200)\nprint('done')"
    assert run(sandbox, code) == "done\n"  # 600 KB, ten times a pipe buffer


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_process_killed_between_executes_is_restarted_with_a_notice(sandbox):
    run(sandbox, "survivor = 1")
    process = sandbox._interp.deno_process
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)  # dead before the next execute (otherwise it is a death during that execute)
    output = run(sandbox, "print(baseline['score'])")
    assert "restarted" in output and "survivor" in output
    assert output.endswith("0.5\n")


@pytest.fixture(scope="module")
def memory_blowup(sandbox) -> tuple[str, str, int | None]:
    """A cell that allocates without end, run once: its error, what the next cell saw, and the process id."""
    with pytest.raises(CodeExecutionError) as raised:
        sandbox.execute("hog = []\nwhile True:\n    hog.append('a' * 10**6)")
    after = run(sandbox, "print(len(hog) < 300)\ndel hog")
    return str(raised.value), after, sandbox.process_id


def test_a_memory_blowup_stops_at_the_cap_and_the_repl_survives(sandbox, memory_blowup):
    error, after, pid = memory_blowup
    assert "MemoryError" in error
    assert after == "True\n"  # the same process, its variables still there
    assert run(sandbox, "print(baseline['score'])") == "0.5\n"


@linux_only
def test_a_memory_blowup_peaks_near_the_cap(memory_blowup):
    _, _, pid = memory_blowup
    peak_kb = int(re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))
    assert peak_kb < 1_500_000  # 256 MiB of Python memory plus Deno, far from Pyodide's 4 GiB


# ---------------------------------------------------------------- isolation


def probe(box: Sandbox, attempt: str) -> str:
    """Run ``attempt`` (code that returns what it got) in the sandbox; 'BLOCKED <error>' if it raised."""
    code = (
        "import js, pyodide\n"
        "async def _probe():\n"
        + "".join(f"    {line}\n" for line in attempt.splitlines())
        + "try:\n    print('GOT', await _probe())\nexcept BaseException as e:\n    print('BLOCKED', type(e).__name__, e)\n"
    )
    return run(box, code)


def test_cannot_read_host_files(sandbox, data_dir):
    secret = (data_dir / "secret.txt").read_text()
    passwd = Path("/etc/passwd").read_text() if Path("/etc/passwd").exists() else "root:x:0:0"
    attempts = {  # each attempt and how it is refused
        "return open('/etc/passwd').read()": "BLOCKED FileNotFoundError",  # Pyodide's own file system
        "return js.Deno.readTextFileSync('/etc/hostname')": "BLOCKED JsException NotCapable",
        "return js.Deno.readTextFileSync('/etc/passwd')": "BLOCKED JsException NotCapable",
        f"return open({str(data_dir / 'secret.txt')!r}).read()": "BLOCKED FileNotFoundError",
        f"return js.Deno.readTextFileSync({str(data_dir / 'secret.txt')!r})": "BLOCKED JsException NotCapable",
        f"return js.Deno.readTextFileSync({str(Path(__file__).resolve())!r})": "BLOCKED JsException NotCapable",
        # Deno's cache, after startup
        f"return [e.name for e in js.Deno.readDirSync({deno_dir(sandbox)!r})]": "BLOCKED JsException NotCapable",
        'return (await js.Deno.permissions.request(js.JSON.parse(\'{"name": "read"}\'))).state': "GOT denied",
    }
    for attempt, refused in attempts.items():
        output = probe(sandbox, attempt)
        assert output.startswith(refused), (attempt, output)
        assert secret not in output and passwd.splitlines()[0] not in output
    assert socket.gethostname() not in probe(sandbox, "return js.Deno.readTextFileSync('/etc/hostname')")


def test_cannot_read_environment_variables(sandbox):
    attempts = [
        f"import os\nreturn os.environ[{ENV_SECRET_NAME!r}]",
        f"return js.Deno.env.get({ENV_SECRET_NAME!r})",
        "return js.JSON.stringify(js.Deno.env.toObject())",
        "return js.eval('process.env')." + ENV_SECRET_NAME,
    ]
    for attempt in attempts:
        output = probe(sandbox, attempt)
        assert ENV_SECRET_VALUE not in output, (attempt, output)
        # Pyodide's os.environ is its own (KeyError); Deno refuses the rest
        assert output.startswith(("BLOCKED KeyError", "BLOCKED JsException NotCapable")), (attempt, output)


@linux_only
def test_the_deno_process_gets_only_the_environment_it_needs(sandbox):
    """The process itself does not have the secret: it was started with deno_environment()'s allow-list."""
    environ = Path(f"/proc/{sandbox.process_id}/environ").read_bytes().split(b"\0")
    assert not any(ENV_SECRET_NAME.encode() in entry for entry in environ)
    assert b"DENO_NO_PACKAGE_JSON=1" in environ


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.requests.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"reached")

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingHandler)
    _CountingHandler.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_cannot_reach_the_network(sandbox, http_server):
    url, port = http_server
    attempts = [
        f"return (await js.fetch({url + '/fetch'!r})).status",
        f"from pyodide.http import pyfetch\nreturn (await pyfetch({url + '/pyfetch'!r})).status",
        f"from pyodide.http import open_url\nreturn open_url({url + '/open_url'!r}).read()",
        f"import urllib.request\nreturn urllib.request.urlopen({url + '/urllib'!r}, timeout=3).read()",
        f"import socket\nreturn socket.create_connection(('127.0.0.1', {port}), timeout=3)",
        f'return await js.Deno.connect(js.JSON.parse(\'{{"hostname": "127.0.0.1", "port": {port}}}\'))',
    ]
    for attempt in attempts:
        output = probe(sandbox, attempt)
        assert output.startswith("BLOCKED"), (attempt, output)
        assert "reached" not in output
    assert _CountingHandler.requests == []  # a request would be recorded before its answer could come back


def test_cannot_start_processes(sandbox, tmp_path):
    marker = tmp_path / "spawned"
    attempts = [
        f"import subprocess\nreturn subprocess.run(['touch', {str(marker)!r}])",
        f"return js.eval(\"new Deno.Command('touch', {{args: ['{marker}']}}).outputSync().code\")",
        "return js.Deno.dlopen('libc.so.6', js.Object.new())",
        f"import os\nreturn os.system('touch {marker}')",  # (it used to bring Pyodide down: a restart)
    ]
    restarts = sandbox.restarts
    for attempt in attempts:
        output = probe(sandbox, attempt)
        assert output.startswith(("BLOCKED OSError", "BLOCKED JsException NotCapable")), (attempt, output)
    assert sandbox.restarts == restarts
    assert not marker.exists()
    assert run(sandbox, "print(baseline['score'])") == "0.5\n"


def test_cannot_write_host_files_or_read_system_information(sandbox, tmp_path):
    target = tmp_path / "written.txt"
    attempts = [
        f"return js.Deno.writeTextFileSync({str(target)!r}, 'x')",
        f"return js.eval(\"Deno.mkdirSync('{tmp_path / 'made'}')\")",
        "return js.Deno.hostname()",
        "return js.Deno.osRelease()",
    ]
    for attempt in attempts:
        output = probe(sandbox, attempt)
        assert output.startswith("BLOCKED"), (attempt, output)
    # Python's open() writes into Pyodide's in-memory file system, never to the host.
    run(sandbox, f"import os\nos.makedirs({str(tmp_path)!r}, exist_ok=True)\nopen({str(target)!r}, 'w').write('x')")
    assert not target.exists() and not (tmp_path / "made").exists()


def test_recursive_execute_from_a_tool_is_refused(sandbox):
    sandbox.tools["reenter"] = lambda: sandbox.execute("print(1)")
    try:
        with pytest.raises(CodeExecutionError, match="inside one of its own tools"):
            sandbox.execute("reenter()")
    finally:
        del sandbox.tools["reenter"]
    assert run(sandbox, "print('ok')") == "ok\n"


# ---------------------------------------------------------------- validation


def test_deno_gets_only_the_environment_it_needs():
    env = _deno_environment(
        {
            "PATH": "/bin",
            "HOME": "/home/u",
            "DENO_DIR": "/cache",
            "HTTPS_PROXY": "http://proxy:3128",
            "NPM_CONFIG_REGISTRY": "https://npm.example",
            "OPENAI_API_KEY": "sk-secret",
            "AWS_SECRET_ACCESS_KEY": "x",
        }
    )
    assert env["DENO_DIR"] == "/cache" and env["HTTPS_PROXY"] == "http://proxy:3128"
    assert env["NPM_CONFIG_REGISTRY"] == "https://npm.example" and env["PATH"] == "/bin"
    assert "OPENAI_API_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["DENO_NO_PACKAGE_JSON"] == "1"


def test_a_relative_deno_dir_names_the_same_cache_wherever_deno_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _deno_environment({"DENO_DIR": "cache"})["DENO_DIR"] == str(tmp_path / "cache")
    assert _deno_environment({"DENO_DIR": "~/deno", "HOME": "/home/u"})["DENO_DIR"].endswith("/deno")
    assert not _deno_environment({"DENO_DIR": "~/deno"})["DENO_DIR"].startswith("~")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": float("inf")}, r"timeout_s must be a number of seconds greater than 0 and at most 86400"),
        ({"timeout_s": float("nan")}, r"greater than 0 and at most 86400 \(one day\), got nan"),
        ({"timeout_s": 1e300}, "at most 86400"),
        ({"start_timeout_s": float("inf")}, "start_timeout_s must be .* at most 86400"),
        ({"replay_limit": -1}, "replay_limit"),
        ({"memory_limit_mb": 8}, "memory_limit_mb"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sandbox(**kwargs)


# ---------------------------------------------------------------- with dspy.RLM


def test_rlm_survives_a_timed_out_iteration_and_submits():
    box = Sandbox(timeout_s=TIMEOUT_S)
    box.start_in_background()
    box.execute("prepared = [1, 2]")  # the caller's own setup, replayed after a restart
    box.mark_setup_complete()
    turns = [
        {"reasoning": "Count forever.", "code": "```python\nnote = 'x'\nwhile True:\n    pass\n```"},
        {
            "reasoning": "The REPL came back; answer.",
            "code": "```python\nSUBMIT(answer=f'{prepared}-{question}-{type(dspy).__name__}')\n```",
        },
    ]

    def reply(messages):
        if len(lm.calls) > 1:  # the cell meant to time out has: the answer runs under a limit no load reaches
            box.timeout_s = LIMIT_S
        return turns[min(len(lm.calls), len(turns)) - 1]

    lm = FunctionLM(reply)
    rlm = dspy.RLM("question -> answer", max_iters=3, interpreter_factory=box.as_factory())
    with dspy.context(lm=lm):
        result = rlm(question="q")
    assert result.answer == "[1, 2]-q-module"  # replayed setup and dspy's facade are both back
    first_output = result.trajectory[0]["output"]
    assert "TimeoutError" in first_output and f"{TIMEOUT_S:g} s" in first_output
    assert box.timeouts == 1 and box.restarts == 1
    with pytest.raises(SandboxError, match="shut down"):  # RLM shut it down at the end
        box.execute("print(1)")


def test_as_factory_hands_the_sandbox_out_once():
    box = Sandbox()
    factory = box.as_factory()
    assert factory() is box
    assert factory.execution_instructions == box.execution_instructions
    with pytest.raises(CodeInterpreterError, match="already in use"):
        factory()
    box.shutdown()
