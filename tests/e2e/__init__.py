"""The e2e layer of the test suite (see CONTRIBUTING.md)."""
