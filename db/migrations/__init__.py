"""The Alembic migrations of the schema: `env.py`, which migrates the connection `db.migrate`
hands over, and the revisions (`versions`), applied by `rlwb db upgrade`."""
