"""The unit layer of the test suite (see CONTRIBUTING.md)."""
