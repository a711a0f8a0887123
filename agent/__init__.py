"""The CAKE agent harness: a LangGraph loop (propose -> verify -> compile -> test -> profile -> reflect)
with search and LLM proposers. Entry point: `python -m agent.run` (agent/run.py); docs/agent.md.

Nothing heavy is imported here: the CLI must start quickly.
"""
