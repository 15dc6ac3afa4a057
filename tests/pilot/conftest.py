"""Fixtures shared by the pilot's tests: the trained zoo's root, skipped where the checkout has none."""

import pytest

from specpilot.demo import zoo_dir


@pytest.fixture(scope="module")
def zoo():
    root = zoo_dir()
    if root is None:
        pytest.skip("no trained zoo in this checkout")
    return root
