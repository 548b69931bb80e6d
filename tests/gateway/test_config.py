"""Tests of agui_hub.gateway.config: GatewayConfig's checks, from_env (defaults < TOML file <
AGUI_HUB_* variables < overrides), setting_kinds, build_authenticator, is_loopback,
raise_open_file_limit and SETTING_GROUPS.

``from_env`` is given its environment as a dict, so the test process's
variables never leak in; the open-file limit is raised in a child process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agui_hub.gateway.auth import (
    ANONYMOUS_SUBJECT,
    Action,
    Anonymous,
    Grants,
    JWTAuthenticator,
    encode_token,
)
from agui_hub.gateway.config import (
    SETTING_GROUPS,
    GatewayConfig,
    build_authenticator,
    is_loopback,
    setting_kinds,
    split_list,
)

ROOT = Path(__file__).resolve().parents[2]
SECRET = "0123456789abcdef0123456789abcdef-test"
FIELDS = [item.name for item in dataclasses.fields(GatewayConfig)]


def from_env(environ: dict[str, str] | None = None, **kwargs: Any) -> GatewayConfig:
    """GatewayConfig.from_env with nothing from the test process's environment."""
    return GatewayConfig.from_env({} if environ is None else environ, **kwargs)


def toml_file(tmp_path: Path, text: str, name: str = "gateway.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- check() --------------------------------------------------------------------------------


def test_defaults_pass_check() -> None:
    config = GatewayConfig()
    config.check()
    assert config.host == "127.0.0.1"
    assert config.port == 8765
    assert not config.jwt_configured
    assert from_env() == config


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("port", 99999, "port 99999"),
        ("port", -5, "port -5"),
        ("port", 65536, "port 65536"),
        ("max_frame_bytes", 0, "max_frame_bytes must be at least 1"),
        ("max_event_bytes", -1, "max_event_bytes must be at least 1"),
        ("max_subscriptions", 0, "max_subscriptions must be at least 1"),
        ("send_queue_bytes", 0, "send_queue_bytes must be at least 1"),
        ("state_max_bytes", 0, "state_max_bytes must be at least 1"),
        ("state_max_depth", 0, "state_max_depth must be at least 1"),
        ("max_connections", 0, "max_connections must be at least 1"),
        ("max_connections_per_address", 0, "max_connections_per_address must be at least 1"),
        ("idle_timeout", 0.0, "idle_timeout must be a positive number"),
        ("open_timeout", -1.0, "open_timeout must be a positive number"),
        ("auth_timeout", math.nan, "auth_timeout must be a positive number"),
        ("max_commands_per_second", -1.0, "max_commands_per_second must be a positive number"),
        ("max_events_per_second", 0.0, "max_events_per_second must be a positive number"),
        ("max_events_per_second", math.inf, "max_events_per_second must be a positive number"),
        ("ping_interval", 0.0, "ping_interval must be a positive number"),
        ("ping_timeout", -1.0, "ping_timeout must be a positive number"),
        ("write_timeout", math.nan, "write_timeout must be a positive number"),
        ("jwt_leeway", -0.5, "jwt_leeway"),
        ("jwt_leeway", math.nan, "jwt_leeway"),
        ("tls_cert", "cert.pem", "tls_cert and tls_key"),
        ("tls_key", "key.pem", "tls_cert and tls_key"),
    ],
)
def test_out_of_range_settings_are_refused(name: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        GatewayConfig(**{name: value})
    config = GatewayConfig()
    setattr(config, name, value)  # changed after construction: check() still catches it
    with pytest.raises(ValueError, match=re.escape(message)):
        config.check()


def test_edge_values_are_accepted() -> None:
    GatewayConfig(port=0)
    GatewayConfig(port=65535)
    GatewayConfig(ping_interval=None, ping_timeout=None, write_timeout=None)
    GatewayConfig(jwt_leeway=0.0)
    GatewayConfig(max_connections=1, state_max_depth=1, idle_timeout=0.001)
    GatewayConfig(tls_cert="cert.pem", tls_key="key.pem")


def test_jwt_configured() -> None:
    for name in ("jwt_secret", "jwt_secret_file", "jwt_public_key_file", "jwt_jwks_file"):
        assert GatewayConfig(**{name: "x"}).jwt_configured
    assert not GatewayConfig(jwt_cookie="t", jwt_audience="a").jwt_configured


# -- setting kinds and groups ---------------------------------------------------------------


def test_setting_kinds() -> None:
    kinds = setting_kinds()
    assert list(kinds) == FIELDS
    assert set(kinds.values()) <= {int, float, bool, str}
    assert kinds["port"] is int
    assert kinds["host"] is str
    assert kinds["ping_interval"] is float  # float | None: the float
    assert kinds["idle_timeout"] is float
    assert kinds["allow_anonymous"] is bool
    assert kinds["anonymous_subscribe"] is str  # str | None: the str
    for name, kind in kinds.items():
        default = getattr(GatewayConfig(), name)
        assert default is None or type(default) is kind, name


def test_setting_groups_list_every_setting_once() -> None:
    listed = [name for group in SETTING_GROUPS.values() for name in group]
    assert sorted(listed) == sorted(FIELDS)
    assert len(listed) == len(set(listed))
    for group in SETTING_GROUPS.values():
        for name, help_line in group.items():
            assert help_line.strip(), name


# -- environment variables --------------------------------------------------------------------


def test_environment_values_by_kind() -> None:
    config = from_env(
        {
            "AGUI_HUB_PORT": "9000",
            "AGUI_HUB_HOST": "0.0.0.0",
            "AGUI_HUB_IDLE_TIMEOUT": "12.5",
            "AGUI_HUB_MAX_EVENTS_PER_SECOND": "300",
            "AGUI_HUB_ALLOW_ANONYMOUS": "yes",
            "AGUI_HUB_PING_INTERVAL": "none",
            "AGUI_HUB_WRITE_TIMEOUT": "OFF",
            "AGUI_HUB_PING_TIMEOUT": "7",
            "AGUI_HUB_ANONYMOUS_SUBSCRIBE": "public/*, news",
            "AGUI_HUB_ANONYMOUS_PUBLISH": "",
            "AGUI_HUB_UNRELATED": "ignored",
            "PORT": "1",
        }
    )
    assert config.port == 9000
    assert config.host == "0.0.0.0"
    assert config.idle_timeout == 12.5
    assert config.max_events_per_second == 300.0
    assert config.allow_anonymous is True
    assert config.ping_interval is None
    assert config.write_timeout is None
    assert config.ping_timeout == 7.0
    assert config.anonymous_subscribe == "public/*, news"
    assert config.anonymous_publish == ""  # set but empty: no patterns, not the default
    assert config.jwt_leeway == 30.0  # untouched


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
        ("", False),
    ],
)
def test_environment_booleans(raw: str, expected: bool) -> None:
    config = from_env({"AGUI_HUB_REQUIRE_DURABLE_STORE": raw})
    assert config.require_durable_store is expected


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        ("AGUI_HUB_PORT", "abc", "AGUI_HUB_PORT='abc' is not an integer"),
        ("AGUI_HUB_PORT", "80.0", "AGUI_HUB_PORT='80.0' is not an integer"),
        ("AGUI_HUB_MAX_CONNECTIONS", "", "AGUI_HUB_MAX_CONNECTIONS='' is not an integer"),
        ("AGUI_HUB_IDLE_TIMEOUT", "soon", "AGUI_HUB_IDLE_TIMEOUT='soon' is not a number"),
        (
            "AGUI_HUB_ALLOW_ANONYMOUS",
            "maybe",
            "AGUI_HUB_ALLOW_ANONYMOUS='maybe' is not true or false",
        ),
        ("AGUI_HUB_PORT", "99999", "port 99999"),
        ("AGUI_HUB_IDLE_TIMEOUT", "nan", "idle_timeout must be a positive number"),
        ("AGUI_HUB_MAX_COMMANDS_PER_SECOND", "-3", "max_commands_per_second must be a positive"),
        ("AGUI_HUB_PING_INTERVAL", "inf", "ping_interval must be a positive number"),
    ],
)
def test_bad_environment_values_are_refused(variable: str, raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        from_env({variable: raw})


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("idle_timeout", "none"),
        ("jwt_leeway", "off"),
        ("max_commands_per_second", "none"),
        ("auth_timeout", "off"),
    ],
)
def test_none_for_a_required_number_is_a_value_error(name: str, raw: str) -> None:
    """'none'/'off' switch off an optional number (ping_interval); for a setting
    that cannot be off, from_env promises a ValueError naming the setting."""
    with pytest.raises(ValueError, match=f"(?i){name}"):  # the setting or its variable
        from_env({f"AGUI_HUB_{name.upper()}": raw})


def test_every_setting_can_come_from_the_environment() -> None:
    samples = {int: ("7", 7), float: ("2.5", 2.5), bool: ("true", True), str: ("x", "x")}
    choices = {
        "raw_events": ("strip", "strip"),  # one of a few words
        "presence": ("count", "count"),
        "presence_ttl": ("30", 30.0),  # at least three intervals (one second each)
    }
    for name, kind in setting_kinds().items():
        if name in {"tls_cert", "tls_key"}:
            continue  # only as a pair, below
        raw, value = choices.get(name, samples[kind])
        config = from_env({f"AGUI_HUB_{name.upper()}": raw})
        assert getattr(config, name) == value, name
    pair = from_env({"AGUI_HUB_TLS_CERT": "c.pem", "AGUI_HUB_TLS_KEY": "k.pem"})
    assert (pair.tls_cert, pair.tls_key) == ("c.pem", "k.pem")


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"presence": "on"}, "presence is full, count or off"),
        ({"presence_interval": 0.05}, "presence_interval"),
        ({"presence_ttl": 2.0, "presence_interval": 1.0}, "a third of presence_ttl"),
    ],
)
def test_presence_settings_are_checked(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        GatewayConfig(**settings)
    assert GatewayConfig(presence="off", presence_ttl=3.0, presence_interval=0.1).presence == "off"


def test_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGUI_HUB_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AGUI_HUB_PORT", "9100")
    assert GatewayConfig.from_env().port == 9100


# -- TOML file --------------------------------------------------------------------------------


def test_config_file_values(tmp_path: Path) -> None:
    path = toml_file(
        tmp_path,
        """
        host = "0.0.0.0"
        port = 9001
        allow_anonymous = true
        idle_timeout = 60          # an integer for a float setting
        ping_interval = 5.5
        max-connections = 50       # dashes as in the flags
        allowed_origins = ["https://a.example", "https://b.example"]
        anonymous_subscribe = ["public/*"]
        anonymous_publish = []
        jwt_algorithms = "RS256,ES256"
        """,
    )
    config = from_env(config_file=path)
    assert config.host == "0.0.0.0"
    assert config.port == 9001
    assert config.allow_anonymous is True
    assert config.idle_timeout == 60.0
    assert isinstance(config.idle_timeout, float)
    assert config.ping_interval == 5.5
    assert config.max_connections == 50
    assert config.allowed_origins == "https://a.example,https://b.example"
    assert split_list(config.allowed_origins) == ["https://a.example", "https://b.example"]
    assert config.anonymous_subscribe == "public/*"
    assert config.anonymous_publish == ""
    assert config.jwt_algorithms == "RS256,ES256"
    assert config.max_subscriptions == GatewayConfig().max_subscriptions  # not in the file


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 'blue'", "unknown setting 'colour'"),
        ("[gateway]\nport = 1", "unknown setting 'gateway'"),
        ("port = '80'", "port = '80' is not an integer"),
        ("port = true", "port = True is not an integer"),
        ("port = 80.0", "port = 80.0 is not an integer"),
        ("idle_timeout = 'fast'", "idle_timeout = 'fast' is not a number"),
        ("idle_timeout = true", "idle_timeout = True is not a number"),
        ("allow_anonymous = 1", "allow_anonymous = 1 is not true or false"),
        ("host = 5", "host = 5 is not a string"),
        ("port = ", "is not valid TOML"),
        ("port = 70000", "port 70000"),
        ("max_subscriptions = 0", "max_subscriptions must be at least 1"),
    ],
)
def test_bad_config_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = toml_file(tmp_path, text)
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        from_env(config_file=path)
    if "unknown" in message or " is not " in message:
        assert path in str(caught.value)  # says which file


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read config file"):
        from_env(config_file=str(tmp_path / "nope.toml"))


def test_precedence_defaults_file_environment_overrides(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "port = 9001\nhost = '0.0.0.0'\nidle_timeout = 40\n")
    env = {"AGUI_HUB_PORT": "9002", "AGUI_HUB_IDLE_TIMEOUT": "41"}
    assert from_env(config_file=path).port == 9001
    config = from_env(env, config_file=path)
    assert (config.port, config.host, config.idle_timeout) == (9002, "0.0.0.0", 41.0)
    config = from_env(env, config_file=path, port=9003, idle_timeout=None)
    assert (config.port, config.idle_timeout) == (9003, 41.0)  # None: no override
    assert config.max_connections == 10_000  # the default under all three


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    from_variable = toml_file(tmp_path, "port = 9011\n", "a.toml")
    given = toml_file(tmp_path, "port = 9012\n", "b.toml")
    assert from_env({"AGUI_HUB_CONFIG": from_variable}).port == 9011
    assert from_env({"AGUI_HUB_CONFIG": from_variable}, config_file=given).port == 9012
    both = from_env({"AGUI_HUB_CONFIG": from_variable, "AGUI_HUB_PORT": "9013"})
    assert both.port == 9013


# -- build_authenticator --------------------------------------------------------------------


def test_no_jwt_anonymous_gets_everything() -> None:
    authenticator = build_authenticator(GatewayConfig())
    assert isinstance(authenticator, Anonymous)
    anonymous = authenticator.anonymous
    assert anonymous is not None
    assert anonymous.subject == ANONYMOUS_SUBJECT and anonymous.anonymous
    assert not anonymous.scoped
    assert anonymous.grants == Grants.everything()


def test_no_jwt_anonymous_patterns() -> None:
    config = GatewayConfig(anonymous_subscribe="public/*, news ,", anonymous_publish="")
    anonymous = build_authenticator(config).anonymous
    assert anonymous is not None
    # Without JWT every agent may be run by default; a run also needs publish on its
    # thread, which these grants give nowhere.
    assert anonymous.grants == Grants(("public/*", "news"), (), run=("*",))
    assert anonymous.allows(Action.SUBSCRIBE, "public/x")
    assert not anonymous.allows(Action.SUBSCRIBE, "private/x")
    assert not anonymous.allows(Action.PUBLISH, "public/x")
    # Set but empty: no thread at all (a write-only relay), not the default.
    write_only = build_authenticator(GatewayConfig(anonymous_subscribe="", anonymous_publish="in"))
    assert write_only.anonymous is not None
    assert write_only.anonymous.grants == Grants((), ("in",), run=("*",))
    no_runs = build_authenticator(GatewayConfig(anonymous_run="")).anonymous
    assert no_runs is not None and not no_runs.grants.may_run("support")
    some = build_authenticator(GatewayConfig(anonymous_run="support, team-*")).anonymous
    assert some is not None and some.grants.run == ("support", "team-*")
    assert some.grants.may_run("team-a") and not some.grants.may_run("billing")
    # Only subscribe narrowed: publish keeps its default (every thread).
    only_read = build_authenticator(GatewayConfig(anonymous_subscribe="public/*")).anonymous
    assert only_read is not None and only_read.grants.publish == ("*",)


def test_bad_anonymous_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="may only end"):
        build_authenticator(GatewayConfig(anonymous_subscribe="*/public"))


@pytest.mark.parametrize("setting", ["jwt_cookie", "revocation_file"])
def test_jwt_only_settings_without_jwt_are_refused(setting: str) -> None:
    with pytest.raises(ValueError, match=f"{setting}.*need a JWT key"):
        build_authenticator(GatewayConfig(**{setting: "x"}))


def test_jwt_secret() -> None:
    authenticator = build_authenticator(
        GatewayConfig(jwt_secret=SECRET, jwt_audience="hub", jwt_issuer="ops", jwt_leeway=0)
    )
    assert isinstance(authenticator, JWTAuthenticator)
    assert authenticator.anonymous is None  # without allow_anonymous, a token is needed
    settings = authenticator.settings
    assert (settings.audience, settings.issuer, settings.leeway) == ("hub", "ops", 0.0)
    assert settings.algorithms == ("HS256",)
    token = encode_token(SECRET, "agent-7", subscribe=["t/*"], audience="hub", issuer="ops")
    assert authenticator.verify(token).grants == Grants(("t/*",), ())


def test_jwt_secret_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")  # the trailing newline is not part of the secret
    authenticator = build_authenticator(GatewayConfig(jwt_secret_file=str(path)))
    assert isinstance(authenticator, JWTAuthenticator)
    assert authenticator.verify(encode_token(SECRET, "agent-7")).subject == "agent-7"


def test_jwt_secret_and_secret_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET)
    with pytest.raises(ValueError, match="not both"):
        build_authenticator(GatewayConfig(jwt_secret=SECRET, jwt_secret_file=str(path)))


def test_unreadable_or_bad_secret_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match=re.escape(f"cannot read jwt_secret_file {missing}")):
        build_authenticator(GatewayConfig(jwt_secret_file=str(missing)))
    with pytest.raises(ValueError, match="cannot read jwt_secret_file"):
        build_authenticator(GatewayConfig(jwt_secret_file=str(tmp_path)))  # a directory
    short = tmp_path / "short"
    short.write_text("too-short\n")
    with pytest.raises(ValueError, match="at least 32 bytes"):
        build_authenticator(GatewayConfig(jwt_secret_file=str(short)))


def test_two_key_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        build_authenticator(GatewayConfig(jwt_secret=SECRET, jwt_public_key_file="k.pem"))


def test_allow_anonymous_next_to_jwt(tmp_path: Path) -> None:
    nothing = build_authenticator(GatewayConfig(jwt_secret=SECRET, allow_anonymous=True))
    assert nothing.anonymous is not None
    assert nothing.anonymous.grants == Grants()  # next to JWT: none unless listed
    public = build_authenticator(
        GatewayConfig(
            jwt_secret=SECRET,
            allow_anonymous=True,
            anonymous_subscribe="public/*",
            anonymous_publish="inbox",
        )
    )
    assert public.anonymous is not None and public.anonymous.anonymous
    assert public.anonymous.grants == Grants(("public/*",), ("inbox",))
    # The patterns alone do not let anonymous connections in.
    closed = build_authenticator(GatewayConfig(jwt_secret=SECRET, anonymous_subscribe="public/*"))
    assert closed.anonymous is None


def test_jwt_public_key_and_settings(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = tmp_path / "k.pem"
    pem.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    revoked = tmp_path / "revoked"
    revoked.write_text("tok-1\n")
    authenticator = build_authenticator(
        GatewayConfig(
            jwt_public_key_file=str(pem),
            jwt_algorithms="ES256, ",
            jwt_grants_claim="perms",
            jwt_cookie="agui_token",
            revocation_file=str(revoked),
        )
    )
    assert isinstance(authenticator, JWTAuthenticator)
    assert authenticator.settings.algorithms == ("ES256",)
    claims = {"sub": "svc", "exp": int(time.time()) + 60, "perms": {"publish": ["x"]}}
    identity = authenticator.verify(jwt.encode(claims, key, algorithm="ES256"))
    assert identity.grants == Grants((), ("x",))
    with pytest.raises(ValueError, match="'HS256' cannot be used with public keys"):
        build_authenticator(GatewayConfig(jwt_public_key_file=str(pem), jwt_algorithms="HS256"))
    with pytest.raises(ValueError, match="cannot read JWT key file"):
        build_authenticator(GatewayConfig(jwt_jwks_file=str(tmp_path / "missing.json")))


# -- is_loopback, split_list ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("192.168.1.20", False),
        ("relay.example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_split_list() -> None:
    assert split_list(" a, b,,c ,") == ["a", "b", "c"]
    assert split_list("") == []
    assert split_list(None) == []


# -- open-file limit --------------------------------------------------------------------------

CHILD = """
import json, resource
from agui_hub.gateway.config import raise_open_file_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
lowered = LOWER and (hard == resource.RLIM_INFINITY or hard > 256)
if lowered:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
before, after = raise_open_file_limit()
print(json.dumps({"lowered": bool(lowered), "before": before, "after": after,
                  "now": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


@pytest.mark.parametrize("lower", [False, True])
def test_raise_open_file_limit(lower: bool) -> None:
    """Run in a child process: the test process's own limit stays as it is."""
    limit_here = resource.getrlimit(resource.RLIMIT_NOFILE)
    done = subprocess.run(
        [sys.executable, "-c", CHILD.replace("LOWER", str(lower))],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["after"] >= result["before"] > 0
    assert result["after"] == result["now"]
    if result["lowered"]:
        assert result["before"] == 256
        assert result["after"] > 256
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limit_here
