"""fairq's configuration: one schema, one loader, one pass of cross-checks; the bottom layer.

The file's sections, each a frozen dataclass in a module of its own, every field declared once
with its type, default, bounds and help (:mod:`.fields` holds the vocabulary)::

    schema       Config: the whole file, its top-level keys and which section is where
    scheduler    [scheduler]: plugin names (closed sets), timing, caps, prefix grouping
    preempt      [scheduler.preempt]
    tiers        [[tiers]]
    backends     [[backends]], [admin], and the rules of a backend definition (the Admin
                 API checks a registration by the same rules)
    doors        [limits] (RequestBounds), [tls], [http]
    identity     [[keys]], [jwt]
    teams        [[teams]]
    entitlement  [[quotas]], [[budgets]]
    store        [store], [prices.<model>]
    cluster      [cluster]
    console      [console]

:mod:`.loader` reads a TOML file into a ``Config``: pydantic validates every value against its
field (types exactly TOML's, bounds, unknown keys refused), then what the file implies across
sections is checked (backend URLs, key digests, teams, quotas, prices, JWT); every error names
the key. :mod:`.reference` renders the schema as ``docs/configuration.md``. Design, measured
cost and the alternatives weighed: ``docs/design/config.md``.

This package imports nothing of fairq but :mod:`fairq_server.errors` and
:mod:`fairq_server.names`: the backend kinds and the scheduling plugins are named here as
closed sets (tests hold them equal to the registries), and the plugins' options tables are
checked where the plugins are built (:func:`fairq_server.scheduling.policies.check_policies`).
"""
