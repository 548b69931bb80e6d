"""agui-hub: a production relay for the AG-UI protocol.

Layers, each importing only the ones above it in this list:

* :mod:`agui_hub.errors` - the exception tree;
* :mod:`agui_hub.events` - AG-UI 1.0 event and message models;
* :mod:`agui_hub.sequence`, :mod:`agui_hub.chunks`, :mod:`agui_hub.reducer` -
  pure protocol logic: sequence rules, chunk expansion, thread state;
* :mod:`agui_hub.codec` - msgpack and JSON encodings;
* :mod:`agui_hub.store` with :mod:`agui_hub.memory_store` and
  :mod:`agui_hub.redis_store` - thread streams: offsets, epochs, retention,
  gap-free live subscriptions.

The protocol layers (everything above the store) import no asyncio, websockets
or redis.
"""

__version__ = "0.1.0"
