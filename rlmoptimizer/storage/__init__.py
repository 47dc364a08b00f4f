"""The run directory on disk: atomic files, the run store, the journal, and what a resume reads back.

Owns every file under ``run_storage_dir``; :mod:`.layout` is the one place that names them (``runs/``,
``prompts/``, ``turns/``, ``manifest.json``, ``ledger.json``, ``usage.json``, ``notes.json``, ``result.json``, ...),
and :mod:`rlmoptimizer.report` reads a run directory back through it.

May import: ``rlmoptimizer.records``, ``.errors``, ``.events`` (the journal observes what it writes) and
the standard library; nothing above it (no evaluation, agent or optimizer).
"""
