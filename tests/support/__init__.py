"""Shared test fixtures: offline LMs (``fakes``), the ticket-routing task (``tickets``), a small QA task
(``qa``) and a fake OpenAI Responses server (``responses_server``). Tests and benchmarks import these,
never the offline demo ``example.py``."""
