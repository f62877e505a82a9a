"""The one rooted error tree. Each message says what to do next.

Every error knows the HTTP status, OpenAI error `type` and `code` it maps to, and who failed
(the gateway or the engine), so the server can render the envelope without guessing.
"""

from __future__ import annotations


class SwitchyardError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"
    source: str = "gateway"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def envelope(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
                "source": self.source,
            }
        }


class BadRequestError(SwitchyardError, ValueError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class MalformedJSONError(BadRequestError):
    code = "malformed_json"


class ModelNotFoundError(SwitchyardError, LookupError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class LaneNotFoundError(SwitchyardError, LookupError):
    status = 404
    type = "invalid_request_error"
    code = "lane_not_found"


class ModelBrokenError(SwitchyardError):
    """The file exists but cannot be served (not a GGUF, truncated, unsupported)."""

    status = 422
    type = "invalid_request_error"
    code = "model_broken"


class ModelTooLargeError(SwitchyardError):
    """The memory plan says the model cannot run here with these settings; the engine is not started."""

    status = 503
    type = "server_error"
    code = "model_does_not_fit"


class EngineStartError(SwitchyardError):
    status = 503
    type = "engine_error"
    code = "engine_start_failed"
    source = "engine"


class EngineCrashedError(SwitchyardError):
    status = 502
    type = "engine_error"
    code = "engine_crashed"
    source = "engine"


class EngineUnavailableError(SwitchyardError):
    """No runtime for the lane is installed (neither xllamacpp nor a llama-server binary)."""

    status = 503
    type = "engine_error"
    code = "engine_unavailable"


class LaneBusyError(SwitchyardError):
    status = 503
    type = "server_error"
    code = "lane_busy"


class PortInUseError(SwitchyardError, OSError):
    code = "port_in_use"


class ServerNotRunningError(SwitchyardError, ConnectionError):
    code = "server_not_running"


class SettingsError(SwitchyardError, ValueError):
    code = "bad_settings"


class ContextLengthExceededError(BadRequestError):
    """The prompt does not fit the lane's per-request (per-slot) context; the engine would refuse it."""

    code = "context_length_exceeded"


class RequestTooLargeError(SwitchyardError):
    status = 413
    type = "invalid_request_error"
    code = "too_large"


class RequestTimeoutError(SwitchyardError, TimeoutError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class TooManyRequestsError(SwitchyardError):
    status = 429
    type = "rate_limit_error"
    code = "too_many_concurrent_requests"


class KeyNotFoundError(SwitchyardError, LookupError):
    status = 404
    type = "invalid_request_error"
    code = "key_not_found"


class KeyExistsError(SwitchyardError):
    status = 409
    type = "invalid_request_error"
    code = "key_exists"
