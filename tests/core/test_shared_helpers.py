"""The shared helpers: one byte formatter, one `repo:quant` splitter, one keyring policy, one SSE loop, the
entry's detected format, and the NotFound/Conflict middle classes of the error tree."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyring
import keyring.backends.fail
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.core import errors
from app.core.events import EventBus, EventKind
from app.core.units import GIB, KIB, MIB, fmt_bytes
from app.core.vault import KEYRING, SERVICE, SESSION, Kept, Secret, SessionVault, keyring_get, keyring_put
from app.formats.detect import ModelKind
from app.formats.gguf_meta import read_gguf
from app.hub.refs import split_ref
from app.library.sources import scan_models_dir
from app.server.admin.events import event_stream
from tests.server.test_keys import MemoryKeyring  # the one in-memory backend the tests share
from tests.support.modelgen import write_piper_voice

# ---- bytes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "?"),
        (0, "0.0 MiB"),
        (512 * KIB, "0.5 MiB"),
        (MIB, "1.0 MiB"),
        (97 * MIB + 80 * KIB, "97.1 MiB"),
        (GIB - 1, "1024.0 MiB"),  # just under a GiB stays in MiB
        (GIB, "1.00 GiB"),
        (4_370_000_000, "4.07 GiB"),
        (70 * GIB, "70.00 GiB"),
    ],
)
def test_fmt_bytes(n: int | None, text: str) -> None:
    assert fmt_bytes(n) == text


def test_fmt_bytes_unknown_word() -> None:
    assert fmt_bytes(None, unknown="-") == "-"


# ---- repo:quant ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "split"),
    [
        ("org/name", ("org/name", None)),
        ("org/name:Q4_K_M", ("org/name", "Q4_K_M")),
        ("org/name:", ("org/name", None)),
        ("  org/name : Q8_0 ", ("org/name", "Q8_0")),
        ("org/name:sub/model-Q4_K_M.gguf", ("org/name", "sub/model-Q4_K_M.gguf")),
    ],
)
def test_split_ref(ref: str, split: tuple[str, str | None]) -> None:
    assert split_ref(ref) == split


@pytest.mark.parametrize(
    ("ref", "why"),
    [("", "names no repository"), (":Q4_K_M", "names no repository"), ("org/name:Q4:K", "more than one ':'")],
)
def test_split_ref_refuses_bad_refs(ref: str, why: str) -> None:
    with pytest.raises(errors.BadRequestError, match=why) as caught:
        split_ref(ref, param="model")
    assert caught.value.param == "model" and "owner/name:QUANT" in caught.value.message


# ---- the keyring policy --------------------------------------------------------------------------------


class LockedKeyring(MemoryKeyring):
    """A backend that exists but refuses (a locked collection, D-Bus gone mid-call)."""

    def get_password(self, service: str, username: str) -> str | None:
        raise RuntimeError("locked")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise RuntimeError("locked")


@pytest.fixture
def ring() -> Iterator[MemoryKeyring]:
    before = keyring.get_keyring()
    mem = MemoryKeyring()
    keyring.set_keyring(mem)
    yield mem
    keyring.set_keyring(before)


def test_with_a_keyring_the_secret_goes_there_and_nowhere_else(ring: MemoryKeyring) -> None:
    vault = SessionVault()
    kept = vault.put("remote:box", Secret("sk-1"))
    assert kept == Kept(KEYRING, None)
    assert ring.items == {(SERVICE, "remote:box"): "sk-1"}
    got, where, problem = SessionVault().find("remote:box")  # another store (process) reads it back
    assert got is not None and got.reveal() == "sk-1" and where == KEYRING and problem is None
    assert vault.forget("remote:box") == [KEYRING] and ring.items == {}


def test_without_a_keyring_the_secret_is_kept_for_this_session_only() -> None:
    vault = SessionVault()  # conftest's backend: keyring.backends.fail.Keyring
    kept = vault.put("hf_token", Secret("hf_x"))
    assert kept.where == SESSION and kept.problem is not None
    assert "no system keyring is available here" in kept.problem and "fail.Keyring" in kept.problem
    got, where, problem = vault.find("hf_token")
    assert got is not None and got.reveal() == "hf_x" and where == SESSION and problem is None
    assert SessionVault().find("hf_token") == (None, None, None)  # a new store: gone
    assert vault.forget("hf_token") == [SESSION] and vault.find("hf_token")[0] is None


def test_a_caller_may_refuse_the_session_copy() -> None:
    vault = SessionVault()
    kept = vault.put("editor", Secret("sy-1"), session=False)
    assert kept.where is None and kept.problem and vault.find("editor") == (None, None, None)


def test_a_refusing_backend_is_a_problem_said_not_raised() -> None:
    before = keyring.get_keyring()
    keyring.set_keyring(LockedKeyring())
    try:
        assert keyring_put("hf_token", Secret("x")) == "the system keyring did not accept it (RuntimeError)"
        assert keyring_get("hf_token") == (None, "the system keyring could not be read (RuntimeError)")
        vault = SessionVault()
        assert vault.put("hf_token", Secret("x")).where == SESSION
        got, where, problem = vault.find("hf_token")
        assert got is not None and where == SESSION and problem and "could not be read" in problem
    finally:
        keyring.set_keyring(before)


def test_the_keyring_copy_replaces_a_session_one(ring: MemoryKeyring) -> None:
    vault = SessionVault()
    vault.hold("hf_token", Secret("old"))
    assert vault.put("hf_token", Secret("new")).where == KEYRING
    ring.items.clear()  # the keyring lost it: no stale session copy comes back
    assert vault.find("hf_token") == (None, None, None)


# ---- server-sent events --------------------------------------------------------------------------------


async def _read_events(resp: Any, count: int) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    name = ""
    async with asyncio.timeout(10):
        while len(out) < count:
            line = (await resp.content.readline()).decode().rstrip("\n")
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                out.append((name, json.loads(line.removeprefix("data: "))))
            elif line.startswith(":"):
                out.append(("comment", line))
    return out


async def test_event_stream_sends_the_snapshot_then_what_the_filter_keeps() -> None:
    bus = EventBus()

    async def handler(request: web.Request) -> web.StreamResponse:
        async def snapshot() -> dict[str, Any]:
            bus.publish(EventKind.DOWNLOAD_QUEUED, n=0)  # published after subscribing: must not be lost
            return {"things": [1, 2]}

        return await event_stream(
            request,
            bus=bus,
            snapshot=snapshot,
            keep=lambda ev: ev.kind.startswith("download."),
            keep_alive_s=0.2,
        )

    app = web.Application()
    app.router.add_get("/events", handler)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/events")
        assert resp.headers["Content-Type"] == "text/event-stream"
        first = await _read_events(resp, 2)
        assert first[0] == ("snapshot", {"things": [1, 2]})
        assert first[1][0] == "download.queued" and first[1][1]["n"] == 0 and "ts" in first[1][1]
        bus.publish(EventKind.LANE_STATE, n=1)
        bus.publish(EventKind.DOWNLOAD_PROGRESS, n=2)
        rest = await _read_events(resp, 1)
        while rest[-1][0] == "comment":  # keep-alives may come between
            rest = await _read_events(resp, 1)
        assert rest[-1][0] == "download.progress" and rest[-1][1]["n"] == 2
        idle = await _read_events(resp, 1)
        assert idle == [("comment", ": keep-alive")]


# ---- the entry's detected format -----------------------------------------------------------------------


def test_a_scanned_entry_carries_its_format_and_lanes_need_not_read_it_again(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_piper_voice(root / "voice")
    [entry] = scan_models_dir(root, read=read_gguf, skip=set())
    assert entry.detected is not None and entry.detected.kind is ModelKind.PIPER
    assert entry.model_format() is entry.detected  # the scan's result, not a second read
    assert dataclasses.replace(entry, id="x").model_format() is entry.detected
    bare = dataclasses.replace(entry, detected=None)  # an entry made without a scan reads the path
    assert bare.model_format().kind is ModelKind.PIPER and bare.model_format() is not entry.detected
    assert bare == entry  # the detected format is not part of the entry's identity


# ---- the error tree ------------------------------------------------------------------------------------

# what the wire says for each 404/409 class: unchanged by the middle classes
WIRE = {
    errors.ModelNotFoundError: (404, "model_not_found"),
    errors.LaneNotFoundError: (404, "lane_not_found"),
    errors.KeyNotFoundError: (404, "key_not_found"),
    errors.HubRepoNotFoundError: (404, "hub_repo_not_found"),
    errors.HubFileNotFoundError: (404, "hub_file_not_found"),
    errors.DownloadNotFoundError: (404, "download_not_found"),
    errors.UnknownEngineError: (404, "engine_not_found"),
    errors.RemoteNotFoundError: (404, "remote_not_found"),
    errors.EngineJobNotFoundError: (404, "engine_job_not_found"),
    errors.KeyExistsError: (409, "key_exists"),
    errors.ModelInUseError: (409, "model_loaded"),
    errors.RemoveRefusedError: (409, "remove_refused"),
    errors.DownloadBusyError: (409, "download_busy"),
    errors.EngineBusyError: (409, "engine_busy"),
    errors.EngineInUseError: (409, "engine_in_use"),
    errors.RemoteExistsError: (409, "remote_exists"),
    errors.PeerNotFoundError: (404, "peer_not_found"),
    errors.PeerExistsError: (409, "peer_exists"),
    errors.PeersNeedTLSError: (409, "peers_need_tls"),
}


@pytest.mark.parametrize("cls", list(WIRE), ids=lambda c: c.__name__)
def test_404_and_409_classes_keep_their_wire_values(cls: type[errors.SwitchyardError]) -> None:
    status, code = WIRE[cls]
    err = cls("what to do next")
    body = err.envelope()["error"]
    assert (err.status, body["type"], body["code"], body["source"]) == (
        status,
        "invalid_request_error",
        code,
        "gateway",
    )
    middle = errors.NotFoundError if status == 404 else errors.ConflictError
    assert isinstance(err, middle)
    assert "status" not in vars(cls) and "type" not in vars(cls)  # derived from the middle class


def test_every_404_and_409_of_the_tree_is_under_its_middle_class() -> None:
    def walk(c: type) -> Iterator[type]:
        for sub in c.__subclasses__():
            yield sub
            yield from walk(sub)

    found = {c for c in walk(errors.SwitchyardError) if c.__module__ == errors.__name__}
    assert {c for c in found if c.status == 404} - {errors.NotFoundError} == set(
        c for c in WIRE if c.status == 404
    )
    assert {c for c in found if c.status == 409} - {errors.ConflictError} == set(
        c for c in WIRE if c.status == 409
    )
    assert all(issubclass(c, LookupError) for c in found if issubclass(c, errors.NotFoundError))
    # the other builtin kinds stay where they were
    assert issubclass(errors.RemoveRefusedError, PermissionError)
    assert issubclass(errors.HubRepoNotFoundError, errors.HubError)
    assert issubclass(errors.DownloadBusyError, errors.DownloadError)


def test_a_fail_backend_is_what_the_tests_run_with() -> None:
    # the policy tests above lean on conftest's backend; say so plainly if that ever changes
    assert isinstance(keyring.get_keyring(), keyring.backends.fail.Keyring)
