"""The optimizer agent: an RLM (a ``dspy.Module`` owning its turn loop) in the sandbox, its root-LM calls, its
instructions, its tools, and the default loop as a policy with a pilot that runs it.

Rooms:
    services.py         one compile's services (runs, ledger, working program, notes, usage, observer, sub LM,
                        attempt) as one typed value handed to the tools and the agent; how turns run
                        (``TurnSettings``) and what a long run adds to them (``TurnAids``)
    agent.py            :class:`OptimizerAgent`: the turn loop, budgeted sub-LM calls, tolerant turns, per-turn
                        events, the pilot's assist rule, the stop request, resume
    policy.py           the default loop as a pure function: the loop's state in, the next typed action out
    pilot.py            runs the policy's actions through the tools: ``next_phase()``, the assist rule's step, the
                        ``"loop"`` mode without an agent
    root_lm.py          what the root LM is sent per turn: multi-turn rendering, the Responses-API chain
    prompts.py          the agent's instructions and task brief, module constants with checked placeholders
    tools.py            the functions the agent calls (evaluate_program, run_data, update_prompt, next_phase, ...),
                        the moves among them (``rlmoptimizer.moves``, a room of its own below this one)
    working_program.py  the program the tools edit and its prompt versions
    stop.py             the stop request the loop checks after each turn; the stop after the spending cap, or as
                        soon as no turn can change the result
    bounded_context.py  the view of the REPL history that fits the root LM's window (learning its tokenizer's
                        characters per token from reported usage), context refusals
    window.py           the smallest root context window a run works in, checked before any LM call
    state.py            the state block closing every request, and the turn aids of a long run
    _dspy.py            every dspy name this wing uses beyond ``import dspy``, checked at import

May import: dspy (private names only through ``_dspy``), ``rlmoptimizer.moves``, ``.evaluation``, ``.storage`` (the
agent's notes), and the flat rooms below (``budget``, ``errors``, ``events``, ``fingerprint``, ``records``,
``dspy_contract``, ``usage``). Nothing above it (optimizer, selection, display, inputs); not the sandbox either: the
sandbox reaches the agent only as the interpreter factory the optimizer hands over.
"""
