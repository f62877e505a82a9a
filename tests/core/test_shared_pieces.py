"""The pieces several parts share instead of each writing its own: the short-name rule (keys, remotes, peers,
MCP servers), a record's public fields, a file of named records (remotes.json, peers.json), cancelling a
part's tasks, a small SQLite file's transaction, and a model file's first bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sqlite3
from pathlib import Path

import pytest

from app.core.background import all_cancelled
from app.core.errors import BadRequestError, PeerNotFoundError, RemoteNotFoundError
from app.core.names import check_short_name
from app.core.public import Public, fields_of
from app.core.secrets import check_name as key_name
from app.core.sqlitefile import transaction
from app.formats.head import file_head
from app.lanes.peers.store import PeerStore
from app.lanes.peers.store import check_name as peer_name
from app.lanes.remote.store import RemoteSpec, RemoteStore
from app.lanes.remote.store import check_name as remote_name
from app.mcp.registry import check_name as mcp_name


# ---- short names ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("check", "longest"), [(key_name, 64), (mcp_name, 64), (remote_name, 32), (peer_name, 32)]
)
def test_every_short_name_follows_one_rule(check: object, longest: int) -> None:
    assert callable(check)
    assert (
        check("a") == "a" and check("gpu-box.2_x") == "gpu-box.2_x" and check("x" * longest) == "x" * longest
    )
    for bad in ("", "-lead", ".hidden", "has space", "a/b", "x" * (longest + 1), "name\n", "é"):
        with pytest.raises(BadRequestError) as e:
            check(bad)
        assert (
            e.value.param == "name"
            and f"1-{longest} letters" in e.value.message
            and repr(bad) in e.value.message
        )


def test_a_trailing_newline_is_not_part_of_an_mcp_server_name() -> None:
    """The MCP registry's own pattern ended in `$` with `match`, which lets "name\\n" through: a name that
    would land in mcp.json and a keyring user with a newline in it."""
    with pytest.raises(BadRequestError):
        mcp_name("files\n")


def test_a_short_name_says_why_and_gives_an_example() -> None:
    with pytest.raises(
        BadRequestError, match=r"remote name 'a/b' is not allowed; .*\(no '/'.*\), e\.g\. 'box'"
    ):
        check_short_name("a/b", what="remote name", longest=32, note="no '/'", example="'box'")


# ---- public fields -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Record(Public):
    name: str
    secret_id: str
    tags: tuple[str, ...] = ()


def test_a_public_record_shows_every_field_and_fields_of_only_those_named() -> None:
    r = _Record("a", "s3cret", ("x",))
    assert r.public() == {"name": "a", "secret_id": "s3cret", "tags": ("x",)}
    assert fields_of(r, "tags", "name") == {"tags": ("x",), "name": "a"}
    assert list(fields_of(r, "tags", "name")) == ["tags", "name"]  # in the order asked


# ---- a file of named records ---------------------------------------------------------------------------
def test_remotes_and_peers_share_one_file_of_named_records(tmp_path: Path) -> None:
    remotes = RemoteStore(tmp_path / "remotes.json", env={})
    assert remotes.specs() == []
    remotes.add(RemoteSpec(name="box", url="http://127.0.0.1:9/v1"), None)
    assert remotes.get("box").url == "http://127.0.0.1:9/v1"
    with pytest.raises(
        RemoteNotFoundError, match=r"no remote named 'nope' \(remotes: box\); see `switchyard remote ls`"
    ):
        remotes.get("nope")
    assert oct((tmp_path / "remotes.json").stat().st_mode & 0o777) == "0o600"
    assert remotes.remove("box").name == "box" and remotes.specs() == []
    with pytest.raises(RemoteNotFoundError, match=r"\(remotes: none\)"):
        remotes.remove("box")
    assert remotes.keyring_user("box") == "remote:box"

    peers = PeerStore(tmp_path / "peers")
    with pytest.raises(
        PeerNotFoundError, match=r"no peer named 'desk' \(peers: none\); see `switchyard peers ls`"
    ):
        peers.get("desk")
    assert peers.keyring_user("desk") == "peer:desk"


@pytest.mark.parametrize("text", ["{not json", '{"remotes": 3}', '{"other": []}'])
def test_a_damaged_file_of_records_says_which_file_and_what_to_do(tmp_path: Path, text: str) -> None:
    (tmp_path / "remotes.json").write_text(text, encoding="utf-8")
    with pytest.raises(Exception, match=r"remotes\.json is damaged .*; fix or remove it"):
        RemoteStore(tmp_path / "remotes.json", env={}).specs()


# ---- cancelling a part's tasks -------------------------------------------------------------------------
async def test_all_cancelled_ends_every_task_and_keeps_their_failures_back() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup broke") from None

    tasks = [asyncio.create_task(forever()), asyncio.create_task(fails_on_cancel())]
    await asyncio.sleep(0)
    await all_cancelled(iter(tasks))  # any iterable: a dict's values view is what the parts pass
    assert all(t.done() for t in tasks) and tasks[0].cancelled()
    assert isinstance(tasks[1].exception(), RuntimeError)
    await all_cancelled([])


# ---- a small SQLite file -------------------------------------------------------------------------------
def test_a_transaction_makes_the_folder_runs_the_schema_in_wal_and_rolls_back(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "x.db"
    schema = "CREATE TABLE IF NOT EXISTS t (v INTEGER);"
    with transaction(path, schema=schema) as con:
        con.execute("INSERT INTO t VALUES (1)")
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(ZeroDivisionError), transaction(path, schema=schema) as con:
        con.execute("INSERT INTO t VALUES (2)")
        _ = 1 / 0
    with transaction(path, foreign_keys=True) as con:
        assert con.execute("SELECT v FROM t").fetchall() == [(1,)]
        assert con.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    with pytest.raises(sqlite3.ProgrammingError):  # closed once the block ends
        con.execute("SELECT 1")


# ---- a model file's first bytes ------------------------------------------------------------------------
def test_file_head_reads_the_start_or_says_why_not(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF\x03rest")
    assert file_head(f, 4) == (9, b"GGUF")
    assert file_head(f, 100) == (9, b"GGUF\x03rest")
    f.write_bytes(b"")
    assert file_head(f, 4) == "m.gguf is empty; download it again"
    assert file_head(f, 4, named="the file") == "the file is empty; download it again"
    gone = file_head(tmp_path / "missing.bin", 4)
    assert isinstance(gone, str) and gone.startswith("cannot read missing.bin: ")
    if os.geteuid() != 0:  # root reads a 000 file anyway
        f.write_bytes(b"x")
        f.chmod(0)
        assert str(file_head(f, 4)).startswith("cannot read m.gguf")
