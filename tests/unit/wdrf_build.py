"""The builders' old import name, kept while tests written against it land; the builders are
tests/support/builders.py (import them from there)."""

from tests.support.builders import *  # noqa: F403
