"""Prefect settings the project fixes before Prefect is imported: no analytics or telemetry.

When no ``PREFECT_API_URL`` is set, Prefect 3 starts a temporary local server for each round
("Starting temporary server on http://127.0.0.1:8xxx"). Its telemetry heartbeat
(``prefect.server.services.telemetry``) posts to sens-o-matic.prefect.io, which prints
``Failed to send telemetry`` on offline machines, and writes to the server's SQLite database, where
it was seen to fail with a ~130-line ``sqlite3.OperationalError: database is locked`` traceback
(Prefect #19771, #15170). The SDK's own analytics (``prefect._internal.analytics``, run at
``import prefect``) are turned off by ``DO_NOT_TRACK``.

Settings (each only a default: a value already in the environment wins):
    PREFECT_SERVER_ANALYTICS_ENABLED=false  the server's telemetry heartbeat service (Prefect settings
                                            ``server.analytics_enabled``); the temporary server is a subprocess
                                            that inherits this environment.
    DO_NOT_TRACK=1                          client-side SDK analytics (``prefect._internal.analytics.enabled``).
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
                                            the temporary server creates and migrates a fresh SQLite database on
                                            its first start; Prefect's 20 s default was seen to time out on a busy
                                            2-core machine ("Timed out while attempting to connect to ephemeral
                                            Prefect API server"), failing a healthy round before it began.
"""

from __future__ import annotations

import os

QUIET_PREFECT_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


def apply_quiet_prefect_defaults(environ: dict | None = None) -> dict[str, str]:
    """Set :data:`QUIET_PREFECT_ENV` as defaults in ``environ`` (``os.environ``); returns what is now in effect.

    Must run before ``import prefect`` for the SDK analytics check; the server setting also reaches a temporary
    server started later, since it is started with this process's environment.
    """
    env = os.environ if environ is None else environ
    for key, value in QUIET_PREFECT_ENV.items():
        env.setdefault(key, value)
    return {key: env[key] for key in QUIET_PREFECT_ENV}
