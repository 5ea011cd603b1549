"""The tenants file (servicekit/tenants.py): what it gives, and the one-line start-up error that names
the line of each kind of bad input."""

from __future__ import annotations

import argparse

import pytest

from gateway.server import settings_from_args
from gateway.server_args import add_gateway_args
from orchestrator.server_args import add_orchestrator_args
from servicekit.auth import API_KEY_ENV
from servicekit.tenants import NO_TENANT, Tenant, key_tenant_name, load_tenants, parse_tenants

GOOD = """\
# two teams
[tenants.acme]
keys = ["acme-1", "acme-2"]
weight = 3
max_concurrent = 8
requests_per_minute = 120
tokens_per_minute = 50000
max_queue_s = 30

[tenants.light]
keys = ["light-1"]
"""


def test_a_tenants_file_gives_each_tenant_its_keys_weight_and_limits():
    tenants = parse_tenants(GOOD)
    acme = tenants.of_key("acme-2")
    assert acme == Tenant("acme", ("acme-1", "acme-2"), 3.0, 8, 120, 50000, 30.0)
    light = tenants.of_key("light-1")
    assert (light.name, light.weight, light.limited, light.max_queue_s) == ("light", 1.0, False, 60.0)
    assert tenants.of_key("nobody") is None and tenants.of_key(None) is None
    assert not acme.admin and parse_tenants('[tenants.ops]\nkeys = ["o"]\nadmin = true\n').of_key("o").admin


def test_a_plain_key_is_a_tenant_of_its_own_and_the_stacks_own_key_may_name_a_tenant():
    tenants = parse_tenants(GOOD, own_keys=["stack-key", "light-1"])
    own = tenants.of_key("stack-key")
    assert own.name == key_tenant_name("stack-key") and "stack-key" not in own.name
    assert (own.weight, own.limited, own.own) == (1.0, False, True)
    assert tenants.keys[0] in ("stack-key", "light-1")          # the key a service presents is its own
    assert tenants.resolve("stack-key", "acme").name == "acme"  # the gateway acts for acme
    assert tenants.resolve("stack-key", "unknown").name == own.name
    assert tenants.resolve("acme-1", "light").name == "acme"    # a tenant cannot act for another
    assert tenants.resolve("light-1", "acme").name == "acme"    # ... unless its key is also the stack's own


def test_a_service_without_keys_has_no_tenants():
    tenants = parse_tenants("", ())
    assert not tenants and tenants.resolve(None, None) == NO_TENANT


BAD = [
    ('[tenants.a]\nkeys = ["k"]\nwieght = 2\n', 3, "unknown field 'wieght'"),
    ('[tenants.a]\nkeys = ["k"]\n\n[tenants.b]\nkeys = ["j"]\nrequests_per_minute = -5\n', 6,
     "requests_per_minute must be positive"),
    ('[tenants.a]\nkeys = ["k"]\n\n[tenants.b]\nkeys = ["j", "k"]\n', 5, "a key belongs to one tenant"),
    ('[tenants.a]\nkeys = ["k"]\nweight = = 1\n', 3, "not valid TOML"),
    ('[tenants.a]\nkeys = ["k"]\nmax_concurrent = 1.5\n', 3, "must be an integer"),
    ('[tenants.a]\nkeys = ["k"]\nweight = 0\n', 3, "weight must be positive"),
    ('[tenant.a]\nkeys = ["k"]\n', 1, "unknown top-level field 'tenant'"),
    ('[tenants.a]\nkeys = ["k"]\n\n[tenants.b]\nkeys = ["j"]\nadmin = "yes"\n', 6,
     "tenants.b.admin must be true or false, got 'yes'"),
]


@pytest.mark.parametrize(("text", "line", "what"), BAD,
                         ids=["unknown-field", "negative-limit", "shared-key", "bad-toml", "fractional", "zero-weight",
                              "top-level", "admin-not-bool"])
def test_bad_tenants_file_is_a_one_line_error_naming_the_line(tmp_path, text, line, what):
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as raised:
        load_tenants(path)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"error: tenants file {path} line {line}: "), message
    assert what in message


@pytest.mark.parametrize("add_args", [add_gateway_args, add_orchestrator_args], ids=["gateway", "orchestrator"])
def test_the_services_take_the_file_from_the_flag_or_their_environment_variable(monkeypatch, tmp_path, add_args):
    path = tmp_path / "t.toml"
    path.write_text(GOOD)
    service = "gateway" if add_args is add_gateway_args else "orchestrator"
    monkeypatch.setenv(f"STREAMRAG_{service.upper()}_TENANTS", str(path))
    parser = argparse.ArgumentParser()
    add_args(parser)
    assert parser.parse_args([]).tenants == str(path)
    assert parser.parse_args(["--tenants", "other.toml"]).tenants == "other.toml"


def test_the_gateway_accepts_every_tenants_key_and_presents_its_own(monkeypatch, tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(GOOD)
    monkeypatch.setenv(API_KEY_ENV, "stack-key")
    parser = argparse.ArgumentParser()
    add_gateway_args(parser)
    settings = settings_from_args(parser.parse_args(["--tenants", str(path)]), None)
    assert settings.api_keys[0] == "stack-key"
    assert set(settings.api_keys) == {"stack-key", "acme-1", "acme-2", "light-1"}
    bad = tmp_path / "bad.toml"
    bad.write_text("[tenants.a]\nkeys = 3\n")
    with pytest.raises(SystemExit, match=r"line 2: tenants.a.keys must be a list"):
        settings_from_args(parser.parse_args(["--tenants", str(bad)]), None)
