"""The integration layer of the test suite (see CONTRIBUTING.md)."""
