"""Dashboard panes, one per module, and the chart they share."""
