"""The suite's fixtures live in tests/support/fixtures.py; markers are declared in pyproject.toml."""

pytest_plugins = ["tests.support.fixtures"]
