"""synapolis: filesystem-native heartbeats and coordination for AI coding agents."""

__version__ = "0.1.0"
