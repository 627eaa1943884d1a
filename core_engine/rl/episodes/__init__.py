"""Multi-turn episodes: operator-registered environments with tools, run in a sandbox."""
