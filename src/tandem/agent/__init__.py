"""llama-server's experimental agent features, an optional extra (`pip install 'tandem[agent]'`):
built-in tools that read, search, write and run commands (tools.py, on this machine or in an
isolate: runtime.py) and the MCP CORS proxy (proxy.py). The server imports this package only
when --tools, --ui-mcp-proxy or --agent turns a feature on (its routes: server/experimental.py).
"""
