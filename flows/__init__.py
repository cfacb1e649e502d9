"""Prefect flows of the pipeline. Importing the package turns Prefect's analytics off (flows/prefect_settings.py)."""

from .prefect_settings import apply_quiet_prefect_defaults

apply_quiet_prefect_defaults()
