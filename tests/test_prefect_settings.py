"""flows/prefect_settings.py: the settings the project sets are the ones the installed Prefect reads."""

from __future__ import annotations

import os


def test_defaults_never_override_the_users_values():
    from flows.prefect_settings import QUIET_PREFECT_ENV, apply_quiet_prefect_defaults

    env = {"DO_NOT_TRACK": "0"}
    assert apply_quiet_prefect_defaults(env) == {**QUIET_PREFECT_ENV, "DO_NOT_TRACK": "0"}
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"


def test_importing_flows_turns_analytics_off_in_prefects_own_settings(monkeypatch):
    import flows  # noqa: F401  (applies the defaults to os.environ)
    from prefect._internal.analytics.enabled import is_telemetry_enabled
    from prefect.settings import Settings

    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    settings = Settings()  # read from the environment, as the temporary server subprocess does
    assert settings.server.analytics_enabled is False
    timeout = int(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
    assert settings.server.ephemeral.startup_timeout_seconds == timeout
    assert is_telemetry_enabled() is False
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")
    assert Settings().server.analytics_enabled is True  # the name is the one Prefect reads: it can turn it back on
