"""Who a connection is and what it may do: tokens, grants, identities.

Sans I/O, like :mod:`agui_hub.wire.protocol`: the gateway hands this module what
the handshake carried (:func:`credentials_of`) or what an ``auth`` command
said, and gets back an :class:`Identity` or an
:class:`~agui_hub.errors.Unauthorized`. docs/security.md is the specification
of the claims, where tokens travel, and the threat model.

An identity's :class:`Grants` say which threads it may subscribe to (which
covers replays and snapshots: everything that reads) and which it may publish
into, separately, as exact thread ids or prefix patterns ending in ``*``
(``tenant-42/*``). Every subscribe and publish is checked against them, and a
subscription ends when the grant that allowed it does (token expiry, a
refresh with narrower grants, revocation).

:class:`JWTAuthenticator` verifies JSON Web Tokens with PyJWT: HS256 with a
shared secret, RS256 / ES256 / EdDSA with a public key or a JWKS file;
``exp``, ``nbf``, ``aud`` and ``iss`` are checked. The grants are a claim::

    {"sub": "agent-7", "exp": 1764703600,
     "agui": {"subscribe": ["tenant-42/*"], "publish": ["tenant-42/run-1"]}}
"""

from __future__ import annotations

import enum
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote_plus, urlsplit

from ..errors import Forbidden, Unauthorized

__all__ = [
    "ANONYMOUS_SUBJECT",
    "Action",
    "Authenticator",
    "Credentials",
    "Grants",
    "Identity",
    "JWTAuthenticator",
    "JWTSettings",
    "TokenSource",
    "check_pattern",
    "credentials_of",
    "pattern_matches",
    "redact",
    "scoped_event_id",
]

MAX_TOKEN_BYTES = 8 * 1024
"""Longest token accepted (a JWT with a handful of grants is well under 1 KiB)."""

MAX_PATTERNS = 1000
"""Most patterns one grant list may hold (each is checked on every subscribe)."""

MAX_PATTERN_LENGTH = 1024

SUBPROTOCOL_TOKEN_PREFIX = "agui-hub.bearer."
"""A ``Sec-WebSocket-Protocol`` entry ``agui-hub.bearer.<token>`` carries a token
(browsers can set no other header on a WebSocket)."""

QUERY_TOKEN = "access_token"
"""The query parameter that carries a token (``ws://host/?access_token=…``, RFC 6750)."""

ANONYMOUS_SUBJECT = "anonymous"
"""The subject of a connection without a token (where anonymous access is on)."""

DEFAULT_GRANTS_CLAIM = "agui"


class Action(enum.StrEnum):
    """What a connection asks to do with a thread."""

    SUBSCRIBE = "subscribe"
    """Read: subscribe (live, from an offset, from the start) and snapshots."""
    PUBLISH = "publish"
    """Write: append events."""


# -- patterns and grants -----------------------------------------------------------------


def check_pattern(pattern: Any) -> str:
    """*pattern* if it is a grant pattern, else :class:`ValueError` saying why.

    A pattern is a thread id (exact), a prefix followed by ``*``
    (``tenant-42/*``: every thread whose id starts with ``tenant-42/``), or
    ``*`` alone (every thread). ``*`` anywhere but at the end is refused, so a
    pattern never means more than it seems to.
    """
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"a grant pattern is a non-empty string, not {pattern!r}")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(f"a grant pattern is at most {MAX_PATTERN_LENGTH} characters")
    if "*" in pattern[:-1]:
        raise ValueError(
            f"grant pattern {pattern!r}: '*' may only end a pattern (a prefix), e.g. 'tenant-42/*'"
        )
    return pattern


def pattern_matches(pattern: str, thread: str) -> bool:
    """Whether *pattern* (see :func:`check_pattern`) covers *thread*."""
    if pattern.endswith("*"):
        return thread.startswith(pattern[:-1])
    return thread == pattern


def _patterns(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise ValueError(f"{what} is a list of thread patterns")
    if len(value) > MAX_PATTERNS:
        raise ValueError(f"{what} holds more than {MAX_PATTERNS} patterns")
    return tuple(dict.fromkeys(check_pattern(p) for p in value))


@dataclass(frozen=True, slots=True)
class Grants:
    """The threads an identity may read (subscribe) and write (publish), and
    whether it may use the gateway's admin HTTP endpoints (docs/metrics.md)."""

    subscribe: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()
    admin: bool = False
    """``/metrics`` and ``/admin/threads``: every thread's name and size, and deletion."""
    run: tuple[str, ...] = ()
    """Patterns of the upstream agents it may run (docs/bridge.md), in threads it may
    publish into: ``*``, a name, or a prefix and ``*``."""

    def allows(self, action: Action, thread: str) -> bool:
        patterns = self.subscribe if action is Action.SUBSCRIBE else self.publish
        return any(pattern_matches(p, thread) for p in patterns)

    def may_run(self, agent: str) -> bool:
        """Whether the ``run`` grant covers upstream agent *agent*."""
        return any(pattern_matches(p, agent) for p in self.run)

    def __bool__(self) -> bool:
        return bool(self.subscribe or self.publish or self.admin or self.run)

    def as_json(self) -> dict[str, Any]:
        grants: dict[str, Any] = {"subscribe": list(self.subscribe), "publish": list(self.publish)}
        if self.admin:  # only then: the frame of every other identity stays as it was
            grants["admin"] = True
        if self.run:
            grants["run"] = list(self.run)
        return grants

    @classmethod
    def everything(cls) -> Grants:
        return cls(("*",), ("*",), run=("*",))

    @classmethod
    def from_claim(cls, value: Any) -> Grants:
        """Parse ``{"subscribe": [...], "publish": [...], "admin": true}`` (each key
        optional); :class:`ValueError` if not that."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise ValueError('grants are {"subscribe": [patterns], "publish": [patterns]}')
        unknown = set(value) - {"subscribe", "publish", "admin", "run"}
        if unknown:
            raise ValueError(
                f"unknown grant {sorted(unknown)[0]!r}: use subscribe, publish, run and admin"
            )
        admin = value.get("admin", False)
        if not isinstance(admin, bool):
            # Only a JSON true: "false" or 1 must not turn into an admin by accident.
            raise ValueError("the admin grant is true or false")
        return cls(
            _patterns(value.get("subscribe"), "subscribe"),
            _patterns(value.get("publish"), "publish"),
            admin,
            _patterns(value.get("run"), "run"),
        )

    @classmethod
    def from_lists(
        cls, subscribe: Iterable[str], publish: Iterable[str], run: Iterable[str] = ()
    ) -> Grants:
        """From lists of patterns (e.g. the anonymous grants of the configuration)."""
        return cls(
            _patterns(list(subscribe), "subscribe"),
            _patterns(list(publish), "publish"),
            run=_patterns(list(run), "run"),
        )


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a connection is: what its credentials proved."""

    subject: str
    """The token's ``sub``, or :data:`ANONYMOUS_SUBJECT`."""
    grants: Grants
    expires: float | None = None
    """Unix time at which the credentials expire (``None``: never)."""
    token_id: str | None = None
    """The token's ``jti``, when it had one (what a revocation list can name)."""
    anonymous: bool = False
    scoped: bool = True
    """Whether its event ids are kept under its subject (see :func:`scoped_event_id`);
    ``False`` where nobody authenticates, so all publishers share one space."""

    def allows(self, action: Action, thread: str) -> bool:
        return self.grants.allows(action, thread)


def scoped_event_id(identity: Identity, event_id: str) -> str:
    """The idempotency key the store keeps for *event_id* published by *identity*.

    Event ids are the publisher's own: scoping them by subject means nobody
    can publish first with another publisher's next id and so make the
    store drop that publisher's real event as a retry. ``%`` and ``:`` in the
    subject are escaped, so two subjects never produce the same key. A gateway
    without authentication keeps ids as given (everyone is the same anonymous
    publisher there, and ids published through a store URL still match).
    """
    if not identity.scoped:
        return event_id
    # Anonymous publishers share an empty scope, which no token's subject has.
    subject = "" if identity.anonymous else identity.subject
    subject = subject.replace("%", "%25").replace(":", "%3A")
    return f"{subject}:{event_id}"


# -- where tokens travel -------------------------------------------------------------------


class TokenSource(enum.StrEnum):
    HEADER = "header"
    """``Authorization: Bearer <token>`` (agents and other non-browser clients)."""
    SUBPROTOCOL = "subprotocol"
    """A ``Sec-WebSocket-Protocol`` entry ``agui-hub.bearer.<token>`` (browsers)."""
    QUERY = "query"
    """``?access_token=<token>`` in the URL (browsers; ends up in access logs)."""
    COOKIE = "cookie"
    """A cookie named by the configuration (browsers; needs the Origin allow-list)."""
    FRAME = "frame"
    """An ``auth`` command on an open connection (browsers; never in a URL or log)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """The token a handshake carried, and where."""

    token: str = field(repr=False)
    source: TokenSource


def credentials_of(
    path: str, headers: Mapping[str, str] | Any, *, cookie: str | None = None
) -> Credentials | None:
    """The token of a WebSocket handshake, or ``None`` when it carries none.

    Looked for, in this order: the ``Authorization`` header, a subprotocol
    entry, the ``access_token`` query parameter, the cookie named *cookie*.
    Raises :class:`~agui_hub.errors.Unauthorized` for a malformed one (an
    ``Authorization`` header that is not ``Bearer``, two tokens in the query).
    *headers* is a websockets ``Headers`` (or any mapping with ``get_all``).
    """
    authorization = headers.get("Authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        return Credentials(_checked(token.strip()), TokenSource.HEADER)
    for value in _all(headers, "Sec-WebSocket-Protocol"):
        for entry in value.split(","):
            entry = entry.strip()
            if entry.startswith(SUBPROTOCOL_TOKEN_PREFIX):
                return Credentials(
                    _checked(entry[len(SUBPROTOCOL_TOKEN_PREFIX) :]), TokenSource.SUBPROTOCOL
                )
    query = urlsplit(path).query
    if query:
        values = parse_qs(query, keep_blank_values=True).get(QUERY_TOKEN)
        if values:
            if len(values) > 1:
                raise Unauthorized(f"the query holds {QUERY_TOKEN} more than once")
            return Credentials(_checked(values[0]), TokenSource.QUERY)
    if cookie:
        # By hand, not http.cookies: it stops at the first cookie it cannot
        # parse, and other applications' cookies on the same site may be anything.
        found = None
        for value in _all(headers, "Cookie"):
            for part in value.split(";"):
                name, equals, content = part.partition("=")
                if equals and name.strip() == cookie and found is None:
                    # The first: browsers send the most specific cookie first,
                    # so a sibling subdomain's planted one does not win.
                    found = content.strip().strip('"')
        if found is not None:
            return Credentials(_checked(found), TokenSource.COOKIE)
    return None


_SECRET_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
_QUERY_PARAMETER = re.compile(r"([?&;]|^)([^=&;?\s]*)=([^&;\s]*)")
_TOKEN_IN_SUBPROTOCOL = re.compile(rf"({re.escape(SUBPROTOCOL_TOKEN_PREFIX)})[^,\s]*")


def redact(text: str) -> str:
    """*text* (a path, a header value) with any token in it replaced by ``[redacted]``.

    A query parameter is matched by its decoded name, as the gateway reads it
    (``access%5Ftoken`` is ``access_token`` too).
    """

    def parameter(match: re.Match[str]) -> str:
        if unquote_plus(match.group(2)) == QUERY_TOKEN:
            return f"{match.group(1)}{match.group(2)}=[redacted]"
        return match.group(0)

    text = _QUERY_PARAMETER.sub(parameter, text)
    return _TOKEN_IN_SUBPROTOCOL.sub(r"\1[redacted]", text)


class RedactingLogger(logging.LoggerAdapter[logging.Logger]):
    """A websockets logger minus the credentials its DEBUG output would show.

    websockets logs every handshake header at DEBUG (``Authorization`` and
    ``Cookie`` hold tokens, so may the path and ``Sec-WebSocket-Protocol``)
    and the start of every frame (an ``auth`` command holds one too). Give
    it this logger (``logger=`` of ``serve`` / ``connect``).
    """

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if args and self.isEnabledFor(level):
            if len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], str):
                name = args[0].lower()
                value = "[redacted]" if name in _SECRET_HEADERS else redact(args[1])
                args = (args[0], value)
            else:
                args = tuple(_redacted_arg(arg) for arg in args)
        kwargs.setdefault("stacklevel", 2)  # name websockets' line, not this one
        super().log(level, msg, *args, **kwargs)


def _redacted_arg(arg: object) -> object:
    if isinstance(arg, str):
        return redact(arg)
    data = getattr(arg, "data", None)
    opcode = getattr(arg, "opcode", None)
    if isinstance(data, bytes | bytearray) and getattr(opcode, "name", "") in DATA_OPCODES:
        # A websockets Frame of data: any of them may hold a token (an auth
        # command, in any JSON spelling or split over fragments): its size only.
        return f"{opcode.name} [{len(data)} bytes]"  # type: ignore[union-attr]
    return arg


DATA_OPCODES = frozenset({"TEXT", "BINARY", "CONT"})


def _all(headers: Any, name: str) -> list[str]:
    if hasattr(headers, "get_all"):
        return list(headers.get_all(name))
    value = headers.get(name)
    return [] if value is None else [value]


def _checked(token: str) -> str:
    if not token:
        raise Unauthorized("the token is empty")
    if len(token.encode()) > MAX_TOKEN_BYTES:
        raise Unauthorized(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
    return token


# -- authenticators -----------------------------------------------------------------------------


class Authenticator(Protocol):
    """The seam between the gateway and whatever issues identities.

    Implement it to authenticate otherwise (sessions, an API key table) and
    pass it to :class:`~agui_hub.gateway.server.Gateway`. :meth:`authenticate` is
    called once per handshake that carries a token and once per ``auth``
    command; every later decision uses the :class:`Identity` it returned.
    """

    anonymous: Identity | None
    """What a connection without a token is (``None``: it must authenticate)."""

    async def authenticate(self, credentials: Credentials) -> Identity:
        """The identity *credentials* prove.

        Raises :class:`~agui_hub.errors.Unauthorized` when they prove none,
        :class:`~agui_hub.errors.Forbidden` when they were revoked.
        """
        ...

    def revoked(self, identity: Identity) -> bool:
        """Whether *identity* was revoked since it was authenticated."""
        ...

    def reload(self) -> None:
        """Re-read keys and revocations from their files, if they changed."""
        ...


class Anonymous:
    """No authentication: every connection is anonymous, with *grants*."""

    def __init__(self, grants: Grants | None = None) -> None:
        self.anonymous: Identity | None = Identity(
            ANONYMOUS_SUBJECT,
            grants if grants is not None else Grants.everything(),
            anonymous=True,
            scoped=False,
        )

    async def authenticate(self, credentials: Credentials) -> Identity:
        raise Unauthorized("this gateway does not take tokens (no authentication is configured)")

    def revoked(self, identity: Identity) -> bool:
        return False

    def reload(self) -> None:
        pass


ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "EdDSA")
SYMMETRIC_ALGORITHMS = ("HS256", "HS384", "HS512")


@dataclass
class JWTSettings:
    """How tokens are verified. Give a secret, a public key, or a JWKS file."""

    secret: str | None = field(default=None, repr=False)
    """The HS256 shared secret (at least 32 bytes)."""
    public_key_file: str | None = None
    """A PEM public key (RSA, EC or Ed25519) for RS256 / ES256 / EdDSA tokens."""
    jwks_file: str | None = None
    """A JWKS document (``{"keys": [...]}``); a token's ``kid`` picks its key."""
    algorithms: tuple[str, ...] = ()
    """Accepted ``alg`` values; default: HS256 with a secret, the asymmetric ones else."""
    audience: str | None = None
    issuer: str | None = None
    leeway: float = 30.0
    """Seconds of clock skew allowed on ``exp`` and ``nbf``."""
    grants_claim: str = DEFAULT_GRANTS_CLAIM
    require_exp: bool = True
    """Refuse tokens without ``exp`` (a token that never expires can never be retired)."""
    revocation_file: str | None = None
    """A file of revoked ``jti`` and ``sub`` values, one per line (``#`` comments)."""
    anonymous: Grants | None = None
    """What a connection without a token may do (``None``: it must authenticate)."""

    def __post_init__(self) -> None:
        given = [x for x in (self.secret, self.public_key_file, self.jwks_file) if x]
        if len(given) != 1:
            raise ValueError("JWT needs exactly one of: a secret, a public key file, a JWKS file")
        if self.secret is not None and len(self.secret.encode()) < 32:
            raise ValueError("a JWT secret must be at least 32 bytes (HS256 keys this short "
                             "can be guessed)")  # fmt: skip
        allowed = SYMMETRIC_ALGORITHMS if self.secret else ASYMMETRIC_ALGORITHMS
        if not self.algorithms:
            self.algorithms = ("HS256",) if self.secret else ASYMMETRIC_ALGORITHMS
        for alg in self.algorithms:
            if alg not in allowed:
                kind = "a secret" if self.secret else "public keys"
                raise ValueError(
                    f"JWT algorithm {alg!r} cannot be used with {kind} "
                    f"(use one of {', '.join(allowed)})"
                )
        if not math.isfinite(self.leeway) or self.leeway < 0:
            raise ValueError("the JWT leeway is a non-negative number of seconds")
        if not self.grants_claim:
            raise ValueError("the grants claim needs a name")


class _WatchedFile:
    """A file re-read when its modification time or size changes."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamp: tuple[int, int] | None = None

    def changed(self) -> bool:
        try:
            stat = os.stat(self.path)
        except OSError:
            return False  # keep what was loaded: a missing file is logged by the caller
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        return True


class JWTAuthenticator:
    """Verifies JWTs (see :class:`JWTSettings`); :func:`jwt` is PyJWT.

    Raises :class:`ValueError` at construction when a key file cannot be read
    or parsed: the gateway refuses to start rather than refuse everyone.
    """

    def __init__(self, settings: JWTSettings) -> None:
        import jwt  # PyJWT: imported here so that anonymous gateways never need it

        self._jwt = jwt
        self.settings = settings
        self.anonymous: Identity | None = (
            Identity(ANONYMOUS_SUBJECT, settings.anonymous, anonymous=True)
            if settings.anonymous is not None
            else None
        )
        self._key: Any = settings.secret
        self._jwks: dict[str | None, Any] = {}
        self._key_file = _WatchedFile(settings.public_key_file or settings.jwks_file or "")
        self._revocations = (
            _WatchedFile(settings.revocation_file) if settings.revocation_file else None
        )
        self._revoked: frozenset[str] = frozenset()
        if settings.public_key_file or settings.jwks_file:
            self._key_file.changed()
            self._load_keys()
        if self._revocations is not None:
            self._revocations.changed()
            self._load_revocations()

    def _load_keys(self) -> None:
        settings = self.settings
        path = self._key_file.path
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read JWT key file {path}: {exc.strerror}") from None
        try:
            if settings.public_key_file:
                from cryptography.hazmat.primitives.serialization import load_pem_public_key

                self._key = load_pem_public_key(text.encode())
            else:
                jwks = self._jwt.PyJWKSet.from_json(text)
                keys: dict[str | None, Any] = {}
                for key in jwks.keys:
                    keys[key.key_id] = key.key
                self._jwks = keys
        except (ValueError, TypeError, self._jwt.PyJWTError) as exc:
            raise ValueError(f"JWT key file {path} cannot be used: {exc}") from None

    def _load_revocations(self) -> None:
        assert self._revocations is not None
        path = self._revocations.path
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read revocation file {path}: {exc.strerror}") from None
        self._revoked = frozenset(
            line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")
        )

    def reload(self) -> None:
        """Re-read the key file and the revocation file if they changed.

        Raises :class:`ValueError` when a changed file cannot be used; what was
        loaded before stays in force.
        """
        if (self.settings.public_key_file or self.settings.jwks_file) and self._key_file.changed():
            self._load_keys()
        if self._revocations is not None and self._revocations.changed():
            self._load_revocations()

    def revoked(self, identity: Identity) -> bool:
        if not self._revoked or identity.anonymous:
            return False
        return identity.subject in self._revoked or (
            identity.token_id is not None and identity.token_id in self._revoked
        )

    async def authenticate(self, credentials: Credentials) -> Identity:
        return self.verify(credentials.token)

    def verify(self, token: str) -> Identity:
        """The identity *token* proves; :class:`~agui_hub.errors.Unauthorized` saying why not."""
        jwt = self._jwt
        settings = self.settings
        _checked(token)
        try:
            key = self._key
            if settings.jwks_file:
                kid = jwt.get_unverified_header(token).get("kid")
                if kid not in self._jwks:
                    if kid is None and len(self._jwks) == 1:
                        kid = next(iter(self._jwks))
                    else:
                        raise Unauthorized(f"the token's key id {kid!r} is not in the JWKS")
                key = self._jwks[kid]
            required = ["sub"] + (["exp"] if settings.require_exp else [])
            claims = jwt.decode(
                token,
                key,
                algorithms=list(settings.algorithms),
                audience=settings.audience,
                issuer=settings.issuer,
                leeway=settings.leeway,
                # With no audience configured PyJWT refuses tokens that name
                # one: they were minted for another service.
                options={"require": required},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired: get a new one") from None
        except jwt.ImmatureSignatureError:
            raise Unauthorized("the token is not valid yet (nbf)") from None
        except jwt.InvalidAudienceError:
            if settings.audience is None:
                raise Unauthorized(
                    "the token names an audience (aud) and this gateway expects none: "
                    "set jwt_audience, or mint tokens without aud"
                ) from None
            raise Unauthorized(f"the token is not for audience {settings.audience!r}") from None
        except jwt.InvalidIssuerError:
            raise Unauthorized(f"the token is not from issuer {settings.issuer!r}") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthorized(f"the token has no {exc.claim!r} claim") from None
        except jwt.InvalidAlgorithmError:
            raise Unauthorized(
                f"the token's algorithm is not accepted here (accepted: "
                f"{', '.join(settings.algorithms)})"
            ) from None
        except jwt.InvalidSignatureError:
            raise Unauthorized("the token's signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"the token is not valid: {exc}") from None
        except (TypeError, ValueError, KeyError):
            # PyJWT preparing a key of the wrong kind for the token's alg (an
            # ES256 token against an RSA key): the header chose, so refuse.
            raise Unauthorized(
                "the token's algorithm does not fit the key that verifies it"
            ) from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise Unauthorized("the token's 'sub' claim must be a non-empty string")
        try:
            grants = Grants.from_claim(claims.get(settings.grants_claim))
        except ValueError as exc:
            raise Unauthorized(f"the token's {settings.grants_claim!r} claim: {exc}") from None
        expires: float | None = None
        if claims.get("exp") is not None:
            try:  # PyJWT accepts a numeric string too: the deadline must hold for it
                expires = float(claims["exp"])
            except (TypeError, ValueError):
                raise Unauthorized("the token's 'exp' claim is not a number") from None
        token_id = claims.get("jti")
        identity = Identity(
            subject, grants, expires, token_id if isinstance(token_id, str) else None
        )
        if self.revoked(identity):
            raise Forbidden("the token was revoked: do not use it again")
        return identity


def encode_token(
    secret: str,
    subject: str,
    *,
    subscribe: Iterable[str] = (),
    publish: Iterable[str] = (),
    admin: bool = False,
    run: Iterable[str] = (),
    ttl: float = 3600.0,
    audience: str | None = None,
    issuer: str | None = None,
    grants_claim: str = DEFAULT_GRANTS_CLAIM,
    now: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """An HS256 token for *subject* with these grants, valid *ttl* seconds; *admin*
    adds the admin grant (``/metrics`` and ``/admin/…``, see docs/metrics.md); *run*
    names the upstream agents it may run (docs/bridge.md).

    For development, tests and small deployments whose tokens the operator
    mints (``agui-hub token``); production usually has an identity provider.
    """
    import time

    import jwt

    grants = Grants.from_lists(subscribe, publish, run)
    issued = time.time() if now is None else now
    claims: dict[str, Any] = {
        "sub": subject,
        "iat": int(issued),
        "exp": int(issued + ttl),
        grants_claim: {"subscribe": list(grants.subscribe), "publish": list(grants.publish)},
    }
    if admin:
        claims[grants_claim]["admin"] = True
    if grants.run:
        claims[grants_claim]["run"] = list(grants.run)
    if audience is not None:
        claims["aud"] = audience
    if issuer is not None:
        claims["iss"] = issuer
    if extra:
        claims.update(extra)
    return str(jwt.encode(claims, secret, algorithm="HS256"))
