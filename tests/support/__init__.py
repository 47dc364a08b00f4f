"""Shared test fixtures, imported by tests, by the scripts tests run in a process of their own, and by benchmarks
(never a test module, never the offline demo ``example.py``):

- ``fakes``: the offline LMs; ``tickets``: the ticket-routing task; ``qa``: a small QA task;
- ``optimizing``: the optimizer on the ticket task as most tests run it (scripted turns, the optimizer and
  compile builders, the sub-LM proposer, LMs that fail or stop on cue);
- ``lineage`` and ``analysing``: compiles whose returned instructions have an ancestry (GEPA from a proposal; a
  proposal written for a group of a failure analysis);
- ``processes``: scripts in their own process, and waiting for the point a script reports reaching;
- ``readonly``: a file system that refuses every write; ``metrics`` and ``objects``: metrics and examples a
  resume must recognise in a new process;
- ``responses_server``: a fake OpenAI Responses server; ``npm_registry``: the npm registry on 127.0.0.1 that
  serves what a warm Deno cache holds; ``manifests``: a run directory's manifest in the current format.
"""
