"""The run directory on disk: atomic files, the run store, the journal, and what a resume reads back.

Owns every file under ``run_storage_dir`` (``runs/``, ``prompts/``, ``turns/``, ``ledger.json``,
``result.json``, ``manifest.json``, ``usage.json``, ``notes.json``: the agent's notes, :mod:`.notes`).

May import: ``rlmoptimizer.records``, ``.errors``, ``.events`` (the journal observes what it writes) and
the standard library; nothing above it (no evaluation, agent or optimizer).
"""
