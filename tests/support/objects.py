"""Examples holding objects a user's data may hold (images, bytes, datetimes, a class of the user's own without
``__eq__`` or a stable repr), for checking that a resume recognises the same examples in a new process."""

from __future__ import annotations

import datetime

import dspy

from support.tickets import make_splits


class Attachment:
    """A user's own class, without __eq__ or a useful repr (its default repr holds a memory address)."""

    def __init__(self, name: str, tags: set[str]):
        self.name = name
        self.tags = tags


def object_splits(attachment_name: str = "receipt.pdf"):
    """The ticket splits, each example also holding objects (not inputs: the program never sees them)."""
    trainset, valset = make_splits()

    def enrich(examples, split):
        return [
            dspy.Example(
                **ex,
                image=dspy.Image("https://example.com/ticket.png"),
                raw=f"{split}{i}".encode(),
                received=datetime.datetime(2026, 1, 1 + i),
                attachment=Attachment(attachment_name, {"a", "b", "c"}),
            ).with_inputs("ticket")
            for i, ex in enumerate(examples)
        ]

    return enrich(trainset, "train"), enrich(valset, "val")
