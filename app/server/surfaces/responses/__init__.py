"""The OpenAI Responses surface (surface.py), its tools and the `mcp` tool."""
