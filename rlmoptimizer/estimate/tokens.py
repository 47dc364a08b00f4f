"""Counting tokens the way an LM will bill them, before it is called.

:class:`TokenCounter` counts for one LM: with the LM's own ``count_tokens(text)`` when it has one (the offline LMs of
:mod:`rlmoptimizer.testing` count words, as their usage reports), else with litellm's tokenizer for the LM's model
name (``litellm.token_counter``: OpenAI's tokenizers, and the ones litellm ships for other families, all offline),
else characters / 4 (:data:`CHARS_PER_TOKEN`, English prose on common tokenizers). A model litellm would fetch a
tokenizer for from the network (Llama 2/3, Cohere Command R) is counted with litellm's default tokenizer instead:
an estimate never reaches the network.

May import what :mod:`rlmoptimizer.estimate` may.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from rlmoptimizer.usage import import_litellm

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4.0
"""The fallback: characters per token of English prose on common tokenizers."""

PLACEHOLDER_WORD = "word"
"""A placeholder text of ``n`` tokens is this word ``n`` times: one token each on common tokenizers, one word."""

# Names for which litellm downloads a tokenizer from the Hugging Face hub (its own rule, by substring).
_FETCHED_TOKENIZERS = ("llama-2", "llama-3", "replicate", "command-r")


def model_name(lm: Any) -> str:
    """The name an LM reports its calls under (``dspy.LM.model``), or its class name."""
    name = getattr(lm, "model", None)
    return name if isinstance(name, str) and name else type(lm).__name__


def placeholder(tokens: float) -> str:
    """A text of about ``tokens`` tokens."""
    return " ".join([PLACEHOLDER_WORD] * max(0, round(tokens)))


@lru_cache(maxsize=1024)
def _litellm_count(model: str, text: str) -> int | None:
    try:
        return int(import_litellm().token_counter(model=model, text=text))
    except Exception:  # noqa: BLE001 - any failure of the tokenizer falls back to characters
        return None


class TokenCounter:
    """Counts tokens for one LM (see the module docstring); ``how`` says which way, for the estimate's assumptions."""

    def __init__(self, lm: Any) -> None:
        self.model = model_name(lm)
        own = getattr(lm, "count_tokens", None)
        self._own = own if callable(own) else None
        if self._own is not None:
            self.how = f"{self.model}'s own count_tokens()"
            self._litellm_model: str | None = None
            return
        fetched = any(part in self.model.lower() for part in _FETCHED_TOKENIZERS)
        self._litellm_model = "" if fetched else self.model
        if _litellm_count(self._litellm_model, "hello world") is None:
            self._litellm_model = None
            self.how = f"characters / {CHARS_PER_TOKEN:g} for {self.model} (litellm could not count)"
        elif fetched:
            self.how = f"litellm's default tokenizer for {self.model} (its own would be downloaded)"
        else:
            self.how = f"litellm's tokenizer for {self.model}"

    def text(self, text: Any) -> int:
        """Tokens of ``text``."""
        text = text if isinstance(text, str) else str(text)
        if not text:
            return 0
        if self._own is not None:
            try:
                return int(self._own(text))
            except Exception:  # noqa: BLE001 - a counter that fails: characters instead
                pass
        if self._litellm_model is not None:
            counted = _litellm_count(self._litellm_model, text)
            if counted is not None:
                return counted
        return round(len(text) / CHARS_PER_TOKEN)

    def messages(self, messages: Iterable[dict[str, Any]]) -> int:
        """Tokens of a request: the content of each message (text parts of a multi-part content included)."""
        total = 0
        for message in messages:
            content = message.get("content", "")
            if isinstance(content, list):
                content = "\n".join(
                    str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
                )
            total += self.text(content)
        return total
