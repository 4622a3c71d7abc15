"""Alembic's environment for fairq's store: run on the connection fairq hands it.

fairq runs migrations itself (:func:`fairq_server.store.engine.upgrade`), so there is no
``alembic.ini`` and no offline mode: the connection arrives in ``config.attributes``.
"""

from __future__ import annotations

from alembic import context

from fairq_server.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite alters a table by copying it; later migrations work on both engines.
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
