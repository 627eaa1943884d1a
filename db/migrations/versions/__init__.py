"""The schema's revisions, oldest first (``NNNN_what.py``): each upgrades and downgrades one
step, in plain SQLAlchemy types, importing no project code."""
