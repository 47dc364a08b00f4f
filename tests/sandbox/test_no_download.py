"""Sandboxed code downloads nothing: loading a module is not network access to Deno (``--deny-net`` lets
``import()`` of ``https:``, ``jsr:`` and ``npm:`` specifiers download, from a Worker's fresh scope too), so the
sandbox runs with ``--deny-import --cached-only`` and Pyodide is fetched before it starts, by a process that runs
no sandboxed code."""

from __future__ import annotations

import pytest

from rlmoptimizer.sandbox import Sandbox
from rlmoptimizer.sandbox.check import ConnectRecorder
from rlmoptimizer.sandbox.deno import fetch_command

pytestmark = pytest.mark.slow

SPECIFIERS = ("https://esm.sh/left-pad@1.3.0", "npm:left-pad@1.3.0", "jsr:@std/fmt@1")

# From a node:worker_threads Worker (a JavaScript scope the sandbox's hardening does not reach) and from the page.
IMPORTS = """
import js
js.globalThis.specifiers = js.JSON.parse({specifiers!r})
worker_code = '''
const {{ parentPort, workerData }} = require("worker_threads");
(async () => {{
  const out = [];
  for (const s of workerData) {{ try {{ await import(s); out.push("LOADED " + s); }} catch (e) {{ out.push("refused " + s); }} }}
  parentPort.postMessage(out);
}})();
'''
js.globalThis.worker_code = worker_code
found = await js.eval('''(async () => {{
  const out = [];
  for (const s of globalThis.specifiers) {{ try {{ await import(s); out.push("LOADED " + s); }} catch (e) {{ out.push("refused " + s); }} }}
  const m = await import("node:worker_threads");
  const w = new m.Worker(globalThis.worker_code, {{ eval: true, workerData: globalThis.specifiers }});
  const inWorker = await new Promise((done) => {{ w.on("message", done); w.on("error", (e) => done(["error " + e])); }});
  await w.terminate();
  return JSON.stringify([...out, ...inWorker.map((line) => "worker: " + line)]);
}})()''')
print(found)
"""


def test_no_cell_downloads_a_module_from_the_page_or_a_worker(monkeypatch):
    recorder = ConnectRecorder()
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, recorder.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    try:
        with Sandbox(timeout_s=120) as box:
            box.start()  # Pyodide is in the cache: its fetch needs no download either
            assert recorder.lines == []
            assert box.execute("import js\nprint(js.Worker)") == "None\n"  # no Web Worker to start
            shown = box.execute(IMPORTS.format(specifiers=str(list(SPECIFIERS)).replace("'", '"')))
    finally:
        recorder.close()
    assert "LOADED" not in shown
    assert all(f"refused {s}" in shown and f"worker: refused {s}" in shown for s in SPECIFIERS), shown
    assert recorder.lines == []  # not one attempt reached the network


def test_the_fetch_resolves_the_runners_npm_imports_as_the_sandbox_does():
    runner = 'import pyodideModule from "npm:pyodide@0.29.4/pyodide.js";\nimport { x } from "./local.js";\n'
    command = ["deno", "run", "--no-prompt", "--cached-only", "--no-config", "--no-lock", "--node-modules-dir=false"]
    assert fetch_command([*command, "runner.js"], runner) == [
        "deno",
        "cache",
        "--quiet",
        "--no-config",
        "--no-lock",
        "--node-modules-dir=false",
        "npm:pyodide@0.29.4/pyodide.js",
    ]
    assert fetch_command(command, 'import { x } from "./local.js";') is None


def test_a_deno_too_old_for_deny_import_is_refused_saying_what_to_install(tmp_path):
    from rlmoptimizer.errors import SandboxError
    from rlmoptimizer.sandbox.deno import check_deno_version

    old = tmp_path / "deno"
    old.write_text('#!/bin/sh\necho "deno 2.3.3 (stable, release, x86_64-unknown-linux-gnu)"\n')
    old.chmod(0o755)
    with pytest.raises(SandboxError, match=r"needs Deno 2\.4 or newer .* is deno 2\.3\.3\. Upgrade it"):
        check_deno_version(str(old))
