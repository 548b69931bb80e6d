"""Tests of agui_hub.gateway.auth: grant patterns and grants, scoped event ids, where a
handshake carries its token, JWT settings, token verification (HS256, RS256,
ES256, JWKS), revocation, reloading key and revocation files, encode_token.

Keys are generated here with ``cryptography``; key, JWKS and revocation files
are written to ``tmp_path``. Nothing touches the network.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.datastructures import Headers

from agui_hub.errors import Forbidden, Unauthorized
from agui_hub.gateway.auth import (
    ANONYMOUS_SUBJECT,
    ASYMMETRIC_ALGORITHMS,
    MAX_PATTERN_LENGTH,
    MAX_PATTERNS,
    MAX_TOKEN_BYTES,
    Action,
    Anonymous,
    Credentials,
    Grants,
    Identity,
    JWTAuthenticator,
    JWTSettings,
    TokenSource,
    check_pattern,
    credentials_of,
    encode_token,
    pattern_matches,
    redact,
    scoped_event_id,
)

SECRET = "0123456789abcdef0123456789abcdef-test"  # 37 bytes
OTHER_SECRET = "fedcba9876543210fedcba9876543210-other"


# -- keys and files -------------------------------------------------------------------------


@functools.cache
def rsa_key(n: int = 0) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def ec_key(n: int = 0) -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@functools.cache
def ed_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def public_pem(private: Any) -> bytes:
    return private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def write_pem(path: Path, private: Any) -> str:
    path.write_bytes(public_pem(private))
    return str(path)


def jwk_of(private: Any, kid: str) -> dict[str, Any]:
    public = private.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(public, as_dict=True)
    else:
        jwk = jwt.algorithms.ECAlgorithm.to_jwk(public, as_dict=True)
    return {**jwk, "kid": kid}


def jwks_text(keys: dict[str, Any]) -> str:
    return json.dumps({"keys": [jwk_of(private, kid) for kid, private in keys.items()]})


def rewrite(path: Path, text: str) -> None:
    """Write *text* and make sure the modification time differs from before.

    A file rewritten within the file system's timestamp granularity (and with the
    same size) would look unchanged to the authenticator: move mtime on by a second.
    """
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    later = max(before, path.stat().st_mtime_ns) + 1_000_000_000
    os.utime(path, ns=(later, later))


def claims(**changes: Any) -> dict[str, Any]:
    """Valid claims (expiring in ten minutes), with *changes*; ``None`` drops a claim."""
    base: dict[str, Any] = {
        "sub": "agent-7",
        "exp": int(time.time()) + 600,
        "agui": {"subscribe": ["tenant-42/*"], "publish": ["tenant-42/run-1"]},
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def hs(payload: dict[str, Any], secret: str = SECRET, **headers: Any) -> str:
    return jwt.encode(payload, secret, algorithm="HS256", headers=headers or None)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def raw_hs256(payload: dict[str, Any], key: bytes) -> str:
    """An HS256 token HMAC'd with arbitrary bytes (PyJWT refuses a PEM as a secret)."""
    head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64url(json.dumps(payload).encode())
    signature = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(signature)}"


def hs_verifier(**options: Any) -> JWTAuthenticator:
    return JWTAuthenticator(JWTSettings(secret=SECRET, **options))


def refused(authenticator: JWTAuthenticator, token: str, match: str) -> None:
    with pytest.raises(Unauthorized, match=match):
        authenticator.verify(token)


# -- patterns -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern", ["t", "tenant-42/run-1", "tenant-42/*", "*", "x" * MAX_PATTERN_LENGTH]
)
def test_check_pattern_accepts(pattern: str) -> None:
    assert check_pattern(pattern) == pattern


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "non-empty string"),
        (None, "non-empty string"),
        (5, "non-empty string"),
        (["a"], "non-empty string"),
        ("a*b", "may only end a pattern"),
        ("*a", "may only end a pattern"),
        ("**", "may only end a pattern"),
        ("tenant-*/run-1", "may only end a pattern"),
        ("x" * (MAX_PATTERN_LENGTH + 1), f"at most {MAX_PATTERN_LENGTH} characters"),
        ("x" * MAX_PATTERN_LENGTH + "*", f"at most {MAX_PATTERN_LENGTH} characters"),
    ],
)
def test_check_pattern_refuses(pattern: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_pattern(pattern)


@pytest.mark.parametrize(
    ("pattern", "thread", "expected"),
    [
        ("tenant-42/*", "tenant-42/run-1", True),
        ("tenant-42/*", "tenant-42/", True),
        ("tenant-42/*", "tenant-42/a/b", True),
        ("tenant-42/*", "tenant-420/x", False),
        ("tenant-42/*", "tenant-42", False),
        ("tenant-42/*", "xtenant-42/run-1", False),
        ("*", "", True),
        ("*", "anything/at/all", True),
        ("run-1", "run-1", True),
        ("run-1", "run-10", False),
        ("run-1", "run-", False),
        ("run-1", "RUN-1", False),
    ],
)
def test_pattern_matches(pattern: str, thread: str, expected: bool) -> None:
    assert pattern_matches(pattern, thread) is expected


# -- grants ---------------------------------------------------------------------------------


def test_grants_from_claim() -> None:
    grants = Grants.from_claim(
        {"subscribe": ["tenant-42/*", "shared", "tenant-42/*"], "publish": "tenant-42/run-1"}
    )
    assert grants.subscribe == ("tenant-42/*", "shared")  # duplicates dropped, order kept
    assert grants.publish == ("tenant-42/run-1",)  # one pattern may be a plain string
    assert grants.as_json() == {
        "subscribe": ["tenant-42/*", "shared"],
        "publish": ["tenant-42/run-1"],
    }
    assert Grants.from_claim(None) == Grants()
    assert Grants.from_claim({}) == Grants()
    assert Grants.from_claim({"subscribe": None, "publish": []}) == Grants()
    most = [f"t{i}" for i in range(MAX_PATTERNS)]
    assert Grants.from_claim({"subscribe": most}).subscribe == tuple(most)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["tenant-42/*"], "grants are"),
        ("tenant-42/*", "grants are"),
        ({"read": ["x"]}, "unknown grant 'read'"),
        ({"subscribe": 5}, "subscribe is a list of thread patterns"),
        ({"publish": {"x": 1}}, "publish is a list of thread patterns"),
        ({"subscribe": ["a*b"]}, "may only end a pattern"),
        ({"publish": ["ok", ""]}, "non-empty string"),
        ({"publish": [7]}, "non-empty string"),
        (
            {"subscribe": [f"t{i}" for i in range(MAX_PATTERNS + 1)]},
            f"more than {MAX_PATTERNS} patterns",
        ),
    ],
)
def test_grants_from_claim_refuses(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Grants.from_claim(value)


def test_grants_from_lists_checks_patterns() -> None:
    assert Grants.from_lists(["a", "b/*", "a"], []) == Grants(("a", "b/*"), ())
    with pytest.raises(ValueError, match="may only end"):
        Grants.from_lists([], ["*/x"])


def test_grants_keep_reading_and_writing_apart() -> None:
    grants = Grants(subscribe=("tenant-42/*",), publish=("tenant-42/run-1",))
    assert grants.allows(Action.SUBSCRIBE, "tenant-42/run-2")
    assert not grants.allows(Action.PUBLISH, "tenant-42/run-2")
    assert grants.allows(Action.PUBLISH, "tenant-42/run-1")
    assert not grants.allows(Action.SUBSCRIBE, "tenant-420/run-1")
    write_only = Grants(publish=("*",))
    assert write_only.allows(Action.PUBLISH, "x")
    assert not write_only.allows(Action.SUBSCRIBE, "x")
    identity = Identity("agent-7", grants)
    assert identity.allows(Action.SUBSCRIBE, "tenant-42/x")
    assert not identity.allows(Action.PUBLISH, "tenant-42/x")


def test_grants_truth_and_everything() -> None:
    assert not Grants()
    assert Grants(subscribe=("a",))
    assert Grants(publish=("a",))
    everything = Grants.everything()
    for action in Action:
        assert everything.allows(action, "")
        assert everything.allows(action, "any/thread*")
    assert not Grants().allows(Action.SUBSCRIBE, "")


threads = st.text(alphabet="ab/-", max_size=6)


@st.composite
def patterns_for(draw: st.DrawFn, thread: str) -> str:
    """A pattern: unrelated, or (often) an exact id or prefix near *thread*."""
    kind = draw(st.sampled_from(["random", "exact", "prefix", "star"]))
    if kind == "star":
        return "*"
    if kind == "random":
        body = draw(st.text(alphabet="ab/-", min_size=1, max_size=6))
        return body + draw(st.sampled_from(["", "*"]))
    cut = draw(st.integers(0, len(thread)))
    base = thread[:cut] + draw(st.text(alphabet="ab/-", max_size=2))
    if kind == "exact":
        return base or "a"
    return base + "*"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_grants_allows_agrees_with_a_reference(data: st.DataObject) -> None:
    thread = data.draw(threads, label="thread")
    subscribe = data.draw(st.lists(patterns_for(thread), max_size=4), label="subscribe")
    publish = data.draw(st.lists(patterns_for(thread), max_size=4), label="publish")
    grants = Grants.from_lists(subscribe, publish)

    def reference(patterns: list[str]) -> bool:
        # Regular expressions rather than startswith: a different route to the answer.
        for pattern in patterns:
            prefix = pattern.endswith("*")
            regex = re.escape(pattern[:-1]) + ".*" if prefix else re.escape(pattern)
            if re.fullmatch(regex, thread, re.DOTALL):
                return True
        return False

    assert grants.allows(Action.SUBSCRIBE, thread) is reference(subscribe)
    assert grants.allows(Action.PUBLISH, thread) is reference(publish)


# -- scoped event ids ---------------------------------------------------------------------


def test_scoped_event_id_examples() -> None:
    def key(subject: str, event_id: str) -> str:
        return scoped_event_id(Identity(subject, Grants()), event_id)

    assert key("agent-7", "e1") != key("agent-8", "e1")
    assert key("a:b", "c") != key("a", "b:c")
    assert key("a%3Ab", "c") != key("a:b", "c")
    assert key("a%", "3A:c") != key("a:", "c")
    assert key("agent-7", "e1") == key("agent-7", "e1")


def test_unscoped_identity_keeps_event_ids() -> None:
    identity = Identity(ANONYMOUS_SUBJECT, Grants.everything(), anonymous=True, scoped=False)
    for event_id in ["e1", "a:b", "%3A", ""]:
        assert scoped_event_id(identity, event_id) == event_id
    anonymous = Anonymous().anonymous
    assert anonymous is not None
    assert scoped_event_id(anonymous, "x:y") == "x:y"


subjects = st.text(alphabet=":%3Aa25", min_size=1, max_size=6)
event_ids = st.text(alphabet=":%3Aa25", max_size=6)


@settings(max_examples=500, deadline=None)
@given(subjects, event_ids, subjects, event_ids)
def test_scoped_event_ids_never_collide(s1: str, e1: str, s2: str, e2: str) -> None:
    k1 = scoped_event_id(Identity(s1, Grants()), e1)
    k2 = scoped_event_id(Identity(s2, Grants()), e2)
    assert (k1 == k2) == ((s1, e1) == (s2, e2))


# -- where tokens travel --------------------------------------------------------------------


def test_token_in_authorization_header() -> None:
    expected = Credentials("tok.en.1", TokenSource.HEADER)
    assert credentials_of("/", Headers({"Authorization": "Bearer tok.en.1"})) == expected
    assert credentials_of("/", Headers({"authorization": "bearer  tok.en.1 "})) == expected
    assert credentials_of("/", {"Authorization": "Bearer tok.en.1"}) == expected  # plain mapping


def test_token_in_a_subprotocol_among_others() -> None:
    expected = Credentials("tok.en.2", TokenSource.SUBPROTOCOL)
    one_line = Headers({"Sec-WebSocket-Protocol": "agui-hub.v1, agui-hub.bearer.tok.en.2"})
    assert credentials_of("/", one_line) == expected
    lines = Headers()
    lines["Sec-WebSocket-Protocol"] = "agui-hub.v1"
    lines["Sec-WebSocket-Protocol"] = "chat,agui-hub.bearer.tok.en.2"
    assert credentials_of("/", lines) == expected
    assert credentials_of("/", Headers({"Sec-WebSocket-Protocol": "agui-hub.v1, chat"})) is None


def test_token_in_the_query() -> None:
    found = credentials_of("/threads?x=1&access_token=tok.en.3&y=2", Headers())
    assert found == Credentials("tok.en.3", TokenSource.QUERY)
    assert credentials_of("/?access_token=a%2Eb", Headers()) == Credentials(
        "a.b", TokenSource.QUERY
    )
    assert credentials_of("/?token=tok.en.3", Headers()) is None
    assert credentials_of("/", Headers()) is None


def test_token_in_a_cookie_among_others() -> None:
    headers = Headers({"Cookie": "theme=dark; agui_token=tok.en.4; _ga=GA1.2.3"})
    found = credentials_of("/", headers, cookie="agui_token")
    assert found == Credentials("tok.en.4", TokenSource.COOKIE)
    # Cookies split over several header lines (HTTP/2 allows it).
    split = Headers()
    split["Cookie"] = "theme=dark"
    split["Cookie"] = "agui_token=tok.en.4"
    assert credentials_of("/", split, cookie="agui_token") == found
    # Only the configured cookie, and only when one is configured.
    assert credentials_of("/", headers, cookie="other") is None
    assert credentials_of("/", headers) is None
    assert credentials_of("/", headers, cookie="") is None


@pytest.mark.parametrize(
    "before",
    [
        'prefs={"lang":"en","n":2}',  # JSON values are common in browsers' cookie jars
        "greeting=hello world",
        "name=José",
    ],
)
def test_token_cookie_is_found_after_a_cookie_simplecookie_dislikes(before: str) -> None:
    """Another application's cookie on the same domain must not hide the token."""
    headers = Headers({"Cookie": f"{before}; agui_token=tok.en.4"})
    found = credentials_of("/", headers, cookie="agui_token")
    assert found == Credentials("tok.en.4", TokenSource.COOKIE)


def test_where_tokens_are_looked_for_first() -> None:
    """Header, then subprotocol, then query, then cookie: each found while the
    ones before it are absent, and ignored while one of them is there."""
    headers = {
        "Authorization": "Bearer from-header",
        "Sec-WebSocket-Protocol": "agui-hub.v1, agui-hub.bearer.from-subprotocol",
        "Cookie": "agui_token=from-cookie",
    }
    path = "/?access_token=from-query"

    def found() -> Credentials | None:
        return credentials_of(path, Headers(headers), cookie="agui_token")

    assert found() == Credentials("from-header", TokenSource.HEADER)
    del headers["Authorization"]
    assert found() == Credentials("from-subprotocol", TokenSource.SUBPROTOCOL)
    del headers["Sec-WebSocket-Protocol"]
    assert found() == Credentials("from-query", TokenSource.QUERY)
    path = "/?other=1"
    assert found() == Credentials("from-cookie", TokenSource.COOKIE)
    del headers["Cookie"]
    assert found() is None


@pytest.mark.parametrize(
    ("path", "headers", "message"),
    [
        ("/", {"Authorization": "Basic dXNlcjpwYXNz"}, "must be 'Bearer <token>'"),
        ("/", {"Authorization": "Token abc"}, "must be 'Bearer <token>'"),
        ("/", {"Authorization": "Bearer"}, "must be 'Bearer <token>'"),
        ("/", {"Authorization": "Bearer    "}, "must be 'Bearer <token>'"),
        ("/", {"Authorization": ""}, "must be 'Bearer <token>'"),
        ("/", {"Sec-WebSocket-Protocol": "agui-hub.v1, agui-hub.bearer."}, "empty"),
        ("/?access_token=", {}, "empty"),
        ("/?access_token=a&access_token=b", {}, "more than once"),
        ("/?access_token=a&access_token=a", {}, "more than once"),
        ("/", {"Cookie": "agui_token="}, "empty"),
        # A malformed header is refused even when another place holds a good token.
        ("/?access_token=good", {"Authorization": "Basic abc"}, "Bearer"),
    ],
)
def test_malformed_credentials_are_refused(
    path: str, headers: dict[str, str], message: str
) -> None:
    with pytest.raises(Unauthorized, match=re.escape(message)):
        credentials_of(path, Headers(headers), cookie="agui_token")


@pytest.mark.parametrize("source", list(TokenSource)[:4])
def test_tokens_over_8_kib_are_refused(source: TokenSource) -> None:
    def carry(token: str) -> Credentials | None:
        if source is TokenSource.HEADER:
            return credentials_of("/", Headers({"Authorization": f"Bearer {token}"}))
        if source is TokenSource.SUBPROTOCOL:
            value = f"agui-hub.bearer.{token}"
            return credentials_of("/", Headers({"Sec-WebSocket-Protocol": value}))
        if source is TokenSource.QUERY:
            return credentials_of(f"/?access_token={token}", Headers())
        return credentials_of("/", Headers({"Cookie": f"t={token}"}), cookie="t")

    assert MAX_TOKEN_BYTES == 8 * 1024
    assert carry("a" * MAX_TOKEN_BYTES) == Credentials("a" * MAX_TOKEN_BYTES, source)
    with pytest.raises(Unauthorized, match=f"longer than {MAX_TOKEN_BYTES} bytes"):
        carry("a" * (MAX_TOKEN_BYTES + 1))


def test_redact_hides_tokens_in_paths_and_subprotocols() -> None:
    assert redact("/?x=1&access_token=eyJ.a.b&y=2") == "/?x=1&access_token=[redacted]&y=2"
    assert redact("agui-hub.v1, agui-hub.bearer.eyJ.a.b") == (
        "agui-hub.v1, agui-hub.bearer.[redacted]"
    )
    assert redact("/threads?from=start") == "/threads?from=start"
    assert "eyJ" not in redact("GET /?access_token=eyJ.a.b HTTP/1.1")


# -- anonymous ------------------------------------------------------------------------------


async def test_anonymous_authenticator() -> None:
    everyone = Anonymous()
    assert everyone.anonymous == Identity(
        ANONYMOUS_SUBJECT, Grants.everything(), anonymous=True, scoped=False
    )
    narrow = Anonymous(Grants(subscribe=("public/*",)))
    assert narrow.anonymous is not None
    assert narrow.anonymous.allows(Action.SUBSCRIBE, "public/x")
    assert not narrow.anonymous.allows(Action.PUBLISH, "public/x")
    nothing = Anonymous(Grants()).anonymous
    assert nothing is not None and nothing.grants == Grants()
    with pytest.raises(Unauthorized, match="does not take tokens"):
        await everyone.authenticate(Credentials("x", TokenSource.HEADER))
    assert everyone.anonymous is not None
    assert not everyone.revoked(everyone.anonymous)
    everyone.reload()


# -- JWT settings -----------------------------------------------------------------------------


def test_jwt_settings_need_exactly_one_key_source(tmp_path: Path) -> None:
    pem = write_pem(tmp_path / "k.pem", rsa_key())
    for kwargs in [
        {},
        {"secret": SECRET, "public_key_file": pem},
        {"public_key_file": pem, "jwks_file": pem},
        {"secret": SECRET, "public_key_file": pem, "jwks_file": pem},
    ]:
        with pytest.raises(ValueError, match="exactly one of"):
            JWTSettings(**kwargs)


def test_jwt_settings_defaults_by_key_kind(tmp_path: Path) -> None:
    assert JWTSettings(secret=SECRET).algorithms == ("HS256",)
    pem = write_pem(tmp_path / "k.pem", rsa_key())
    assert JWTSettings(public_key_file=pem).algorithms == ASYMMETRIC_ALGORITHMS
    assert JWTSettings(jwks_file=pem).algorithms == ASYMMETRIC_ALGORITHMS
    assert "HS256" not in ASYMMETRIC_ALGORITHMS


def test_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        JWTSettings(secret="x" * 31)
    JWTSettings(secret="x" * 32)
    JWTSettings(secret="é" * 16)  # 16 characters, 32 bytes: bytes are what count


@pytest.mark.parametrize("alg", ["HS256", "HS512", "none"])
def test_public_keys_refuse_symmetric_algorithms(tmp_path: Path, alg: str) -> None:
    pem = write_pem(tmp_path / "k.pem", rsa_key())
    with pytest.raises(ValueError, match=f"{alg!r} cannot be used with public keys"):
        JWTSettings(public_key_file=pem, algorithms=("RS256", alg))


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA", "none"])
def test_secrets_refuse_asymmetric_algorithms(alg: str) -> None:
    with pytest.raises(ValueError, match=f"{alg!r} cannot be used with a secret"):
        JWTSettings(secret=SECRET, algorithms=(alg,))


@pytest.mark.parametrize("leeway", [-1.0, float("nan"), float("inf")])
def test_bad_leeway_is_refused(leeway: float) -> None:
    with pytest.raises(ValueError, match="leeway"):
        JWTSettings(secret=SECRET, leeway=leeway)


def test_grants_claim_needs_a_name() -> None:
    with pytest.raises(ValueError, match="grants claim"):
        JWTSettings(secret=SECRET, grants_claim="")


def test_unusable_key_files_stop_the_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read JWT key file"):
        JWTAuthenticator(JWTSettings(public_key_file=str(tmp_path / "missing.pem")))
    garbage = tmp_path / "garbage"
    garbage.write_text("not a key\n")
    with pytest.raises(ValueError, match="cannot be used"):
        JWTAuthenticator(JWTSettings(public_key_file=str(garbage)))
    with pytest.raises(ValueError, match="cannot be used"):
        JWTAuthenticator(JWTSettings(jwks_file=str(garbage)))
    private = tmp_path / "private.pem"
    private.write_bytes(
        rsa_key().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(ValueError, match="cannot be used"):
        JWTAuthenticator(JWTSettings(public_key_file=str(private)))
    with pytest.raises(ValueError, match="cannot read revocation file"):
        hs_verifier(revocation_file=str(tmp_path / "missing.txt"))


# -- verification ---------------------------------------------------------------------------


def test_hs256_token_gives_its_identity() -> None:
    exp = int(time.time()) + 600
    identity = hs_verifier().verify(hs(claims(exp=exp, jti="tok-1")))
    assert identity == Identity(
        "agent-7",
        Grants(("tenant-42/*",), ("tenant-42/run-1",)),
        expires=float(exp),
        token_id="tok-1",
    )
    assert identity.scoped and not identity.anonymous
    assert identity.allows(Action.SUBSCRIBE, "tenant-42/run-9")
    assert not identity.allows(Action.PUBLISH, "tenant-42/run-9")


def test_token_without_grants_claim_grants_nothing() -> None:
    identity = hs_verifier().verify(hs(claims(agui=None)))
    assert identity.grants == Grants()


def test_grants_claim_name_is_configurable() -> None:
    token = hs(claims(agui=None, perms={"subscribe": ["x"]}))
    assert hs_verifier(grants_claim="perms").verify(token).grants == Grants(("x",), ())


async def test_authenticate_is_verify() -> None:
    identity = await hs_verifier().authenticate(Credentials(hs(claims()), TokenSource.FRAME))
    assert identity.subject == "agent-7"


@pytest.mark.parametrize(("key", "alg"), [(rsa_key, "RS256"), (ec_key, "ES256"), (ed_key, "EdDSA")])
def test_public_key_tokens(tmp_path: Path, key: Any, alg: str) -> None:
    verifier = JWTAuthenticator(JWTSettings(public_key_file=write_pem(tmp_path / "k.pem", key())))
    identity = verifier.verify(jwt.encode(claims(sub="svc"), key(), algorithm=alg))
    assert identity.subject == "svc"
    assert identity.grants.subscribe == ("tenant-42/*",)
    # The same kind of key, another key pair: the signature does not verify.
    other = rsa_key(1) if alg == "RS256" else ec_key(1) if alg == "ES256" else None
    if other is not None:
        refused(verifier, jwt.encode(claims(), other, algorithm=alg), "signature does not verify")


def test_jwks_picks_the_key_by_kid(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(jwks_text({"r1": rsa_key(), "e1": ec_key()}))
    verifier = JWTAuthenticator(JWTSettings(jwks_file=str(path)))
    rs = jwt.encode(claims(sub="r"), rsa_key(), algorithm="RS256", headers={"kid": "r1"})
    es = jwt.encode(claims(sub="e"), ec_key(), algorithm="ES256", headers={"kid": "e1"})
    assert verifier.verify(rs).subject == "r"
    assert verifier.verify(es).subject == "e"
    unknown = jwt.encode(claims(), rsa_key(), algorithm="RS256", headers={"kid": "r9"})
    refused(verifier, unknown, "key id 'r9' is not in the JWKS")
    # Without a kid, a JWKS of two keys cannot say which one.
    refused(verifier, jwt.encode(claims(), rsa_key(), algorithm="RS256"), "key id None")
    # Another RSA key under a known kid: the signature does not verify.
    forged = jwt.encode(claims(), rsa_key(1), algorithm="RS256", headers={"kid": "r1"})
    refused(verifier, forged, "signature does not verify")


def test_jwks_of_one_key_serves_tokens_without_kid(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(jwks_text({"only": ec_key()}))
    verifier = JWTAuthenticator(JWTSettings(jwks_file=str(path)))
    assert verifier.verify(jwt.encode(claims(), ec_key(), algorithm="ES256")).subject == "agent-7"


def test_expiry_and_leeway() -> None:
    past = int(time.time()) - 10
    refused(hs_verifier(leeway=0), hs(claims(exp=past)), "expired")
    assert hs_verifier(leeway=60).verify(hs(claims(exp=past))).expires == float(past)
    refused(hs_verifier(leeway=60), hs(claims(exp=past - 120)), "expired")


def test_not_before() -> None:
    future = int(time.time()) + 120
    refused(hs_verifier(leeway=0), hs(claims(nbf=future)), r"not valid yet \(nbf\)")
    refused(hs_verifier(leeway=30), hs(claims(nbf=future)), r"not valid yet \(nbf\)")
    assert hs_verifier(leeway=300).verify(hs(claims(nbf=future))).subject == "agent-7"
    assert hs_verifier(leeway=0).verify(hs(claims(nbf=int(time.time()) - 5)))


def test_audience_is_checked_when_configured() -> None:
    verifier = hs_verifier(audience="agui-hub")
    assert verifier.verify(hs(claims(aud="agui-hub"))).subject == "agent-7"
    assert verifier.verify(hs(claims(aud=["other", "agui-hub"]))).subject == "agent-7"
    refused(verifier, hs(claims(aud="other")), "not for audience 'agui-hub'")
    refused(verifier, hs(claims()), "'aud'")
    # Not configured: a token that names an audience is for another service.
    refused(hs_verifier(), hs(claims(aud="other")), "expects none")
    assert hs_verifier().verify(hs(claims())).subject == "agent-7"


def test_issuer_is_checked_when_configured() -> None:
    verifier = hs_verifier(issuer="https://idp.example")
    assert verifier.verify(hs(claims(iss="https://idp.example"))).subject == "agent-7"
    refused(verifier, hs(claims(iss="https://evil.example")), "not from issuer")
    refused(verifier, hs(claims()), "'iss'")
    assert hs_verifier().verify(hs(claims(iss="anyone"))).subject == "agent-7"


def test_required_claims() -> None:
    verifier = hs_verifier()
    refused(verifier, hs(claims(sub=None)), "no 'sub' claim")
    refused(verifier, hs(claims(exp=None)), "no 'exp' claim")
    refused(verifier, hs(claims(sub="")), "'sub' claim must be a non-empty string")
    refused(verifier, hs(claims(sub=42)), "not valid")
    forever = hs_verifier(require_exp=False).verify(hs(claims(exp=None)))
    assert forever.expires is None


@pytest.mark.parametrize(
    ("grants", "message"),
    [
        ({"subscribe": ["a*b"]}, "may only end a pattern"),
        (["tenant-42/*"], "grants are"),
        ({"admin": "yes"}, "the admin grant is true or false"),
        ({"publish": 5}, "publish is a list"),
    ],
)
def test_malformed_grants_claim_is_refused_naming_it(grants: Any, message: str) -> None:
    with pytest.raises(Unauthorized, match="'agui' claim") as caught:
        hs_verifier().verify(hs(claims(agui=grants)))
    assert message in str(caught.value)
    token = hs(claims(agui=None, perms=grants))
    refused(hs_verifier(grants_claim="perms"), token, "'perms' claim")


def test_unsigned_tokens_are_refused(tmp_path: Path) -> None:
    unsigned = jwt.encode(claims(), None, algorithm="none")
    refused(hs_verifier(), unsigned, "algorithm is not accepted")
    pem = write_pem(tmp_path / "k.pem", rsa_key())
    refused(JWTAuthenticator(JWTSettings(public_key_file=pem)), unsigned, "not accepted")


def test_token_signed_with_another_secret_is_refused() -> None:
    refused(hs_verifier(), hs(claims(), OTHER_SECRET), "signature does not verify")


def test_hs256_token_is_refused_by_a_public_key_verifier(tmp_path: Path) -> None:
    """Algorithm confusion: HMAC with the (public) PEM as the secret must not pass."""
    pem_path = write_pem(tmp_path / "k.pem", rsa_key())
    verifier = JWTAuthenticator(JWTSettings(public_key_file=pem_path, algorithms=("RS256",)))
    forged = raw_hs256(claims(), public_pem(rsa_key()))
    refused(verifier, forged, "algorithm is not accepted here")
    # The default (all asymmetric algorithms) refuses it just the same.
    refused(JWTAuthenticator(JWTSettings(public_key_file=pem_path)), forged, "not accepted")


def test_token_for_another_key_kind_is_unauthorized(tmp_path: Path) -> None:
    """A token whose ``alg`` needs another kind of key than the configured one is
    refused with Unauthorized (never an unexpected exception), with a key file
    and with a JWKS."""
    verifier = JWTAuthenticator(JWTSettings(public_key_file=write_pem(tmp_path / "k", rsa_key())))
    with pytest.raises(Unauthorized):
        verifier.verify(jwt.encode(claims(), ec_key(), algorithm="ES256"))
    with pytest.raises(Unauthorized):
        verifier.verify(jwt.encode(claims(), ed_key(), algorithm="EdDSA"))
    path = tmp_path / "jwks.json"
    path.write_text(jwks_text({"r1": rsa_key()}))
    by_kid = JWTAuthenticator(JWTSettings(jwks_file=str(path)))
    with pytest.raises(Unauthorized):
        by_kid.verify(jwt.encode(claims(), ec_key(), algorithm="ES256", headers={"kid": "r1"}))


@pytest.mark.parametrize(
    "token", ["", "not-a-jwt", "a.b.c", "x" * (MAX_TOKEN_BYTES + 1), "e30.e30."]
)
def test_garbage_tokens_are_refused(token: str) -> None:
    with pytest.raises(Unauthorized):
        hs_verifier().verify(token)


# -- revocation -------------------------------------------------------------------------------


def test_revocation_by_jti_and_by_sub(tmp_path: Path) -> None:
    path = tmp_path / "revoked.txt"
    path.write_text("# revoked tokens\n\n  tok-bad  \nagent-gone\n# tok-good\n")
    verifier = hs_verifier(revocation_file=str(path))
    with pytest.raises(Forbidden, match="revoked"):
        verifier.verify(hs(claims(jti="tok-bad")))
    with pytest.raises(Forbidden, match="revoked"):
        verifier.verify(hs(claims(sub="agent-gone", jti="tok-new")))
    assert verifier.verify(hs(claims(jti="tok-good"))).token_id == "tok-good"
    # Comment lines name nothing, not even a token id spelled like the comment.
    assert verifier.verify(hs(claims(jti="# tok-good"))).token_id == "# tok-good"
    assert verifier.verify(hs(claims(sub="# revoked tokens"))).subject == "# revoked tokens"
    assert verifier.verify(hs(claims())).token_id is None
    assert verifier.revoked(Identity("agent-gone", Grants()))
    assert verifier.revoked(Identity("agent-7", Grants(), token_id="tok-bad"))
    assert not verifier.revoked(Identity("agent-7", Grants(), token_id="tok-good"))


def test_anonymous_identity_is_never_revoked(tmp_path: Path) -> None:
    path = tmp_path / "revoked.txt"
    path.write_text(f"{ANONYMOUS_SUBJECT}\n")
    verifier = hs_verifier(revocation_file=str(path), anonymous=Grants(("public/*",), ()))
    anonymous = verifier.anonymous
    assert anonymous is not None
    assert anonymous.anonymous and anonymous.subject == ANONYMOUS_SUBJECT
    assert anonymous.grants == Grants(("public/*",), ())
    assert not verifier.revoked(anonymous)
    assert hs_verifier().anonymous is None


def test_reload_picks_up_a_changed_revocation_file(tmp_path: Path) -> None:
    path = tmp_path / "revoked.txt"
    path.write_text("someone-else\n")
    verifier = hs_verifier(revocation_file=str(path))
    token = hs(claims(jti="tok-1"))
    identity = verifier.verify(token)
    verifier.reload()  # unchanged: nothing happens
    assert not verifier.revoked(identity)
    rewrite(path, "tok-1\n")
    assert not verifier.revoked(identity)  # not before reload()
    verifier.reload()
    assert verifier.revoked(identity)
    with pytest.raises(Forbidden):
        verifier.verify(token)
    rewrite(path, "")
    verifier.reload()
    assert verifier.verify(token) == identity


def test_reload_of_a_same_size_revocation_file(tmp_path: Path) -> None:
    """Same size, rewritten: only the modification time tells the change."""
    path = tmp_path / "revoked.txt"
    path.write_text("tok-1\n")
    verifier = hs_verifier(revocation_file=str(path))
    rewrite(path, "tok-2\n")
    verifier.reload()
    assert verifier.verify(hs(claims(jti="tok-1"))).token_id == "tok-1"
    with pytest.raises(Forbidden):
        verifier.verify(hs(claims(jti="tok-2")))


def test_broken_revocation_file_keeps_the_old_list(tmp_path: Path) -> None:
    path = tmp_path / "revoked.txt"
    path.write_text("tok-1\n")
    verifier = hs_verifier(revocation_file=str(path))
    path.unlink()
    verifier.reload()  # a missing file keeps what was loaded
    with pytest.raises(Forbidden):
        verifier.verify(hs(claims(jti="tok-1")))
    path.mkdir()  # changed, and cannot be read
    with pytest.raises(ValueError, match="cannot read revocation file"):
        verifier.reload()
    with pytest.raises(Forbidden):
        verifier.verify(hs(claims(jti="tok-1")))


def test_reload_picks_up_a_rotated_jwks(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(jwks_text({"k1": rsa_key(0)}))
    verifier = JWTAuthenticator(JWTSettings(jwks_file=str(path)))
    old = jwt.encode(claims(sub="old"), rsa_key(0), algorithm="RS256", headers={"kid": "k1"})
    new = jwt.encode(claims(sub="new"), rsa_key(1), algorithm="RS256", headers={"kid": "k2"})
    assert verifier.verify(old).subject == "old"
    refused(verifier, new, "'k2' is not in the JWKS")
    rewrite(path, jwks_text({"k2": rsa_key(1)}))
    verifier.reload()
    assert verifier.verify(new).subject == "new"
    refused(verifier, old, "'k1' is not in the JWKS")


def test_broken_jwks_keeps_the_old_keys(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(jwks_text({"k1": ec_key()}))
    verifier = JWTAuthenticator(JWTSettings(jwks_file=str(path)))
    token = jwt.encode(claims(), ec_key(), algorithm="ES256", headers={"kid": "k1"})
    for broken in ['{"keys": [', '{"keys": []}', '{"keys": [{"kty": "nonsense"}]}']:
        rewrite(path, broken)
        with pytest.raises(ValueError, match="cannot be used"):
            verifier.reload()
        assert verifier.verify(token).subject == "agent-7"


def test_public_key_file_rotation_and_breakage(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    write_pem(path, ec_key(0))
    verifier = JWTAuthenticator(JWTSettings(public_key_file=str(path)))
    old = jwt.encode(claims(sub="old"), ec_key(0), algorithm="ES256")
    new = jwt.encode(claims(sub="new"), ec_key(1), algorithm="ES256")
    assert verifier.verify(old).subject == "old"
    rewrite(path, "-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ValueError, match="cannot be used"):
        verifier.reload()
    assert verifier.verify(old).subject == "old"
    rewrite(path, public_pem(ec_key(1)).decode())
    verifier.reload()
    assert verifier.verify(new).subject == "new"
    refused(verifier, old, "signature does not verify")


# -- encode_token ---------------------------------------------------------------------------


def test_encode_token_round_trip() -> None:
    now = time.time()
    token = encode_token(
        SECRET,
        "agent-7",
        subscribe=["tenant-42/*", "tenant-42/*"],
        publish=["tenant-42/run-1"],
        ttl=600,
        audience="agui-hub",
        issuer="ops",
        now=now,
        extra={"jti": "tok-9"},
    )
    verifier = hs_verifier(audience="agui-hub", issuer="ops")
    identity = verifier.verify(token)
    assert identity == Identity(
        "agent-7",
        Grants(("tenant-42/*",), ("tenant-42/run-1",)),
        expires=float(int(now + 600)),
        token_id="tok-9",
    )
    payload = jwt.decode(token, SECRET, algorithms=["HS256"], audience="agui-hub")
    assert payload["iat"] == int(now)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


def test_encode_token_options() -> None:
    token = encode_token(SECRET, "s", subscribe=["x"], grants_claim="perms")
    assert hs_verifier(grants_claim="perms").verify(token).grants == Grants(("x",), ())
    assert hs_verifier().verify(token).grants == Grants()  # under another claim name
    refused(hs_verifier(leeway=0), encode_token(SECRET, "s", ttl=-5), "expired")
    with pytest.raises(ValueError, match="may only end"):
        encode_token(SECRET, "s", publish=["a*b"])
