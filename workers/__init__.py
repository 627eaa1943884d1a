"""RL Workbench job queue: the Celery app, the GPU worker's jobs, the UI's API and ``rlwb``."""
