"""RL Workbench inference engine, trainer and OpenAI-compatible server."""
