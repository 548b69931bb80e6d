"""agui-hub: a production relay for the AG-UI protocol.

Layers, each importing only the ones above it in this list:

* :mod:`agui_hub.errors` - the exception tree;
* :mod:`agui_hub.events` - AG-UI 1.0 event and message models;
* :mod:`agui_hub.sequence`, :mod:`agui_hub.chunks`, :mod:`agui_hub.reducer` -
  pure protocol logic: sequence rules, chunk expansion, thread state;
* :mod:`agui_hub.codec` - msgpack and JSON encodings;
* :mod:`agui_hub.store` with :mod:`agui_hub.memory_store` and
  :mod:`agui_hub.redis_store` - thread streams: offsets, epochs, retention,
  gap-free live subscriptions;
* :mod:`agui_hub.protocol` - the gateway's wire protocol, sans I/O;
* :mod:`agui_hub.auth` - identities, grants and tokens (JWT), sans I/O, and
  :mod:`agui_hub.config` - the gateway's settings;
* :mod:`agui_hub.writer` - checked writes: validate, verify the sequence, append;
* :mod:`agui_hub.hub` and :mod:`agui_hub.server` - fan-out and the WebSocket gateway;
* :mod:`agui_hub.client` and :mod:`agui_hub.publisher` - Python APIs for front
  ends and agents;
* :mod:`agui_hub.transcript`, :mod:`agui_hub.demo` and :mod:`agui_hub.cli` -
  the command line.

The protocol layers (events to codec, protocol, auth, transcript, demo) import
no asyncio, websockets or redis. Nothing but the Redis store imports redis, which
is the ``redis`` extra.
"""

__version__ = "0.1.0"
