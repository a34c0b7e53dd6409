"""The tui layer of the test suite (see CONTRIBUTING.md)."""
