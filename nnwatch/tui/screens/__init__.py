"""Screens of the dashboard: the main one and its dialogs."""
