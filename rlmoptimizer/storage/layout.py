"""The layout of a run directory: the one place that names its files.

Everything a compile() paid for is on disk as soon as it exists (each file written atomically: complete or absent,
and there as soon as the write returns, so a killed process loses nothing written; turns and prompt versions are
made durable against a power loss a few milliseconds later, on a background thread, and all of them before
``result.json`` is written)::

    .lock                        locked (an OS file lock) by the one compile() using the directory
    holder.json                  which process holds the lock (pid, host, since when) while it runs
    manifest.json                what this directory belongs to (program structure, data, metric, budget) and what
                                 its stored scores depend on (evaluation LM, pass_threshold)
    ledger.json                  the budget ledger, written after every evaluation and every agent turn
    runs/run-0001.json           every evaluation run (rlmoptimizer.storage.run_store)
    runs/pending-<hex>.jsonl     the records of an evaluation in flight, deleted once its run is saved
    prompts/v-0001.json          every prompt version the agent made
    turns/turn-0001.json         every agent turn (reasoning, code, output)
    pending_reply.json           the root LM's reply of the turn under way (its code runs next), until the turn is kept
    usage.json                   LM calls, tokens and dollars per role, after every evaluation and agent turn
    estimate.json                what the first compile() predicted it would cost, before its first paid call
    notes.json                   the agent's notes (rlmoptimizer.storage.notes)
    candidates.json              the named candidates and their lineage (rlmoptimizer.storage.candidates)
    gepa_runs.json               what each GEPA run has paid or reserved, and whether it finished
    gepa_reflections.jsonl       the reflection LM's answers, replayed on resume (rlmoptimizer.storage.answers)
    proposals.jsonl              the proposal LM's answers (propose_instructions), replayed on resume
    analyses.json                every failure analysis (analyze_failures), reused free when asked again
    analysis_answers.jsonl       the sub-LM's answers to the analyses' prompts, replayed on resume
    sub_lm_answers.jsonl         the answers of the agent's llm_query / llm_query_batched, replayed on resume
    result.json                  the final choice, once compile() has returned
    stopped.json                 why the last compile() stopped with an error (what it raised), until one starts again
    run.png                      the picture of the run (rlmoptimizer.report.plot)

May import: the standard library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LOCK = ".lock"
HOLDER = "holder.json"
MANIFEST = "manifest.json"
LEDGER = "ledger.json"
USAGE = "usage.json"
ESTIMATE = "estimate.json"
NOTES = "notes.json"
CANDIDATES = "candidates.json"
GEPA_RUNS = "gepa_runs.json"
GEPA_REFLECTIONS = "gepa_reflections.jsonl"
PROPOSALS = "proposals.jsonl"
ANALYSES = "analyses.json"
ANALYSIS_ANSWERS = "analysis_answers.jsonl"
SUB_LM_ANSWERS = "sub_lm_answers.jsonl"
RESULT = "result.json"
STOPPED = "stopped.json"
PENDING_REPLY = "pending_reply.json"
PICTURE = "run.png"


@dataclass(frozen=True)
class Numbered:
    """A folder of numbered JSON files, ``<folder>/<prefix>-<number>.json`` (``turns/turn-0001.json``)."""

    folder: str
    prefix: str

    def stem(self, number: int) -> str:
        """The name of ``number`` without ``.json``, four digits at least (``turn-0001``; a run's id)."""
        return f"{self.prefix}-{number:04d}"

    def name(self, number: int) -> str:
        """The file name of ``number`` (``turn-0001.json``)."""
        return f"{self.stem(number)}.json"

    def number(self, stem: str) -> int | None:
        """The number in a file's stem (``turn-0012`` -> 12), or None when the stem is not one of these files."""
        head, _, digits = stem.rpartition("-")
        return int(digits) if head == self.prefix and re.fullmatch(r"[0-9]+", digits) else None


RUNS = Numbered("runs", "run")
PROMPT_VERSIONS = Numbered("prompts", "v")
TURNS = Numbered("turns", "turn")


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory's files. Names only: nothing is read, created or written here."""

    directory: Path

    def __init__(self, directory: str | Path) -> None:
        object.__setattr__(self, "directory", Path(directory))

    @property
    def lock(self) -> Path:
        return self.directory / LOCK

    @property
    def holder(self) -> Path:
        return self.directory / HOLDER

    @property
    def manifest(self) -> Path:
        return self.directory / MANIFEST

    @property
    def pending_reply(self) -> Path:
        return self.directory / PENDING_REPLY

    @property
    def ledger(self) -> Path:
        return self.directory / LEDGER

    @property
    def usage(self) -> Path:
        return self.directory / USAGE

    @property
    def estimate(self) -> Path:
        return self.directory / ESTIMATE

    @property
    def notes(self) -> Path:
        return self.directory / NOTES

    @property
    def candidates(self) -> Path:
        return self.directory / CANDIDATES

    @property
    def analyses(self) -> Path:
        return self.directory / ANALYSES

    @property
    def gepa_runs(self) -> Path:
        return self.directory / GEPA_RUNS

    @property
    def result(self) -> Path:
        return self.directory / RESULT

    @property
    def stopped(self) -> Path:
        return self.directory / STOPPED

    @property
    def picture(self) -> Path:
        return self.directory / PICTURE

    # -- numbered files -------------------------------------------------------------------------
    def folder(self, kind: Numbered) -> Path:
        """The folder of ``kind`` (``runs/``, ``prompts/``, ``turns/``)."""
        return self.directory / kind.folder

    def numbered_path(self, kind: Numbered, number: int) -> Path:
        return self.folder(kind) / kind.name(number)

    def numbered(self, kind: Numbered) -> list[tuple[int, Path]]:
        """``(number, path)`` of every file of ``kind``, in number order (other files in its folder are left out)."""
        found = []
        for path in self.folder(kind).glob(f"{kind.prefix}-*.json"):
            number = kind.number(path.stem)
            if number is not None:
                found.append((number, path))
        return sorted(found)

    def run(self, run_id: str) -> Path:
        """The file of the evaluation run ``run_id`` (``run-0001`` -> ``runs/run-0001.json``)."""
        return self.folder(RUNS) / f"{run_id}.json"

    def pending_log(self, token: str) -> Path:
        """The in-flight log of one evaluation, named by a unique ``token``."""
        return self.folder(RUNS) / f"pending-{token}.jsonl"

    def pending_logs(self) -> list[Path]:
        """Every in-flight log, in name order."""
        return sorted(self.folder(RUNS).glob("pending-*.jsonl"))
