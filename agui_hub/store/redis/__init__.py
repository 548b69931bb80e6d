"""The Redis store (``redis://``, ``rediss://``, ``redis+cluster://``,
``rediss+cluster://``): one Redis stream per thread, appended by Lua scripts
(``lua/*.lua``), tailed by one live reader per process.

:mod:`~agui_hub.store.redis.store` holds :class:`RedisStore` and says which
module owns which part; :mod:`~agui_hub.store.redis.cluster` and
:mod:`~agui_hub.store.redis.cluster_live` hold what differs on Redis Cluster.
Everything here needs the ``redis`` extra; pick a store with
:func:`agui_hub.store.open_store` rather than importing this package.
"""

from .keys import stream_key
from .store import RedisStore

__all__ = ["RedisStore", "stream_key"]
