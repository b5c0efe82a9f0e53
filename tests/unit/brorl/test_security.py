"""brorl.security's settings: where the token comes from, and every way to get it wrong is a config
error at start (fail closed) naming the key — never a service that silently runs open."""

from __future__ import annotations

import pytest

from brorl.config.base import dump, load_config, validate
from brorl.errors import InvalidArgument
from brorl.security import InferenceSecurityConfig, SecurityConfig
from services.learner.config import LearnerServiceConfig
from tests.certs import make_tls_files

TOKEN = "a" * 8 + "-" + "b" * 23


def test_no_settings_no_token():
    assert SecurityConfig().token == "" and SecurityConfig().required_token() == ""


def test_token_from_a_file_or_a_variable(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    assert validate(SecurityConfig, {"token_file": str(path)}).token == TOKEN
    monkeypatch.setenv("SECURITY_TEST_TOKEN", TOKEN)
    cfg = validate(SecurityConfig, {"token_env": "SECURITY_TEST_TOKEN"})
    assert cfg.token == cfg.required_token() == TOKEN


def test_the_token_never_appears_in_the_logged_config(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN)
    cfg = load_config(LearnerServiceConfig, None, [f"security.token_file={path}"], env_prefix=None)
    assert cfg.security.token == TOKEN and TOKEN not in dump(cfg)


def test_inference_services_may_serve_open_and_still_send_the_token(monkeypatch):
    monkeypatch.setenv("SECURITY_TEST_TOKEN", TOKEN)
    settings = {"token_env": "SECURITY_TEST_TOKEN"}
    assert validate(InferenceSecurityConfig, settings).required_token() == TOKEN
    open_ = validate(InferenceSecurityConfig, {**settings, "token_for_inference": False})
    assert open_.required_token() == "" and open_.token == TOKEN


@pytest.mark.parametrize(
    "case, settings, says",
    [
        ("env-unset", {"token_env": "SECURITY_TEST_UNSET"}, "not set or empty"),
        ("file-missing", {"token_file": "{tmp}/nope"}, "cannot be read"),
        ("both", {"token_env": "SECURITY_TEST_TOKEN", "token_file": "{tmp}/t"}, "not both"),
        ("short", {"token_file": "{tmp}/short"}, "at least 16"),
        ("spaces", {"token_file": "{tmp}/spaces"}, "without spaces"),
        ("cert-without-key", {"tls": {"cert": "{tls}/server.pem"}}, "set both or neither"),
        ("missing-ca", {"tls": {"ca": "{tmp}/ca.pem"}}, "tls.ca"),
        ("unknown-key", {"tokn_file": "x"}, "unknown key"),
    ],
)
def test_bad_settings_are_config_errors(tmp_path, monkeypatch, case, settings, says):
    monkeypatch.setenv("SECURITY_TEST_TOKEN", TOKEN)
    monkeypatch.delenv("SECURITY_TEST_UNSET", raising=False)
    (tmp_path / "t").write_text(TOKEN)
    (tmp_path / "short").write_text("abc123")
    (tmp_path / "spaces").write_text("correct horse battery staple")
    tls = make_tls_files(tmp_path / "tls")
    places = {"tmp": tmp_path, "tls": tls.cert.parent}

    def fill(value):
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value.format(**places)

    with pytest.raises(InvalidArgument) as err:
        validate(LearnerServiceConfig, {"security": fill(settings)})
    assert says in str(err.value) and str(err.value).startswith("security"), str(err.value)
