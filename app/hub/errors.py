"""huggingface_hub's and httpx's exceptions turned into Switchyard's error tree, with what to do next.

Messages never carry the token (huggingface_hub's own messages can quote request headers, so they are not
passed through); they name the repository, the endpoint and the next step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx2
from huggingface_hub import errors as hf_errors

from app.core.errors import (
    HubAuthError,
    HubError,
    HubFileNotFoundError,
    HubGatedError,
    HubOfflineError,
    HubRepoNotFoundError,
    HubUnreachableError,
    HubUnsafeAnswerError,
    SwitchyardError,
)
from app.hub.config import HubConfig

LOGIN_HINT = "add a token with `switchyard hub login` (or set HF_TOKEN)"


def repo_page(config: HubConfig, repo: str) -> str:
    return f"{config.endpoint}/{repo}"


def gated_error(config: HubConfig, repo: str) -> HubGatedError:
    if config.token is None:
        return HubGatedError(
            f"{repo} is gated: accept its license on the hub page {repo_page(config, repo)} while logged in, "
            f"then {LOGIN_HINT}"
        )
    return HubGatedError(
        f"{repo} is gated and the token in use has no access yet: accept the license on "
        f"{repo_page(config, repo)} with the account the token belongs to (or wait for the authors' "
        "approval), then try again"
    )


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def translate(
    exc: BaseException, config: HubConfig, *, repo: str | None = None, path: str | None = None
) -> HubError:
    """The Switchyard error for an exception raised by a hub call."""
    what = repo or "the hub"
    where = f"{path} in {repo}" if path and repo else what
    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return HubOfflineError(
            f"offline: {what} was not contacted (HF_HUB_OFFLINE is on); local models keep working"
        )
    if isinstance(exc, hf_errors.GatedRepoError):
        return gated_error(config, repo or "this repository")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        if config.token is None:
            return HubRepoNotFoundError(
                f"{what} was not found on {config.endpoint}: check the name (owner/name); if it is private, "
                f"{LOGIN_HINT}"
            )
        return HubRepoNotFoundError(
            f"{what} was not found on {config.endpoint}, or the token in use cannot see it: check the name "
            "(owner/name) and that the token's account has access"
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return HubFileNotFoundError(
            f"that revision of {what} does not exist on the hub; check the branch or commit"
        )
    if isinstance(exc, hf_errors.EntryNotFoundError):
        return HubFileNotFoundError(f"{where} does not exist; see `switchyard show {repo}` for its files")
    status = _status(exc)
    if status == 401:
        if config.token is None:
            return HubAuthError(f"the hub wants a token for {what}: {LOGIN_HINT}")
        return HubAuthError(
            f"the hub rejected the token for {what} (401): it may be revoked or mistyped; run "
            "`switchyard hub login` with a new one (see `switchyard hub status`)"
        )
    if status == 403:
        return HubAuthError(
            f"the hub refused access to {what} (403): the token lacks the permission (a fine-grained token "
            "needs read access to this repository)"
        )
    if status == 429:
        return HubUnreachableError("the hub is rate-limiting requests (429); wait a minute and try again")
    if status is not None and status >= 500:
        return HubUnreachableError(
            f"the hub at {config.endpoint} answered {status} for {where}; it is having trouble, "
            "try again later"
        )
    if isinstance(exc, httpx2.TimeoutException):
        return HubUnreachableError(
            f"the hub at {config.endpoint} did not answer in time for {where}; check the connection "
            "and try again"
        )
    if isinstance(exc, httpx2.ProxyError):
        return HubUnreachableError(
            f"the proxy {config.proxy} refused the connection to {config.endpoint}; check the `hf_proxy` "
            "setting (or HTTPS_PROXY)"
        )
    if isinstance(exc, httpx2.TransportError | ConnectionError):
        proxy = f" through the proxy {config.proxy}" if config.proxy else ""
        return HubUnreachableError(
            f"cannot reach the hub at {config.endpoint}{proxy} ({type(exc).__name__}); check the network, "
            "the `hf_endpoint` setting (HF_ENDPOINT), or turn on offline mode to work with local models only"
        )
    if status is not None:
        return HubError(
            f"the hub answered {status} for {where}; try again, or check {repo_page(config, repo or '')}"
        )
    return HubError(f"the hub call for {where} failed ({type(exc).__name__}); try again")


@contextlib.contextmanager
def hub_errors(config: HubConfig, *, repo: str | None = None, path: str | None = None) -> Iterator[None]:
    """Run a hub call; anything it raises comes out as a Switchyard HubError (our own errors pass)."""
    try:
        yield
    except SwitchyardError:
        raise
    except (hf_errors.HfHubHTTPError, hf_errors.OfflineModeIsEnabled, hf_errors.EntryNotFoundError) as exc:
        raise translate(exc, config, repo=repo, path=path) from None
    except (httpx2.HTTPError, ConnectionError, TimeoutError) as exc:
        raise translate(exc, config, repo=repo, path=path) from None
    except (KeyError, TypeError, AttributeError) as exc:  # huggingface_hub parsing a malformed answer
        raise HubUnsafeAnswerError(
            f"the hub's answer for {repo or 'the request'} is malformed ({type(exc).__name__}: "
            f"{str(exc)[:80]}), so nothing was written; check the `hf_endpoint` setting (HF_ENDPOINT) "
            "and try again later"
        ) from None
