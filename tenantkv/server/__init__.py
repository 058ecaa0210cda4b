"""The Trio server: listener, sessions, commands, daemon entry point."""
