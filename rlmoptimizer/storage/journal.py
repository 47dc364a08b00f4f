"""Everything a compile() paid for, on disk as soon as it exists: the manifest, the ledger, the usage, the agent's
turns and prompt versions, and the result (the files of a run directory are named in
:mod:`rlmoptimizer.storage.layout`; the runs themselves are written by
:class:`~rlmoptimizer.storage.run_store.RunStore`).

A directory whose manifest differs from the current compile() is refused (RunDirectoryMismatchError)
rather than mixed in; so is one whose stored scores came from another evaluation LM, unless the caller
allows it. A changed ``pass_threshold`` is not a refusal: ``passed`` is recomputed from the stored scores.

One directory belongs to one live compile(): :class:`RunDirectoryLock` holds an OS lock on ``.lock`` for
as long as the compile runs, so a second compile() on the same directory (another process, or this one) is
refused at once (RunDirectoryInUseError). The OS drops the lock when its holder dies, even by SIGKILL, so
a dead holder never blocks a resume.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import RunDirectoryMismatchError
from rlmoptimizer.events import AgentReplied, AgentTurn, EvaluationFinished, Event, PromptUpdated, SubLMAnswered
from rlmoptimizer.fingerprint import HELD, diff_fingerprints
from rlmoptimizer.records import jsonable
from rlmoptimizer.storage.files import BackgroundSync, WriteFailed, atomic_write_json, not_readable_here
from rlmoptimizer.storage.identity import describe_differences
from rlmoptimizer.storage.layout import PROMPT_VERSIONS, TURNS, Numbered, RunLayout
from rlmoptimizer.storage.lock import READ_ONLY_ERRNOS

logger = logging.getLogger(__name__)


MANIFEST_KEYS_THAT_MUST_MATCH = ("program", "trainset", "valset", "metric", "budget_limit", "budget_mode")
"""What a run directory belongs to. ``budget_mode`` (``{"max_iterations": N}`` or ``{"max_metric_calls": B}``) says
how its budget counts: the same limit means other work under the other mode (baselines free or paid)."""


def _what_differs(different: list[str], stored: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """The keys of :data:`MANIFEST_KEYS_THAT_MUST_MATCH` that differ, as a user says them (the budget's two: budget),
    without the budget when the data changed under the same setting: its numbers follow from the data's size."""
    same_setting = "budget_mode" not in different or (
        stored.get("budget_setting") is not None and stored.get("budget_setting") == manifest.get("budget_setting")
    )
    if same_setting and {"trainset", "valset"} & set(different):
        different = [key for key in different if not key.startswith("budget_")]
    return list(dict.fromkeys("budget" if key.startswith("budget_") else key for key in different))


def _structure_changes(stored: dict[str, Any], manifest: dict[str, Any], different: list[str]) -> str:
    """What changed in the program's structure (steps, fields, demos), when both manifests record it."""
    before, after = stored.get("program_structure"), manifest.get("program_structure")
    if "program" not in different or not isinstance(before, dict) or not isinstance(after, dict):
        return ""
    changes = diff_fingerprints(before, after)
    return (
        f" What changed in the program: {'; '.join(changes[:8])}{' ...' if len(changes) > 8 else ''}."
        if changes
        else ""
    )


def _budget_hint(stored: dict[str, Any], expected: dict[str, Any]) -> str:
    """What the stored budget was set with, and the argument that resumes it (empty when it is not known)."""
    old, new = stored.get("budget_mode"), expected.get("budget_mode")
    if not isinstance(old, dict) or len(old) != 1 or old == new:
        return ""
    ((name, value),) = old.items()
    now = ", ".join(f"{k}={v!r}" for k, v in new.items()) if isinstance(new, dict) else "another budget"
    return (
        f" It was run with {name}={value!r}, and this compile() asks for {now}: pass {name}={value!r} instead "
        "to resume it or read it back."
    )


def read_record_file(path: Path) -> dict[str, Any]:
    """A JSON object the run directory depends on (the manifest, the ledger, a turn, a prompt version), or
    :class:`RunDirectoryMismatchError` naming the file when it cannot be read as one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        why = None if isinstance(data, dict) else f"it holds a JSON {type(data).__name__}, not an object"
    except PermissionError as exc:  # not damaged: another user's file
        raise not_readable_here(path, exc) from None
    except (OSError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        raise RunDirectoryMismatchError(
            f"{path} cannot be read ({why}): the run directory it belongs to cannot be resumed safely without it. "
            "Restore the file (e.g. from a backup), or use a new run_storage_dir to start over."
        )
    return data


class RunJournal:
    """Numbered JSON files for turns and prompt versions, plus the ledger and the manifest.

    Turns and prompt versions are written on the caller's thread without waiting for the disk (the agent's
    turn goes on), then fsynced on one background thread; :meth:`flush` (called by :meth:`write_result`)
    waits for those syncs. As an observer (:meth:`on_event`) it writes each turn, each prompt version, and
    the ledger once per evaluation and once per turn."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.layout = RunLayout(self.directory)
        for kind in (TURNS, PROMPT_VERSIONS):  # only when missing: reading back a finished run writes nothing
            if not self.layout.folder(kind).is_dir():
                self.layout.folder(kind).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._last_number: dict[Numbered, int] = {}  # per kind, read from disk once
        self._ledger_spent = -1  # the units spent (all kinds) of the ledger written last
        self._sync = BackgroundSync("journal")

    def on_event(self, event: Event) -> None:
        if isinstance(event, AgentReplied):  # (when: a resume knows which GEPA runs the replayed turn started)
            atomic_write_json(self.layout.pending_reply, {**event.reply, "kept_at": time.time()})
        elif isinstance(event, AgentTurn):
            self.write_turn(event.turn)
            self.layout.pending_reply.unlink(missing_ok=True)  # (the turn is kept: its reply with it)
            self.write_ledger(event.budget)
        elif isinstance(event, PromptUpdated):
            self.write_prompt_version(event.version)
        elif isinstance(event, (EvaluationFinished, SubLMAnswered)):
            self.write_ledger(event.budget)

    # -- manifest ---------------------------------------------------------------------------------
    def open_manifest(
        self,
        manifest: dict[str, Any],
        *,
        allow_eval_lm_change: bool = False,
        allow_program_change: bool = False,
        hints: Mapping[str, Callable[[Any], str]] | None = None,
    ) -> bool:
        """Write the manifest of a new directory, or check it against an existing one. ``hints``: for a setting
        that differs, what to tell the user about it, from its stored value (e.g. the metric's own hint).

        Returns True when the directory already held this same compile (a resume). ``manifest["eval_lm"]``
        must equal the stored one (else RunDirectoryMismatchError naming each differing setting, unless
        ``allow_eval_lm_change``), and so must ``manifest["program_code"]`` where both record it (else the error
        names the classes whose code changed, unless ``allow_program_change``); a changed ``pass_threshold`` is
        recorded and logged (the caller recomputes ``passed``). Nothing is written when nothing changed."""
        path = self.layout.manifest
        if not path.exists():
            atomic_write_json(path, manifest)
            return False
        stored = read_record_file(path)
        different = [key for key in MANIFEST_KEYS_THAT_MUST_MATCH if stored.get(key) != manifest.get(key)]
        if different:
            told = _what_differs(different, stored, manifest)
            raise RunDirectoryMismatchError(
                f"run_storage_dir {str(self.directory)!r} holds a run of a different "
                f"{', '.join(told)}; it cannot be resumed with this compile(). Use a new run_storage_dir "
                f"(or delete this one) to start over.{_budget_hint(stored, manifest) if 'budget' in told else ''}"
                + "".join(
                    f" {hints[key](stored[key])}" for key in different if key in (hints or {}) and stored.get(key)
                )
                + _structure_changes(stored, manifest, different)
            )
        self._check_starting_instructions(stored, manifest)
        updates = self._check_settings(stored, manifest)
        stored_attempt, attempt = stored.get("attempt"), manifest.get("attempt")
        if stored_attempt is not None and attempt is not None and stored_attempt != attempt:
            raise RunDirectoryMismatchError(
                f"run_storage_dir {str(self.directory)!r} holds attempt={stored_attempt} and this compile() is "
                f"attempt={attempt}: one directory holds one attempt (resuming would mix the two attempts' agent "
                f"work{', and a finished attempt is only read back' if self.layout.result.exists() else ''}). Give "
                f"attempt={attempt} its own run_storage_dir, or pass attempt={stored_attempt} to resume this one "
                "(dspy.GEPA's seed= is attempt= here)."
            )
        updates.update(self._check_eval_lm(stored, manifest["eval_lm"], allow_eval_lm_change))
        if stored_attempt is None and attempt is not None:  # written before the attempt was recorded
            updates["attempt"] = attempt
        updates.update(self._check_program_code(stored, manifest.get("program_code"), allow_program_change))
        old_threshold, new_threshold = stored.get("pass_threshold"), manifest.get("pass_threshold")
        if old_threshold != new_threshold:
            logger.warning(
                "pass_threshold changed from %s to %s since this run directory was written: 'passed' of every "
                "stored example is recomputed from its stored score (score >= %s); no LM call is needed.",
                old_threshold,
                new_threshold,
                new_threshold,
            )
            updates["pass_threshold"] = new_threshold
        if updates:
            try:
                atomic_write_json(path, {**stored, **updates})
            except WriteFailed as exc:
                if exc.error.errno not in READ_ONLY_ERRNOS:
                    raise
                logger.warning("Could not record the change in %s (%s); the directory is read-only.", path, exc.error)
        return True

    def _check_starting_instructions(self, stored: dict[str, Any], manifest: dict[str, Any]) -> None:
        """The program's instructions must be those the run started from (a directory written before they were
        recorded is not checked): its baseline, its floor and every comparison are of those."""
        old, new = stored.get("starting_instructions"), manifest.get("starting_instructions")
        if old is None or new is None or old == new:
            return
        steps = sorted(step for step in set(old) | set(new) if old.get(step) != new.get(step))
        raise RunDirectoryMismatchError(
            f"run_storage_dir {str(self.directory)!r} holds a run that started from other instructions: those of "
            f"step(s) {', '.join(repr(s) for s in steps)} differ from the program passed now (its baseline, the "
            "result's floor and every comparison are of the instructions it started from). To resume it, pass the "
            "program as it was then; to optimize from the new instructions (an optimized program included), use a "
            "new run_storage_dir."
        )

    def _check_settings(self, stored: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
        """The settings that decide what a run does must be those it was made with: a finished run read back under
        other ones would silently ignore them (demos switched off, yet the result holds demos), an unfinished one
        would go on under other rules. A setting the directory was written without is not checked; an unfinished
        run resumed goes on under this compile's, so they are recorded (the manifest's update)."""
        old, new = stored.get("settings") or {}, manifest.get("settings") or {}
        changed = sorted(name for name in set(old) & set(new) if old[name] != new[name])
        if not changed:
            missing = {name: value for name, value in new.items() if name not in old}
            return {"settings": {**missing, **old}} if missing and not self.layout.result.exists() else {}
        was = ", ".join(f"{name}={old[name]!r}" for name in changed)
        now = ", ".join(f"{name}={new[name]!r}" for name in changed)
        finished = self.layout.result.exists()
        raise RunDirectoryMismatchError(
            f"run_storage_dir {str(self.directory)!r} holds a run made with {was}, and this compile() passes {now}: "
            + (
                "the run is finished, and reading it back would return its result as it was made, ignoring the new "
                "setting. "
                if finished
                else "resuming would go on under other rules than it started with. "
            )
            + f"Pass {was} to {'read it back' if finished else 'resume it'}, or use a new run_storage_dir (or "
            "delete this one) to optimize with the new setting."
        )

    def _check_eval_lm(self, stored: dict[str, Any], identity: dict[str, Any], allow_change: bool) -> dict[str, Any]:
        """The evaluation LM (and adapter) must be the one that made the stored scores. A manifest that names no
        adapter was made under dspy's default one (the identity left it out), or by a version that did not record
        the adapter: the first is assumed, and a refusal under another adapter says how to resume if it is the same."""
        old = stored.get("eval_lm") or {}  # a manifest without one names every setting as changed
        if old == identity:
            return {}
        unnamed = bool(old) and "adapter" not in old
        if unnamed:
            old = {**old, "adapter": None}
            if old == identity:
                return {"eval_lm": identity}
        compared = identity
        lines = describe_differences(old, compared)
        listed = "\n".join(f"  - {line}" for line in lines)
        if not allow_change:
            raise RunDirectoryMismatchError(
                f"run_storage_dir {str(self.directory)!r} holds scores from a different evaluation LM (or adapter) "
                f"than this compile() uses:\n{listed}\nResuming would reuse the old LM's scores as if the new one had "
                "produced them. To start fresh, pass a new run_storage_dir (or move or delete this one); to resume "
                "with the stored scores anyway, pass RLMDocstringOptimizer(..., allow_eval_lm_change=True)."
                + (
                    " The directory names no adapter: it was made under dspy's default one, or by a version of "
                    "rlmoptimizer that did not record the adapter; if it was made under this same adapter, "
                    "allow_eval_lm_change=True resumes it."
                    if unnamed and identity.get("adapter") is not None
                    else ""
                )
            )
        logger.warning(
            "The evaluation LM differs from the one that produced the stored scores in %s (allowed by "
            "allow_eval_lm_change=True); the stored scores are reused:\n%s",
            self.directory,
            listed,
        )
        earlier = list(stored.get("earlier_eval_lms", [])) + [old]
        return {"eval_lm": identity, "earlier_eval_lms": earlier}

    def _check_program_code(self, stored: dict[str, Any], code: Any, allow_change: bool) -> dict[str, Any]:
        old = stored.get("program_code")
        if code is None or old == code:
            return {}
        if not isinstance(old, dict) or not isinstance(old.get("classes"), dict):  # written before it was recorded
            return {"program_code": code}
        if not old.get("held"):  # written before the functions modules hold were recorded: compared without them
            kept = {name: digest for name, digest in code["classes"].items() if not name.endswith(HELD)}
            if old.get("python") == code["python"] and old["classes"] == kept:
                return {"program_code": code}
        if old.get("python") != code["python"]:
            what = (
                f"was written under Python {old.get('python')} and this is Python {code['python']}: bytecode "
                "differs between versions, so whether your program's code changed cannot be told"
            )
            changed = "your program"
        else:
            names = sorted(
                name
                for name in {*old["classes"], *code["classes"]}
                if old["classes"].get(name) != code["classes"].get(name)
            )
            changed = "the code of " + ", ".join(names)
            what = (
                f"holds what your program answered before its code changed ({changed}: its forward, another method "
                "or a function it holds)"
            )
        if not allow_change:
            raise RunDirectoryMismatchError(
                f"run_storage_dir {str(self.directory)!r} {what}. Resuming would reuse the old code's answers and "
                "scores as if the new code had given them. To start fresh, pass a new run_storage_dir (or move or "
                "delete this one); if the code did not change, or the change alters no answer (a refactor, "
                "logging), pass RLMDocstringOptimizer(..., allow_program_change=True) to resume with the stored "
                "records."
            )
        logger.warning(
            "%s changed since %s was written (allowed by allow_program_change=True); the records of the old code "
            "are reused.",
            changed[0].upper() + changed[1:],
            self.directory,
        )
        return {"program_code": code}

    # -- numbered records -------------------------------------------------------------------------
    def _next_path(self, kind: Numbered) -> Path:
        """The next numbered path (call with the lock held); the directory is listed only the first time."""
        last = self._last_number.get(kind)
        if last is None:
            existing = self.layout.numbered(kind)
            last = existing[-1][0] if existing else 0
        self._last_number[kind] = last + 1
        return self.layout.numbered_path(kind, last + 1)

    def _read_all(self, kind: Numbered) -> list[dict[str, Any]]:
        return [read_record_file(path) for _, path in self.layout.numbered(kind)]

    def _write_numbered(self, kind: Numbered, data: dict[str, Any]) -> None:
        with self._lock:
            path = self._next_path(kind)
            atomic_write_json(path, data, durable=False)
            self._sync.submit(path)

    def flush(self) -> None:
        """Wait until every turn and prompt version written so far is on disk."""
        self._sync.flush()

    def write_turn(self, turn: dict[str, Any]) -> None:
        self._write_numbered(TURNS, turn)

    def turns(self) -> list[dict[str, Any]]:
        return self._read_all(TURNS)

    def pending_reply(self) -> dict[str, Any] | None:
        """The root LM's reply of a turn cut off while its code ran (``pending_reply.json``), or None."""
        if not self.layout.pending_reply.is_file():
            return None
        try:
            reply = read_record_file(self.layout.pending_reply)
        except (OSError, ValueError, RunDirectoryMismatchError):  # unreadable: the root LM is asked again
            return None
        fields = ("iteration", "reasoning", "code")
        if not isinstance(reply, dict) or not all(
            isinstance(reply.get(f), int if f == "iteration" else str) for f in fields
        ):
            return None
        kept_at = reply.get("kept_at")
        when = (
            {"kept_at": float(kept_at)} if isinstance(kept_at, (int, float)) and not isinstance(kept_at, bool) else {}
        )
        return {**{f: reply[f] for f in fields}, **when}

    def write_prompt_version(self, version: dict[str, Any]) -> None:
        self._write_numbered(PROMPT_VERSIONS, version)

    def prompt_versions(self) -> list[dict[str, Any]]:
        return self._read_all(PROMPT_VERSIONS)

    # -- ledger and result ------------------------------------------------------------------------
    def write_ledger(self, snapshot: dict[str, Any]) -> None:
        """``ledger.json``; never an older snapshot over a newer one (spending only grows: threads charging at once
        may hand their snapshots in out of order)."""
        spent = sum(int(amount) for amount in (snapshot.get("spent_by_kind") or {}).values())
        with self._lock:
            if spent < self._ledger_spent:
                return
            self._ledger_spent = spent
            atomic_write_json(self.layout.ledger, snapshot, durable=False)

    def write_usage(self, snapshot: dict[str, Any]) -> None:
        """usage.json: LM calls, tokens and dollars per role so far (rlmoptimizer.usage)."""
        with self._lock:
            atomic_write_json(self.layout.usage, snapshot, durable=False)

    def write_usage_soon(self, snapshot: dict[str, Any]) -> None:
        """:meth:`write_usage` from an evaluation's thread, as its examples finish: a write that fails (a reader
        holding the file on Windows, a full disk) is left to the evaluation's end, which writes it or stops."""
        try:
            self.write_usage(snapshot)
        except WriteFailed as exc:
            logger.debug("usage.json not written after an example: %s", exc)

    def read_usage(self) -> dict[str, Any] | None:
        path = self.layout.usage  # (a damaged one would restart the spending cap from $0: refused, naming it)
        return read_record_file(path) if path.exists() else None

    def write_stop(self, error: BaseException | None) -> None:
        """stopped.json: what the compile raised as it stopped (``error``), for the report; None removes it (a
        compile starts: a stop it ends with is its own). Never raises: the compile already stops with ``error``."""
        try:
            if error is None:
                self.layout.stopped.unlink(missing_ok=True)
                return
            text = str(error)
            stop = {
                "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "error": type(error).__name__,
                "message": text if len(text) <= 2000 else text[:1997] + "...",
            }
            with self._lock:
                atomic_write_json(self.layout.stopped, stop)
        except (OSError, WriteFailed) as exc:
            logger.warning("could not write %s: %s", self.layout.stopped, exc)

    def write_estimate(self, estimate: dict[str, Any]) -> None:
        """estimate.json: what the compile was predicted to cost before its first paid call (written once)."""
        with self._lock:
            atomic_write_json(self.layout.estimate, estimate, durable=False)

    def read_estimate(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.layout.estimate.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_ledger_if_changed(self, snapshot: dict[str, Any]) -> None:
        """:meth:`write_ledger` unless ``ledger.json`` already holds ``snapshot``."""
        if self.read_ledger() != snapshot:
            self.write_ledger(snapshot)

    def read_ledger(self) -> dict[str, Any] | None:
        path = self.layout.ledger
        return read_record_file(path) if path.exists() else None

    def write_result(self, result: dict[str, Any]) -> None:
        """Write ``result.json`` (after every turn and prompt version is on disk), unless it already holds
        ``result``: returning a finished run again writes nothing."""
        self.flush()
        path = self.layout.result
        try:
            unchanged = path.exists() and json.loads(path.read_text(encoding="utf-8")) == jsonable(result)
        except (OSError, ValueError):
            unchanged = False
        if not self.layout.manifest.exists():  # (the lock held the directory, not its files)
            logger.warning(
                "%s has no manifest.json any more (was the directory deleted or emptied while compile() ran?): the "
                "result is returned, but the directory holds only part of the run and cannot be resumed or read back.",
                self.directory,
            )
        if not unchanged:
            atomic_write_json(path, result)
