"""fairq's configuration: the file's sections, read, checked and cross-checked in one pass.

:mod:`.schema` holds the top-level :class:`~fairq_server.config.schema.Config`; each section
is a module beside it; :mod:`.loader` reads a TOML file into a ``Config`` and names the key
whenever a value is wrong.
"""
