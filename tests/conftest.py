"""Shared pytest configuration."""
import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: needs real model weights or minutes of CPU")
