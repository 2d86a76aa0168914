"""The TUI's widgets, one per module (Textual's layout): import the module you need, so only
``petri tui`` pays for Textual."""
