"""The MCP server (contract §10, §13): tools and resources defined once, served over stdio or HTTP.

`server.create_server` builds the server for one state directory; `stdio` and (for `synapolis serve`) the
HTTP app are its transports. Only `watch` is free of the MCP SDK; importing this package imports nothing.
"""
