"""The gateway: fan-out, checked writes and the servers.

* :mod:`~agui_hub.gateway.fanout` - ``Hub`` and one ``ThreadChannel`` per live
  thread: catch-up then live with no gap, each event encoded once per
  encoding;
* :mod:`~agui_hub.gateway.writer` - ``ThreadWriter``: validate, verify the
  sequence, append (the one write path);
* :mod:`~agui_hub.gateway.server` - ``Gateway``: the WebSocket server's
  lifecycle, with one module per concern beside it:
  :mod:`~agui_hub.gateway.admission` (the handshake's checks),
  :mod:`~agui_hub.gateway.connection` (a socket's queue and writes),
  :mod:`~agui_hub.gateway.commands` (its commands),
  :mod:`~agui_hub.gateway.http_routes` and
  :mod:`~agui_hub.gateway.static_files` (plain HTTP on the same port),
  :mod:`~agui_hub.gateway.run_access` (runs behind the caller's grants),
  :mod:`~agui_hub.gateway.watchers` and :mod:`~agui_hub.gateway.reporting`
  (the store, credentials, counters and summaries);
* :mod:`~agui_hub.gateway.web` - the HTTP/SSE listener;
* :mod:`~agui_hub.gateway.auth` - identities, grants, tokens (sans I/O);
* :mod:`~agui_hub.gateway.config` - ``GatewayConfig``, every setting;
* :mod:`~agui_hub.gateway.metrics` and :mod:`~agui_hub.gateway.workers` -
  Prometheus figures, ``serve --workers N``.

To run a gateway in your own process::

    from agui_hub.gateway.server import Gateway
    from agui_hub.gateway.config import GatewayConfig
"""
