"""The agent's notes: numbered, persisted atomically in the run directory, bounded when shown."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlmoptimizer.storage.notes import NotesStore


def test_notes_persist_and_a_new_store_on_the_same_directory_reads_them_back(tmp_path):
    store = NotesStore(tmp_path)
    assert "note 1 kept" in store.add("  baseline fails on chargebacks  ")
    store.add("policy prompt fixed 2 of 3 failures")
    again = NotesStore(tmp_path)  # a resumed run, or a restarted process
    assert [n["text"] for n in again.all()] == ["baseline fails on chargebacks", "policy prompt fixed 2 of 3 failures"]
    assert again.add("third").startswith("note 3 kept")
    assert json.loads((tmp_path / "notes.json").read_text())["notes"][2]["id"] == 3
    assert not list(tmp_path.glob("*.tmp"))


def test_empty_and_oversized_notes_are_refused_with_what_to_do(tmp_path):
    store = NotesStore(tmp_path, max_note_chars=50)
    with pytest.raises(ValueError, match="non-empty"):
        store.add("   ")
    with pytest.raises(ValueError, match="at most 50 characters.*conclusion"):
        store.add("x" * 51)
    assert len(store) == 0 and not (tmp_path / "notes.json").exists()


def test_the_oldest_notes_go_beyond_the_maximum_and_the_reply_says_so(tmp_path):
    store = NotesStore(tmp_path, max_notes=3)
    for i in range(3):
        store.add(f"n{i}")
    assert "oldest 1 dropped" in store.add("n3")
    assert [n["id"] for n in store.all()] == [2, 3, 4]


def test_render_keeps_the_newest_notes_within_its_size():
    store = NotesStore()
    for i in range(30):
        store.add(f"finding number {i} " + "detail " * 10)
    text = store.render(max_chars=500)
    assert len(text) <= 600
    assert "[30] finding number 29" in text and "[1] finding" not in text
    assert "older note(s) not shown here; read_notes() returns them all" in text
    assert store.render().count("\n") == 29


def test_notes_added_from_threads_all_get_distinct_numbers(tmp_path):
    store = NotesStore(tmp_path)
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda i: store.add(f"t{i}"), range(64)))
    ids = [n["id"] for n in NotesStore(tmp_path).all()]
    assert sorted(ids) == list(range(1, 65))


@pytest.mark.parametrize("damage", ["", "{not json", '{"notes": [{"text": "no id"}]}', "[1, 2]"])
def test_a_damaged_notes_file_is_warned_about_and_the_run_goes_on_without_its_notes(tmp_path, caplog, damage):
    """Regression: a damaged notes.json raised a bare JSONDecodeError naming no file, and a finished run could not
    be read back at all. Notes cost nothing: the run goes on without them."""
    NotesStore(tmp_path).add("kept")
    path = next(tmp_path.glob("notes.json"))
    path.write_text(damage, encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        notes = NotesStore(tmp_path)
    assert notes.all() == [] and str(path) in caplog.text and "cannot be read" in caplog.text
    assert (tmp_path / "notes.json.damaged").read_text(encoding="utf-8") == damage  # kept, for a look or a repair
    notes.add("after")
    assert [n["text"] for n in NotesStore(tmp_path).all()] == ["after"]
