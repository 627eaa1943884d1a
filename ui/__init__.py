"""The RL Workbench web UI (Gradio): launch, follow, inspect and compare training jobs.

`ui.app.build_app(services)` builds the app without starting it; `rlwb ui` (`ui.cli`, also
`python -m ui`) serves it.
Importing this package imports neither torch nor the engine.
"""
