"""The failure analyses of a compile (``analysis-N``), kept in the run directory.

``analyses.json`` holds ``{"analyses": [record, ...], "latest": id}``, each record what
:meth:`FailureAnalysis.to_record <rlmoptimizer.moves.failures.FailureAnalysis.to_record>` gives, rewritten
atomically whenever an analysis is made or asked again: a resumed compile reuses them for nothing, and a proposal
made for one of their groups names it in its lineage.

May import: ``rlmoptimizer.storage.files``, ``.layout`` and the standard library.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rlmoptimizer.storage.files import WriteFailed, atomic_write_json
from rlmoptimizer.storage.layout import RunLayout

logger = logging.getLogger(__name__)


def read_analyses(directory: str | Path | None) -> tuple[list[dict[str, Any]], str | None]:
    """``(records, latest id)`` as kept in ``directory``; empty when there is no file or it cannot be read."""
    if directory is None:
        return [], None
    try:
        data = json.loads(RunLayout(directory).analyses.read_bytes().decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return [], None
    if not isinstance(data, dict) or not isinstance(data.get("analyses"), list):
        return [], None
    records = [entry for entry in data["analyses"] if isinstance(entry, dict)]
    latest = data.get("latest")
    return records, latest if isinstance(latest, str) else None


def write_analyses(directory: str | Path | None, records: list[dict[str, Any]], latest: str | None) -> None:
    if directory is None:
        return
    try:
        atomic_write_json(RunLayout(directory).analyses, {"analyses": records, "latest": latest}, durable=False)
    except WriteFailed as exc:  # the analyses still work in this process (a resume asks again)
        logger.warning("could not keep the failure analyses in %s: %s", directory, exc)
