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


class NotFoundError(SwitchyardError, LookupError):
    """The thing named (a model, lane, key, job, remote...) does not exist; subclasses set only `code`."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ConflictError(SwitchyardError):
    """The request collides with the current state (already exists, busy, in use); subclasses set `code`."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"


class LaneNotFoundError(NotFoundError):
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


class EngineUnresponsiveError(SwitchyardError):
    """The engine stopped answering (no byte within `engine_read_timeout_s`, or its health route hung):
    the lane is marked failed and restarted."""

    status = 504
    type = "engine_error"
    code = "engine_unresponsive"
    source = "engine"


class UnsupportedMediaTypeError(SwitchyardError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class UpstreamRefusedError(SwitchyardError):
    """An engine or a remote answered an error status: its status, message, type and code are kept, and
    `source` says whose answer it was ("engine", "remote")."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        source: str,
        etype: str | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.status = status
        self.source = source
        # the engine's own 5xx is an engine_error; a remote's is a server error on its side
        server_side = "engine_error" if source == "engine" else "server_error"
        self.type = etype or ("invalid_request_error" if status < 500 else server_side)
        self.code = code or f"{source}_http_{status}"


class ModelHasNoVisionError(BadRequestError):
    code = "model_has_no_vision"


class EngineUnavailableError(SwitchyardError):
    """No runtime for the lane is installed (neither xllamacpp nor a llama-server binary)."""

    status = 503
    type = "engine_error"
    code = "engine_unavailable"


class EngineInstallingError(EngineUnavailableError):
    """The engine a request needs is being installed (auto_install_engines): retry when its job ends."""

    code = "engine_installing"


class EngineInstallFailedError(EngineUnavailableError):
    """Installing the engine a request needs failed; what was installed before is as it was."""

    code = "engine_install_failed"


class LaneBusyError(SwitchyardError):
    status = 503
    type = "server_error"
    code = "lane_busy"


class PortInUseError(SwitchyardError, OSError):
    code = "port_in_use"


class ServerNotRunningError(SwitchyardError, ConnectionError):
    code = "server_not_running"


class PlatformError(SwitchyardError, OSError):
    """An OS facility this platform lacks or refused (core/platform): the message names it."""

    code = "platform_error"


class SettingsError(SwitchyardError, ValueError):
    code = "bad_settings"


class ContextLengthExceededError(BadRequestError):
    """The prompt does not fit the lane's per-request (per-slot) context; the engine would refuse it.

    `tokens` and `limit` (when known) let a surface say it in the wording its clients parse: Claude Code
    compacts its conversation only on Anthropic's own `prompt is too long: N tokens > M maximum`."""

    code = "context_length_exceeded"

    def __init__(
        self, message: str, *, param: str | None = None, tokens: int | None = None, limit: int | None = None
    ) -> None:
        super().__init__(message, param=param)
        self.tokens = tokens
        self.limit = limit


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


class KeyNotFoundError(NotFoundError):
    code = "key_not_found"


class KeyExistsError(ConflictError):
    code = "key_exists"


# ---- library (app/library) ----------------------------------------------------------------------------


class LibraryError(SwitchyardError):
    """library.db cannot be used as it is (corrupt, written by a newer Switchyard, unwritable)."""

    code = "library_error"


class NoLaneForFormatError(ModelBrokenError):
    """The model is in the library, but no lane can run its format yet (app.library.model.LANE_FORMATS)."""

    code = "no_lane_for_format"


class ImportRefusedError(BadRequestError):
    """`switchyard import` / POST /api/library/import was given something that is not a model, or a bad id."""

    code = "import_refused"


class ModelInUseError(ConflictError):
    """A model cannot be removed while a lane has it loaded."""

    code = "model_loaded"


class RemoveRefusedError(ConflictError, PermissionError):
    """`rm` would delete the user's own file; it needs --delete-files (delete_files=true)."""

    code = "remove_refused"


# ---- the server's own front door (app/server/auth.py) --------------------------------------------------
class KeyRequiredError(SwitchyardError):
    """A request the server refused for its API key: none was sent where one is needed, or it is not valid."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class AdminNotAllowedError(SwitchyardError):
    """An admin route asked from another machine while `allow_remote_admin` is off."""

    status = 403
    type = "permission_error"
    code = "admin_not_allowed"


# ---- gateway clients (`switchyard ps`, `explain` against a running server) ------------------------
class ServerAuthError(SwitchyardError):
    """The running server refused the CLI: it needs an API key, or the key sent is not valid.

    Not a PermissionError: that is an OSError, which the CLI reads as "no server answers"."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


# ---- hub browse (app/hub: search, model detail, header reads by Range, token) ------------------------
class HubError(SwitchyardError):
    """The Hugging Face hub (or the mirror in hf_endpoint) could not answer a request."""

    status = 502
    code = "hub_error"


class HubOfflineError(HubError, ConnectionError):
    """Offline mode (setting `offline` or HF_HUB_OFFLINE) is on: no hub call is made."""

    status = 503
    code = "hub_offline"


class HubUnreachableError(HubError, ConnectionError):
    """No connection to the hub, a timeout, or a 5xx answer."""

    code = "hub_unreachable"


class HubRepoNotFoundError(NotFoundError, HubError):
    code = "hub_repo_not_found"


class HubFileNotFoundError(NotFoundError, HubError):
    """The repository exists but not this revision or file."""

    code = "hub_file_not_found"


class HubGatedError(HubError, PermissionError):
    """A gated repository: its license must be accepted on the hub, with a token of that account."""

    status = 403
    type = "invalid_request_error"
    code = "hub_gated"


class HubAuthError(HubError, PermissionError):
    """The hub refused the token (or a private repository needs one)."""

    status = 401
    type = "invalid_request_error"
    code = "hub_unauthorized"


class HeaderReadError(HubError):
    """A model file's header on the hub cannot be read with Range requests (too large, malformed).

    The wire code keeps its published name, `remote_header_unreadable` (docs/api.md): clients match on it."""

    status = 422
    type = "invalid_request_error"
    code = "remote_header_unreadable"


class HubTokenError(BadRequestError):
    """A token given to `switchyard hub login` is empty or malformed, or could not be stored."""

    code = "hub_token_invalid"


# ---- downloads (app/hub/download.py, transfer.py; `switchyard pull`/`update`, /api/downloads) -----------
class DownloadError(SwitchyardError):
    """A file could not be fetched (after the retries), or the download could not be set up."""

    status = 502
    code = "download_failed"


class DownloadNotFoundError(NotFoundError):
    code = "download_not_found"


class ChecksumMismatchError(DownloadError):
    """The bytes received do not hash to the sha256 (or git oid) the hub published; they were deleted."""

    code = "checksum_mismatch"


class DiskFullError(DownloadError, OSError):
    """Not enough free space for the download, before it starts or midway (ENOSPC)."""

    status = 507
    code = "disk_full"


class DownloadBusyError(ConflictError, DownloadError):
    """Another process (a server, another `pull`) is writing the same partial file."""

    code = "download_busy"


# ---- lanes (app/lanes: engine kinds other than llama.cpp)
class CapabilityMissingError(BadRequestError):
    """The model's lane cannot do what the route asks (speech from a chat model, chat from a voice)."""

    code = "capability_missing"


# ---- engine environments (app/lanes/engine_*.py; `switchyard engine`, /api/engines) ----------------------
class UnknownEngineError(NotFoundError):
    """Not an engine of the manifest (app/lanes/install/engines.toml)."""

    code = "engine_not_found"


class EngineStateError(SwitchyardError, ValueError):
    """A version that is not one, or an engine's state.json that cannot be read."""

    status = 400
    type = "invalid_request_error"
    code = "engine_state_invalid"


class EngineInstallError(SwitchyardError):
    """pip, the new environment or its check failed; the installed version (if any) is unchanged."""

    status = 502
    code = "engine_install_failed"


class NoEnginePythonError(EngineInstallError):
    """No Python 3.11+ to create an engine's environment with (a frozen app has none of its own)."""

    status = 503
    code = "no_engine_python"


class EngineBusyError(ConflictError):
    """Another install, rollback or removal of the same engine is running (in this or another process)."""

    code = "engine_busy"


class EngineInUseError(ConflictError):
    """A lane runs the engine version (or engine) that would be removed."""

    code = "engine_in_use"


# ---- remote lanes (app/lanes/remote*.py; `switchyard remote`, /api/remotes) ---------------------------
class RemoteNotFoundError(NotFoundError):
    code = "remote_not_found"


class RemoteExistsError(ConflictError):
    code = "remote_exists"


class RemoteUnavailableError(SwitchyardError):
    """The remote endpoint does not answer (down, unreachable, timing out): nothing was sent."""

    status = 503
    type = "server_error"
    code = "remote_unreachable"
    source = "remote"


class RemoteFailedError(SwitchyardError):
    """The remote broke off mid-request, or answered with something that is not its API."""

    status = 502
    type = "server_error"
    code = "remote_failed"
    source = "remote"


class RemoteAuthError(RemoteFailedError):
    """The remote refused the key Switchyard keeps for it (or needs one and none is kept)."""

    code = "remote_auth_failed"


class EngineJobNotFoundError(NotFoundError):
    code = "engine_job_not_found"


class HubUnsafeAnswerError(HubError):
    """The hub (or a mirror) named a file, commit or checksum that is not a safe path: nothing was written."""

    code = "hub_unsafe_answer"


class CachePathEscapeError(HubUnsafeAnswerError):
    """A path in the Hugging Face cache resolves outside its repository's folder (a planted symlink)."""

    code = "cache_path_escape"


class InvalidImageError(BadRequestError):
    """An image part that is not a readable image: bad base64, a truncated or corrupt file."""

    code = "invalid_image"


class UnsupportedImageTypeError(BadRequestError):
    """An image of a type the engine cannot decode (png, jpeg, gif and webp are taken)."""

    code = "unsupported_image_type"


class ImageTooLargeError(RequestTooLargeError):
    """An image over the max_image_mib cap, or declaring more pixels than max_image_megapixels (or, with
    the request's other images, max_request_megapixels)."""

    code = "image_too_large"


class ImageURLRefusedError(BadRequestError):
    """An http(s) image URL while fetching is off, or one naming a private or loopback address."""

    code = "image_url_not_allowed"


class ImageFetchError(BadRequestError):
    """An image URL that could not be fetched (unreachable, an error status, too slow)."""

    code = "image_fetch_failed"


class TooManyImagesError(ContextLengthExceededError):
    """The images of a request take more tokens than the lane's per-request context holds."""

    code = "too_many_images"


# ---- peers (app/lanes/peers/) ------------------------------------------------------------------------------
class PeerNotFoundError(NotFoundError):
    code = "peer_not_found"


class PeerExistsError(ConflictError):
    code = "peer_exists"


class PeerUnavailableError(SwitchyardError):
    """Another machine could not be reached, or it is not a Switchyard that pairs (no TLS, wrong address)."""

    status = 502
    code = "peer_unreachable"


class PairingRefusedError(SwitchyardError, PermissionError):
    """A pairing code that matches no open invitation, or a pairing answer that did not prove the code."""

    status = 403
    type = "invalid_request_error"
    code = "pairing_code_wrong"


class PairingLockedError(SwitchyardError):
    """Too many wrong pairing codes in a row: pairing is refused for a while, even with the right code."""

    status = 429
    type = "invalid_request_error"
    code = "pairing_locked"


class PeerNotTrustedError(SwitchyardError, PermissionError):
    """A peer's key sent without that peer's pinned client certificate, or used outside what peers may do."""

    status = 403
    type = "invalid_request_error"
    code = "peer_not_trusted"


class McpToolError(SwitchyardError):
    """An MCP server could not be reached or listed, or a tool call failed its bounds (deadline, result
    size, calls per turn) or the server broke (crash, malformed JSON-RPC). In the Responses API's mcp tool
    it is the call's `error`, said to the model and the client; the request itself goes on."""

    status = 424
    type = "invalid_request_error"
    code = "mcp_tool_error"
    source = "mcp"


class PeersNeedTLSError(ConflictError):
    """Pairing asked of a server that serves plain HTTP: peers talk only over (mutual) TLS."""

    code = "peers_need_tls"
