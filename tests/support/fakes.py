"""Test fakes: the package's offline LMs (kept here too so tests import them by a short name)."""

from rlmoptimizer.testing import FunctionLM, ScriptedLM, last_user_text, scripted_agent, system_text

__all__ = ["FunctionLM", "ScriptedLM", "last_user_text", "scripted_agent", "system_text"]
