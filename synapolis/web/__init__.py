"""The team server (`synapolis serve`, contract §13): MCP over HTTP, the dashboard, /api/status, /healthz.

`app.create_app` composes it on the MCP SDK's starlette; importing this package imports nothing.
"""
