"""agui-hub: a production relay for the AG-UI protocol.

The package is layered; each folder imports only from the ones below it
(tests/test_layers.py holds it to that with import-linter):

* :mod:`agui_hub.cli` - the ``agui-hub`` command line;
* :mod:`agui_hub.client` - Python APIs for front ends and agents
  (``HubClient``, ``Publisher``) and the terminal transcript;
* :mod:`agui_hub.gateway` - fan-out (channels), the checked write path,
  auth, config, metrics and the WebSocket and HTTP/SSE servers;
* :mod:`agui_hub.bridge` - runs of existing AG-UI agents over HTTP/SSE;
* :mod:`agui_hub.store` - thread streams: the contract, the memory store,
  Redis and Redis Cluster, ``open_store``;
* :mod:`agui_hub.wire` - the hub's protocol v1, sans I/O: frames, codecs,
  offsets, SSE;
* :mod:`agui_hub.agui` - AG-UI 1.0 itself, pure: events, sequence rules,
  chunks, JSON Patch, the reducer;
* :mod:`agui_hub.errors` - the one exception tree, under all of them.

``agui`` and ``wire`` import no asyncio, websockets or redis. Nothing but the
Redis stores imports redis, which is the ``redis`` extra. docs/architecture.md
walks a publish and a subscribe through the layers.

The names most programs need are importable from here::

    from agui_hub import HubClient, Publisher, EventInput, open_store
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .version import __version__

# Imported on first use, so that ``import agui_hub.agui.events`` loads no
# client, server or store.
_PUBLIC = {
    "HubClient": "agui_hub.client",
    "Publisher": "agui_hub.client",
    "Position": "agui_hub.client",
    "ThreadEvent": "agui_hub.client",
    "Subscribed": "agui_hub.client",
    "Snapshot": "agui_hub.client",
    "EventInput": "agui_hub.store",
    "Retention": "agui_hub.store",
    "START": "agui_hub.store",
    "open_store": "agui_hub.store",
    "AguiHubError": "agui_hub.errors",
    "RunInfo": "agui_hub.agui.runs",
    "RunTree": "agui_hub.agui.runs",
}

__all__ = [
    "START",
    "AguiHubError",
    "EventInput",
    "HubClient",
    "Position",
    "Publisher",
    "Retention",
    "RunInfo",
    "RunTree",
    "Snapshot",
    "Subscribed",
    "ThreadEvent",
    "__version__",
    "open_store",
]

if TYPE_CHECKING:
    from .agui.runs import RunInfo, RunTree
    from .client import HubClient, Position, Publisher, Snapshot, Subscribed, ThreadEvent
    from .errors import AguiHubError
    from .store import START, EventInput, Retention, open_store


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'agui_hub' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
