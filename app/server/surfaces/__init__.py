"""The API surfaces the server answers on, one package per API (openai, responses, anthropic, ollama).

The contract of a surface package (adding one is one line in SURFACES, app/server/surfaces/registry.py):

- `surface.py` holds `SURFACE`, its front door (`Surface`, app/server/surfaces/base.py): its name (also
  its safety policy group: app/core/policy.GROUPS lists the same names, a test checks it), its OpenAPI tag,
  the `Encoding` of its errors and streams, its route tables, its OpenAPI schemas and operations, the
  headers its clients send keys and CORS preflights with, and an optional setup hook.
- `routes.py` holds its aiohttp routes; they never name their surface: `Surface.install` marks each
  handler, and the error middleware, the limits, authentication and the request runner ask
  `surface_of(request)`. A translated route runs through the one runner (app/server/gateway/runner.py)
  with a `Translator` of its own (app/server/surfaces/translation.py); a pass-through one through
  app/server/gateway/proxy.py. Nothing here posts to an engine: the gateway does.
- `schemas.py` holds `SCHEMAS` (OpenAPI components) and `OPERATIONS` ((METHOD, path) -> request schema
  name and the 200 answer), written with the pieces in app/server/surfaces/schemas.py.

The registry lives in its own module, not here: the gateway imports the shared modules of this package
(base, translation, shapes), and a registry here would import every route module, and so the gateway,
whenever one of them is first imported.
"""
