"""The gateway's settings: :class:`GatewayConfig`, from defaults, a TOML file,
``AGUI_HUB_*`` variables and flags, checked before anything starts.

``agui-hub serve --help`` lists them all; docs/security.md explains the
authentication and limit settings.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import socket
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..store.urls import REDIS_SCHEMES
from ..wire.codec import DEFAULT_MAX_SIZE, MAX_VALUES
from .auth import Anonymous, Authenticator, Grants, JWTAuthenticator, JWTSettings

if TYPE_CHECKING:
    from ..bridge.agents import AgentEndpoint

__all__ = [
    "GatewayConfig",
    "build_authenticator",
    "is_loopback",
    "raise_open_file_limit",
    "split_list",
]

LOOPS = ("asyncio", "uvloop")
"""The event loops ``agui-hub serve`` can run on (the ``loop`` setting)."""
SHARED_STORES = REDIS_SCHEMES
"""Store schemes that several gateway processes can share (``workers`` > 1)."""

KIB = 1024
MIB = 1024 * KIB
SECONDS = 1.0


@dataclass
class GatewayConfig:
    """Gateway settings; every one can also come from an ``AGUI_HUB_*`` variable
    (``AGUI_HUB_MAX_CONNECTIONS=500``) or a TOML file (see :meth:`from_env`).

    docs/security.md explains the authentication and limit settings.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    store: str = ""
    """Store URL; empty: the in-process memory store."""
    max_frame_bytes: int = DEFAULT_MAX_SIZE
    """Largest client command; a larger one is answered ``payload_too_large``, and a
    frame over ``FRAME_LIMIT_FACTOR`` times this closes the connection with 1009."""
    max_frame_values: int = MAX_VALUES
    """Most JSON values (array items and object entries, nested) one client command
    may hold; a command with more is answered ``payload_too_large``. It bounds the
    work of decoding and checking a frame, which grows with its values, not its bytes."""
    max_event_bytes: int = DEFAULT_MAX_SIZE
    """Largest published event (encoded); a larger one is refused ``payload_too_large``."""
    max_subscriptions: int = 1000
    """Threads one connection may subscribe to at once."""
    send_queue_bytes: int = 4 * MIB
    """Unsent bytes per connection: past this, its events come from the store at the
    pace of its socket instead (see docs/gateway.md, "Slow consumers")."""
    ping_interval: float | None = 20 * SECONDS
    ping_timeout: float | None = 20 * SECONDS
    write_timeout: float | None = None
    """Seconds a write to a client may wait for its socket before the connection
    is dropped (a client that stopped reading); default: ``ping_timeout``, or 20."""
    idle_timeout: float = 300 * SECONDS
    """A connection with no subscription and no command for this long is closed (4001)."""
    open_timeout: float = 10 * SECONDS
    """Seconds a new socket has to complete its WebSocket handshake."""
    state_max_bytes: int = 8 * MIB
    """Largest folded state document of a thread (approximate encoded bytes)."""
    state_max_depth: int = 64
    """Deepest nesting of a thread's state document."""
    state_max_work: int = 50_000
    """Work units the state deltas of one publish may spend on values the state
    holds already (copies, removals, replacements, moves; one unit is about one
    value visited): past it the publish is refused ``limit_exceeded``."""
    raw_events: str = "keep"
    """What is stored of upstream agents' RAW events: ``keep`` (as sent), ``strip``
    (without their payload) or ``drop``; an agent of ``agents_file`` may say
    otherwise (``raw_events``). See docs/bridge.md."""
    strict_patches: bool = False
    """Refuse (``patch_error``) a STATE_DELTA or ACTIVITY_DELTA whose patch does not
    apply, instead of storing it as the official client takes it (a warning; the
    state stays as it was)."""
    presence: str = "full"
    """Who watches each thread (docs/protocol.md, ``presence``): ``full`` (subjects
    and client info), ``count`` (the count only, for privacy) or ``off``."""
    presence_ttl: float = 15 * SECONDS
    """Seconds a presence entry lives unless its gateway refreshes it (every third of
    it): a dead gateway's viewers leave every other gateway's presence within it."""
    presence_interval: float = 1 * SECONDS
    """Seconds between two reads of the watched threads' presence: ``joined`` and
    ``left`` frames come at most this often per thread."""
    require_durable_store: bool = False
    """Refuse to start on a store whose settings can lose events (see docs/store.md)."""
    loop: str = "asyncio"
    """Event loop of ``agui-hub serve``: ``asyncio``, or ``uvloop`` (``pip install
    'agui-hub[speed]'``; see docs/gateway.md, "Processes and event loops")."""
    viewer: bool = True
    """Serve the viewer page at ``/`` (with ``/viewer.js`` and ``/viewer.css``): a browser
    page that follows a thread. The JavaScript client (``/agui-hub.js``) is served either way."""
    workers: int = 1
    """Gateway processes ``agui-hub serve`` runs on the port (SO_REUSEPORT); more than
    one needs a shared store (``redis://``). Limits such as ``max_connections`` apply
    to each process (see docs/gateway.md, "Processes and event loops")."""

    # Authentication (docs/security.md) ----------------------------------------------------
    jwt_secret: str = field(default="", repr=False)
    """HS256 shared secret (32 bytes or more). Prefer ``jwt_secret_file``: a flag or an
    environment variable can be read by other users of the machine."""
    jwt_secret_file: str = ""
    jwt_public_key_file: str = ""
    """PEM public key (RSA, EC, Ed25519) verifying RS256 / ES256 / EdDSA tokens."""
    jwt_jwks_file: str = ""
    """JWKS file of public keys, picked by the token's ``kid``; re-read when it changes."""
    jwt_algorithms: str = ""
    """Comma-separated accepted ``alg`` values (default: by key kind)."""
    jwt_audience: str = ""
    jwt_issuer: str = ""
    jwt_leeway: float = 30 * SECONDS
    jwt_grants_claim: str = "agui"
    jwt_cookie: str = ""
    """Name of a cookie that may carry the token (needs ``allowed_origins``)."""
    revocation_file: str = ""
    """Revoked token ids (``jti``) and subjects, one per line; re-read when it changes."""
    allow_anonymous: bool = False
    """Accept connections without a token: on a non-loopback address without JWT,
    and next to JWT (with the anonymous grants)."""
    anonymous_subscribe: str | None = None
    """Comma-separated thread patterns a connection without a token may read
    (default: every thread without JWT, none with JWT)."""
    anonymous_publish: str | None = None
    """Comma-separated thread patterns a connection without a token may publish into."""
    allowed_origins: str = ""
    """Comma-separated origins (``https://app.example``) browsers may connect from; ``*``:
    any. Default: the gateway's own origin only. Clients that send no Origin (not
    browsers) are not affected."""
    auth_timeout: float = 10 * SECONDS
    """Seconds a connection opened without a token has to send ``auth`` (else 4401)."""

    # Limits ---------------------------------------------------------------------------------
    max_connections: int = 10_000
    """WebSocket connections per process (lowered to fit the open-file limit)."""
    max_connections_per_address: int = 1000
    """WebSocket connections from one client address (HTTP 429 past it)."""
    max_commands_per_second: float = 1000.0
    """Commands per connection per second (a burst of one second's worth)."""
    max_events_per_second: float = 20_000.0
    """Published events per connection per second."""
    max_state_work_per_second: float = 500_000.0
    """Work units (see ``state_max_work``) the publishes of one connection may cost
    per second; a connection over it is paced (its next publish waits)."""
    max_thread_state_work_per_second: float = 1_000_000.0
    """Work units the publishes into one thread may cost per second, whichever
    connections send them; a publish into a thread over it waits, in line."""

    # TLS ----------------------------------------------------------------------------------------
    tls_cert: str = ""
    """PEM certificate chain: serve ``wss://`` (with ``tls_key``)."""
    tls_key: str = ""

    # Operations (docs/metrics.md) -----------------------------------------------------------------
    metrics: bool = True
    """Serve Prometheus metrics at ``/metrics``: to anyone on a gateway without
    authentication; with authentication, to a token with the admin grant (or to
    anyone with ``metrics_public``)."""
    metrics_public: bool = False
    """Serve ``/metrics`` without a token on a gateway with authentication (the
    figures name no thread, subject or address; they do show the gateway's load)."""
    admin_anonymous: bool = False
    """Serve the admin endpoints (``/admin/threads``: every thread's name and size,
    and deletion) without a token, on a gateway without authentication listening
    on a loopback address only. With authentication they need the admin grant."""

    # The HTTP bridge (docs/bridge.md) ----------------------------------------------------------
    http_port: int | None = None
    """Port of the HTTP listener: SSE streams of threads (``GET /threads/<thread>/events``)
    and the endpoint a stock AG-UI ``HttpAgent`` runs upstream agents through
    (``POST /agents/<name>``). Unset: no HTTP listener; 0: any free port."""
    agents: str = ""
    """Upstream AG-UI agents the hub may run, ``NAME=URL`` separated by commas."""
    agents_file: str = ""
    """A TOML or JSON file of upstream agents with headers (credentials) and timeouts."""
    max_runs: int = 64
    """Upstream runs one gateway process has going at once."""
    max_input_bytes: int = 16 * MIB
    """Largest RunAgentInput an HTTP client may POST."""
    anonymous_run: str | None = None
    """Comma-separated patterns of the agents a connection without a token may run
    (default: every agent without JWT, none with JWT)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise :class:`ValueError` naming the first setting that is out of range."""
        if self.raw_events not in ("keep", "strip", "drop"):
            raise ValueError(f"raw_events is keep, strip or drop, not {self.raw_events!r}")
        if self.presence not in ("full", "count", "off"):
            raise ValueError(f"presence is full, count or off, not {self.presence!r}")
        if not math.isfinite(self.presence_ttl):
            raise ValueError(f"presence_ttl must be a number of seconds, not {self.presence_ttl}")
        if not 0.1 <= self.presence_interval <= self.presence_ttl / 3:
            raise ValueError(
                f"presence_interval {self.presence_interval:g} must be 0.1 s or more, and at "
                f"most a third of presence_ttl ({self.presence_ttl:g} s)"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not a TCP port (0 to 65535; 0: any free)")
        for name in (
            "max_frame_bytes",
            "max_frame_values",
            "max_event_bytes",
            "max_subscriptions",
            "send_queue_bytes",
            "state_max_bytes",
            "state_max_depth",
            "state_max_work",
            "max_connections",
            "max_connections_per_address",
            "workers",
            "max_runs",
            "max_input_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in (
            "idle_timeout",
            "open_timeout",
            "auth_timeout",
            "max_commands_per_second",
            "max_events_per_second",
            "max_state_work_per_second",
            "max_thread_state_work_per_second",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number")
        for name in ("ping_interval", "ping_timeout", "write_timeout"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number")
        if not math.isfinite(self.jwt_leeway) or self.jwt_leeway < 0:
            raise ValueError("jwt_leeway must be a non-negative number of seconds")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(
                f"http_port {self.http_port} is not a TCP port (0 to 65535; 0: any free)"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both tls_cert and tls_key")
        if self.admin_anonymous and self.jwt_configured:
            raise ValueError(
                "admin_anonymous is for gateways without authentication: with JWT, the admin "
                'endpoints take a token with the admin grant ({"agui": {"admin": true}}; '
                "docs/metrics.md)"
            )
        if self.admin_anonymous and not is_loopback(self.host):
            raise ValueError(
                f"admin_anonymous would let anyone who reaches {self.host} list and delete "
                "every thread: it is only for a loopback host (127.0.0.1); elsewhere configure "
                "JWT and use a token with the admin grant (docs/metrics.md)"
            )

    def check_processes(self) -> None:
        """Raise :class:`ValueError` if ``loop`` or ``workers`` cannot be served.

        Not part of :meth:`check`: only ``agui-hub serve`` picks the event loop
        and starts processes; a :class:`~agui_hub.gateway.server.Gateway` run in a
        program's own loop uses neither setting.
        """
        if self.loop not in LOOPS:
            raise ValueError(f"loop {self.loop!r} is not an event loop: use {' or '.join(LOOPS)}")
        if self.workers == 1:
            return
        scheme = urlsplit(self.store).scheme.lower() if self.store else "memory"
        if scheme not in SHARED_STORES:
            raise ValueError(
                f"workers {self.workers} needs a shared store (redis:// or rediss://): on the "
                f"{scheme}:// store each process would keep events of its own, and viewers "
                "connected to one would not see what is published through another"
            )
        if self.port == 0:
            raise ValueError(
                f"workers {self.workers} needs a fixed port: with port 0 each process would "
                "listen on a port of its own"
            )
        if not hasattr(socket, "SO_REUSEPORT"):
            raise ValueError(
                f"workers {self.workers} needs SO_REUSEPORT, which this platform lacks: run "
                "one gateway per port instead"
            )

    @property
    def jwt_configured(self) -> bool:
        return bool(
            self.jwt_secret or self.jwt_secret_file or self.jwt_public_key_file
            or self.jwt_jwks_file
        )  # fmt: skip

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        config_file: str | None = None,
        **overrides: Any,
    ) -> GatewayConfig:
        """Settings from, in rising order of precedence: the defaults, *config_file*
        (TOML, the setting names as keys; also ``AGUI_HUB_CONFIG``), ``AGUI_HUB_*``
        variables, then *overrides* that are not ``None`` (command-line flags).

        Raises :class:`ValueError` naming the setting that cannot be used.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        kinds = setting_kinds()
        path = config_file or env.get("AGUI_HUB_CONFIG")
        if path:
            values.update(_read_config_file(path, kinds))
        optional = optional_settings()
        for name, kind in kinds.items():
            raw = env.get(f"AGUI_HUB_{name.upper()}")
            if raw is not None:
                values[name] = _parse_setting(
                    f"AGUI_HUB_{name.upper()}", raw, kind, name in optional
                )
        for name, value in overrides.items():
            if value is not None:
                values[name] = value
        return cls(**values)


def setting_kinds() -> dict[str, type]:
    """Each setting of :class:`GatewayConfig` and the type of its values."""
    hints = typing.get_type_hints(GatewayConfig)
    kinds: dict[str, type] = {}
    for item in fields(GatewayConfig):
        hint = hints[item.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        kinds[item.name] = args[0] if args else hint
    return kinds


CLIENT_VARIABLES = frozenset(
    {"AGUI_HUB_URL", "AGUI_HUB_TOKEN", "AGUI_HUB_CONFIG", "AGUI_HUB_JWT_SECRET_FILE"}
)
"""``AGUI_HUB_*`` variables that are not gateway settings (the client commands' own)."""


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """``AGUI_HUB_*`` variables that name no setting: most likely typos."""
    env = os.environ if environ is None else environ
    known = {f"AGUI_HUB_{name.upper()}" for name in setting_kinds()} | CLIENT_VARIABLES
    return sorted(name for name in env if name.startswith("AGUI_HUB_") and name not in known)


def optional_settings() -> frozenset[str]:
    """The settings that may be ``None`` (switched off): ``off`` or ``none`` in a variable."""
    hints = typing.get_type_hints(GatewayConfig)
    return frozenset(
        item.name
        for item in fields(GatewayConfig)
        if type(None) in typing.get_args(hints[item.name])
    )


_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _parse_setting(where: str, raw: str, kind: type, optional: bool = False) -> Any:
    try:
        if kind is bool:
            return _parse_bool(raw)
        if optional and kind in (float, int) and raw.strip().lower() in {"none", "off"}:
            return None
        return kind(raw)
    except ValueError:
        raise ValueError(f"{where}={raw!r} is not {_KIND_NAMES.get(kind, kind.__name__)}") from None


def _read_config_file(path: str, kinds: dict[str, type]) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    optional = optional_settings()
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in kinds:
            raise ValueError(f"config file {path}: unknown setting {key!r}")
        kind = kinds[name]
        if name in optional and (value is False or value in ("off", "none")):
            values[name] = None  # TOML has no null: `ping_interval = "off"`
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, list) and kind is str:
            value = ",".join(str(v) for v in value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(
                f"config file {path}: {key} = {value!r} is not "
                f"{_KIND_NAMES.get(kind, kind.__name__)}"
            )
        values[name] = value
    return values


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(raw)


def split_list(value: str | None) -> list[str]:
    """The items of a comma-separated setting."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def build_agents(config: GatewayConfig) -> dict[str, AgentEndpoint]:
    """The upstream agents *config* names (``agents`` and ``agents_file``); :class:`ValueError`
    on a bad entry or a name given twice."""
    from ..bridge.agents import load_agents, parse_agents

    agents = parse_agents(config.agents)
    if config.agents_file:
        for name, agent in load_agents(config.agents_file).items():
            if name in agents:
                raise ValueError(f"agent {name!r} is in both agents and agents_file")
            agents[name] = agent
    return agents


def build_authenticator(config: GatewayConfig) -> Authenticator:
    """The authenticator *config* describes. Raises :class:`ValueError` on a bad setting."""
    if not config.jwt_configured:
        if config.jwt_cookie or config.revocation_file:
            raise ValueError("jwt_cookie and revocation_file need a JWT key (e.g. jwt_secret)")
        subscribe = config.anonymous_subscribe
        publish = config.anonymous_publish
        run = config.anonymous_run
        return Anonymous(
            Grants.from_lists(
                split_list(subscribe) if subscribe is not None else ["*"],
                split_list(publish) if publish is not None else ["*"],
                split_list(run) if run is not None else ["*"],
            )
        )
    secret = config.jwt_secret or None
    if config.jwt_secret_file:
        if secret:
            raise ValueError("give jwt_secret or jwt_secret_file, not both")
        try:
            secret = Path(config.jwt_secret_file).read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"cannot read jwt_secret_file {config.jwt_secret_file}: {exc.strerror}"
            ) from None
    anonymous = (
        Grants.from_lists(
            split_list(config.anonymous_subscribe),
            split_list(config.anonymous_publish),
            split_list(config.anonymous_run),
        )
        if config.allow_anonymous
        else None
    )
    return JWTAuthenticator(
        JWTSettings(
            secret=secret,
            public_key_file=config.jwt_public_key_file or None,
            jwks_file=config.jwt_jwks_file or None,
            algorithms=tuple(split_list(config.jwt_algorithms)),
            audience=config.jwt_audience or None,
            issuer=config.jwt_issuer or None,
            leeway=config.jwt_leeway,
            grants_claim=config.jwt_grants_claim,
            revocation_file=config.revocation_file or None,
            anonymous=anonymous,
        )
    )


def is_loopback(host: str) -> bool:
    """Whether *host* (a listening address) only accepts connections from this machine."""
    if host in {"localhost", "ip6-localhost"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


FD_RESERVE = 64
"""Open files kept free of client sockets: the store's connections, log files."""

HANDSHAKE_HEADROOM = 64
"""Sockets beyond ``max_connections`` that may be open at once: health checks,
handshakes being refused, so that the gateway can still answer them when full."""


def limit_key(host: str) -> str:
    """A client address as the per-address limits count it: an IPv6 client by its
    /64, which one host usually has whole; an IPv4-mapped one as IPv4."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's open-file soft limit to its hard limit; return (before, after).

    Every connection is a file descriptor: with the usual soft limit of 1,024
    a gateway runs out of them long before it runs out of anything else.
    """
    try:
        import resource
    except ImportError:  # not on this platform
        return (0, 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_file_limit() -> int | None:
    """The open-file soft limit of this process (``None``: unlimited or unknown)."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


SETTING_GROUPS: dict[str, dict[str, str]] = {
    "serving": {
        "host": "interface to listen on (default 127.0.0.1; anything else needs "
        "authentication or --allow-anonymous)",
        "port": "port to listen on (default 8765; 0: any free)",
        "store": "store URL: redis://host:port/db[?max_len=…&max_bytes=…&ttl=…] or memory:// "
        "(default: the in-process memory store)",
        "require_durable_store": "refuse to start on a Redis whose settings can lose events "
        "(default: start, and log a warning per setting; docs/store.md)",
        "tls_cert": "PEM certificate chain: serve wss:// (with --tls-key; default: none, "
        "plain ws://)",
        "tls_key": "PEM private key of --tls-cert (default: none)",
        "loop": "event loop: asyncio, or uvloop (needs pip install 'agui-hub[speed]'; "
        "default asyncio)",
        "viewer": "serve the viewer page at / (a browser page following a thread; "
        "--no-viewer: off, /agui-hub.js is still served; default on)",
        "workers": "gateway processes sharing the port (SO_REUSEPORT), to use more cores; "
        "more than 1 needs a redis:// store, and the limits below apply to each process "
        "(default 1)",
    },
    "authentication (docs/security.md)": {
        "jwt_secret": "HS256 secret, 32+ bytes (prefer --jwt-secret-file: flags are visible "
        "to other users; default: none; without a JWT key, no authentication)",
        "jwt_secret_file": "file holding the HS256 secret (default: none)",
        "jwt_public_key_file": "PEM public key verifying RS256/ES256/EdDSA tokens (default: none)",
        "jwt_jwks_file": "JWKS file of public keys, by kid (re-read when it changes; default: "
        "none)",
        "jwt_algorithms": "accepted alg values, comma-separated (default: by key kind)",
        "jwt_audience": "required aud claim (default: none; tokens that carry an aud are refused)",
        "jwt_issuer": "required iss claim (default: none; any issuer)",
        "jwt_leeway": "seconds of clock skew allowed on exp and nbf (default 30)",
        "jwt_grants_claim": "claim holding the grants (default agui)",
        "jwt_cookie": "cookie that may carry the token (needs --allowed-origins; default: none)",
        "revocation_file": "revoked jti and sub values, one per line (re-read when it "
        "changes, and on SIGHUP; default: none)",
        "allow_anonymous": "accept connections without a token (see --anonymous-*; default: "
        "off, but a gateway without JWT on a loopback --host accepts them anyway)",
        "anonymous_subscribe": "threads a connection without a token may read, comma-"
        "separated patterns like tenant-1/* (default: all without JWT, none with JWT)",
        "anonymous_publish": "threads a connection without a token may publish into "
        "(default: all without JWT, none with JWT)",
        "allowed_origins": "origins browsers may connect from, comma-separated; * for any "
        "(default: the gateway's own)",
        "auth_timeout": "seconds a connection without a token has to send auth (default 10)",
    },
    "limits": {
        "max_connections": "WebSocket connections per process (default 10000; lowered to "
        "fit the open-file limit)",
        "max_connections_per_address": "connections per client address (default 1000)",
        "max_commands_per_second": (
            "commands other than publishes per connection per second; a connection over it "
            "is paced (default 1000)"
        ),
        "max_events_per_second": (
            "published events per connection per second (a publish counts as its events); "
            "a connection over it is paced (default 20000)"
        ),
        "max_state_work_per_second": (
            "work units (see --state-max-work) the publishes of one connection may cost per "
            "second; a connection over it is paced (default 500000)"
        ),
        "max_thread_state_work_per_second": (
            "work units the publishes into one thread may cost per second, whichever "
            "connections send them; a publish into a thread over it waits "
            "(default 1e+06, a million)"
        ),
        "max_subscriptions": "threads per connection (default 1000)",
        "max_frame_bytes": "largest client frame (default 1 MiB)",
        "max_frame_values": "most JSON values (array items and object entries) in one "
        "client frame (default 100000; docs/security.md)",
        "max_event_bytes": "largest published event (default 1 MiB)",
        "send_queue_bytes": "unsent bytes per connection before it reads from the store "
        "instead (default 4 MiB)",
        "state_max_bytes": "largest folded state document of a thread (default 8 MiB)",
        "state_max_depth": "deepest nesting of a thread's state (default 64)",
        "raw_events": "what is stored of upstream agents' RAW events: keep, strip (without "
        "their payload) or drop; per agent in --agents-file (default keep; docs/bridge.md)",
        "strict_patches": "refuse a STATE_DELTA or ACTIVITY_DELTA whose JSON Patch does not "
        "apply (patch_error) instead of storing it as the official client takes it: with a "
        "warning, the state staying as it was (default: store it; docs/protocol.md)",
        "state_max_work": "work units the state deltas of one publish may spend on values "
        "the state holds already, about one per value copied, removed or moved (default "
        "50000; docs/security.md)",
        "ping_interval": "seconds between keepalive pings (default 20)",
        "ping_timeout": "seconds a ping may go unanswered (default 20)",
        "write_timeout": "seconds a write may make no progress before the connection is "
        "dropped (default: the ping timeout, or 20)",
        "idle_timeout": "seconds before a connection with nothing to do is closed (default 300)",
        "open_timeout": "seconds a new socket has to finish its handshake (default 10)",
    },
    "presence (docs/operations.md)": {
        "presence": "who watches each thread: full (subjects and client info), count (the "
        "count only, for privacy) or off (default full)",
        "presence_ttl": "seconds a presence entry lives unless refreshed (every third of it): "
        "a dead gateway's viewers leave others' presence within it (default 15)",
        "presence_interval": "seconds between two reads of the watched threads' presence: "
        "joined and left frames come at most this often per thread (default 1)",
    },
    "operations (docs/metrics.md)": {
        "metrics": "serve Prometheus metrics at /metrics (--no-metrics: off; default on: open "
        "without authentication, else for tokens with the admin grant)",
        "metrics_public": "serve /metrics without a token also when authentication is on "
        "(default off)",
        "admin_anonymous": "serve the admin endpoints (/admin/threads) without a token; only "
        "without authentication, on a loopback --host (default off: they need a token with "
        "the admin grant)",
    },
    "HTTP bridge (docs/bridge.md)": {
        "http_port": "port of the HTTP listener: SSE streams of threads and POST "
        "/agents/NAME for AG-UI HttpAgent clients (default: none, no HTTP listener; 0: any "
        "free)",
        "agents": "upstream AG-UI agents the hub may run, NAME=URL comma-separated (default: none)",
        "agents_file": "TOML or JSON file of upstream agents with headers and timeouts "
        "(default: none)",
        "max_runs": "upstream runs going at once per process (default 64)",
        "max_input_bytes": "largest RunAgentInput an HTTP client may POST (default 16 MiB)",
        "anonymous_run": "agents a connection without a token may run, comma-separated "
        "patterns (default: all without JWT, none with JWT)",
    },
}
"""Every setting, grouped, with the help line of its flag (``agui-hub serve --help``)."""
