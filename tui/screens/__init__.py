"""The TUI's screens, one per module: Sandboxes, Race, Compare, Logs, Promotions, and the
Help, Confirm and Race-start dialogs."""
