"""Alembic environment: migrates the connection handed over by `db.migrate`."""

from typing import Any

from alembic import context
from sqlalchemy.types import TypeDecorator

from db.models import Base
from db.session import make_engine

target_metadata = Base.metadata


def render_item(kind: str, obj: Any, autogen_context: Any) -> str | bool:
    """Render our column types as their plain SQLAlchemy implementation, so that revisions
    never import project code."""
    if kind == "type" and isinstance(obj, TypeDecorator):
        return f"sa.{obj.impl_instance!r}"
    return False


def run_migrations(connection: Any) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; pass a database URL")

connection = context.config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
else:
    engine = make_engine(context.config.get_main_option("sqlalchemy.url") or None)
    with engine.begin() as new_connection:
        run_migrations(new_connection)
    engine.dispose()
