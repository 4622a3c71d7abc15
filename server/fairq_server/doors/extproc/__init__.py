"""fairq as Envoy's external processor: the endpoint picker of a proxy that carries the bytes.

See ``docs/envoy.md`` and ``docs/design/extproc.md``. :mod:`.door` is the door itself,
:mod:`.carrier` how a carried request's attempt looks to the dispatcher, :mod:`.bootstrap`
the Envoy configuration ``fairq envoy bootstrap`` prints.
"""
