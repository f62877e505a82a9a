"""The aiohttp server: OpenAI-compatible surface, admin API, middlewares."""
