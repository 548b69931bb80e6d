"""The viewer page and the browser client, served over plain HTTP on the gateway's port.

The files are built from ``js/`` (``npm run build``) into ``agui_hub/static``
and read once when the gateway starts (:func:`load_static`); each request is
answered from memory (:func:`static_response`) in the WebSocket handshake
hook (:class:`~agui_hub.gateway.http_routes.HttpRoutes`), with an ETag so
that a reload costs a 304.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import http
from importlib import resources
from importlib.resources.abc import Traversable

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

__all__ = ["PAGE_POLICY", "STATIC_PATHS", "StaticFile", "load_static", "static_response"]

_JS = "text/javascript; charset=utf-8"
STATIC_PATHS: dict[str, tuple[str, str, bool]] = {
    # path: (file in agui_hub/static, Content-Type, part of the viewer)
    "/": ("index.html", "text/html; charset=utf-8", True),
    "/index.html": ("index.html", "text/html; charset=utf-8", True),
    "/viewer.js": ("viewer.js", _JS, True),
    "/viewer.css": ("viewer.css", "text/css; charset=utf-8", True),
    "/agui-hub.js": ("agui-hub.js", _JS, False),
    # Served for reading, never run: nosniff keeps a browser from taking it for a script.
    "/agui-hub.d.ts": ("agui-hub.d.ts", "text/plain; charset=utf-8", False),
}
"""What the gateway serves over plain HTTP besides ``/healthz`` and ``/readyz``."""

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The viewer page's Content-Security-Policy: nothing but its own files, and
WebSockets to any gateway (``/?hub=ws://…`` follows another one). Event data
is untrusted: even if some got into the page as markup, it could load and run
nothing."""


@dataclasses.dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes | None
    """``None``: the package was built without this file."""
    name: str
    content_type: str
    etag: str
    shared: bool
    """Importable from pages on other origins (the client, not the viewer)."""


def static_folder() -> Traversable:
    """Where the package keeps the built page and client (``agui_hub/static``)."""
    return resources.files("agui_hub") / "static"


def load_static(viewer: bool) -> dict[str, StaticFile]:
    """The files of :data:`STATIC_PATHS` to serve, read once, by path (without the
    viewer's own with *viewer* off).

    A file missing from the package (a source checkout where ``npm run build``
    never ran) is answered 404 with the reason, rather than failing the start.
    """
    folder = static_folder()
    found: dict[str, StaticFile] = {}
    for path, (name, content_type, of_viewer) in STATIC_PATHS.items():
        if of_viewer and not viewer:
            continue
        try:
            body: bytes | None = (folder / name).read_bytes()
        except OSError:
            body = None
        tag = hashlib.sha256(body).hexdigest()[:32] if body is not None else ""
        found[path] = StaticFile(body, name, content_type, f'"{tag}"', not of_viewer)
    return found


def _etag_matches(header: str, etag: str) -> bool:
    """Whether an ``If-None-Match`` value names *etag* (weak comparison, RFC 9110)."""
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == etag:
            return True
    return False


def static_response(file: StaticFile, request: Request) -> Response:
    """The answer to a GET of *file*: the file, a 304 when the client's copy is
    current, or a 404 that says how to build a missing one."""
    if file.body is None:
        status = http.HTTPStatus.NOT_FOUND
        body = (
            f"agui-hub: this package was built without {file.name} "
            "(run `npm ci && npm run build` in js/ of a source checkout)\n"
        ).encode()
        headers = Headers(
            [
                ("Date", email.utils.formatdate(usegmt=True)),
                ("Connection", "close"),
                ("Content-Length", str(len(body))),
                ("Content-Type", "text/plain; charset=utf-8"),
            ]
        )
        return Response(status.value, status.phrase, headers, body)
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("ETag", file.etag),
            # Revalidated at each load (a 304 costs no body): a gateway upgrade
            # never leaves a page running with the previous version's script.
            ("Cache-Control", "no-cache"),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
        ]
    )
    if file.content_type.startswith("text/html"):
        headers["Content-Security-Policy"] = PAGE_POLICY
    if file.shared:
        # Public code, no credentials: a page on another origin may import it
        # (module scripts are fetched with CORS).
        headers["Access-Control-Allow-Origin"] = "*"
    if _etag_matches(",".join(request.headers.get_all("If-None-Match")), file.etag):
        # No Content-Length: a 304 has no body, and a cache would take a 0 for
        # the length of the file it keeps.
        status = http.HTTPStatus.NOT_MODIFIED
        return Response(status.value, status.phrase, headers, b"")
    status = http.HTTPStatus.OK
    headers["Content-Type"] = file.content_type
    headers["Content-Length"] = str(len(file.body))
    return Response(status.value, status.phrase, headers, file.body)
