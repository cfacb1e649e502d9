"""Tests never touch the user's Prefect home or database."""

from pathlib import Path

from conftest import TEST_PREFECT_HOME


def test_prefect_settings_point_at_the_session_temp_home():
    from prefect.settings import get_current_settings

    s = get_current_settings()
    home = Path(s.home).resolve()
    assert home == Path(TEST_PREFECT_HOME).resolve()
    assert home != (Path.home() / ".prefect").resolve()
    url = s.server.database.connection_url.get_secret_value()
    assert url == f"sqlite+aiosqlite:///{TEST_PREFECT_HOME}/prefect.db"
    assert s.api.url is None  # no server from the user's profile: flows use a throwaway ephemeral API
    assert Path(s.profiles_path).resolve().is_relative_to(home)
