"""A peer's `trusted_network` flag (issue 34, multi-node vLLM and SGLang): kept in peers.json, absent from
files written before it (they still load, untrusted), set and cleared by `switchyard peers trust`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.__main__ import main
from app.core.errors import PeerNotFoundError
from app.lanes.peers.store import PeerStore

# a peers.json as servers wrote it before the flag existed
OLD_PEER = {
    "name": "desk",
    "url": "https://192.168.1.20:8443/v1",
    "server_cert": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    "client_cert": "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n",
    "client_fingerprint": "AB:CD",
    "issued_key": "peer.desk",
    "key_kept": "session",
    "paired_at": 1764000000.0,
}


def old_file(home: Path) -> Path:
    path = home / "peers" / "peers.json"
    path.parent.mkdir(parents=True)
    other = {**OLD_PEER, "name": "laptop", "client_fingerprint": "EF:01", "issued_key": "peer.laptop"}
    path.write_text(json.dumps({"version": 1, "peers": [OLD_PEER, other]}))
    return path


def test_an_old_peers_file_loads_untrusted_and_keeps_the_flag_once_set(isolated_env: Path) -> None:
    path = old_file(isolated_env)
    store = PeerStore(path.parent)
    assert [(s.name, s.trusted_network) for s in store.specs()] == [("desk", False), ("laptop", False)]
    marked = store.set_trusted_network("desk", True)
    assert marked.trusted_network and marked.paired_at == OLD_PEER["paired_at"]
    written = json.loads(path.read_text())["peers"]
    assert written[0] == {**OLD_PEER, "trusted_network": True}  # the rest of the record as it was
    assert written[1]["trusted_network"] is False
    assert PeerStore(path.parent).get("desk").trusted_network
    with pytest.raises(PeerNotFoundError, match=r"no peer named 'nas' \(peers: desk, laptop\)"):
        store.set_trusted_network("nas", True)


def test_peers_trust_sets_and_clears_it_without_a_server(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = old_file(isolated_env)
    assert main(["peers", "trust", "laptop", "--network"]) == 0
    out = capsys.readouterr().out
    assert "the network to laptop is marked trusted" in out and "not encrypted" in out
    assert PeerStore(path.parent).get("laptop").trusted_network
    assert main(["peers", "trust", "laptop", "--no-network", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"name": "laptop", "trusted_network": False}
    assert not PeerStore(path.parent).get("laptop").trusted_network
    assert main(["peers", "trust", "nas", "--network"]) == 2
    assert "no peer named 'nas'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --network or --no-network: one of them, said
        main(["peers", "trust", "laptop"])
