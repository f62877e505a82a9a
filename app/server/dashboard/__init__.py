"""The web dashboard (`/ui`) and the browsable API document (`/docs`): plain files served from this
package, no build step, no network at install time. The pages call the same admin and OpenAI routes the
CLI does, with the key the user types (kept in the tab's session storage), so they are exactly as safe
as the admin API (docs/dashboard.md)."""

from app.server.dashboard.routes import setup

__all__ = ["setup"]
