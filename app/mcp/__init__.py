"""MCP tool servers: the ones registered on this machine (registry.py), a bounded client (client.py) and the
log of every call (calls.py). The Responses API's `mcp` tool runs on them (server/surfaces/responses)."""
