"""The merge tests' shared fixture: ``trees`` (a base, live and sandbox tree in tmp_path)."""
from tests.helpers.trees import trees  # noqa: F401 - a fixture, found here by pytest
