"""Paired peers: other Switchyard servers whose models are served here as `PEER/MODEL` (docs/peers.md).

identity.py  this machine's client certificate (mutual TLS) and the TLS contexts that pin a peer's
pairing.py   one-time codes, the wrong-code lock, and the proofs that bind both certificates to a code
store.py     peers.json (names, addresses, pinned certificates, key names) and each peer's key in the keyring
registry.py  the running server's peers: invite, pair, accept, check, remove; each peer served through the
             remote lane machinery (app/lanes/remote/) with a session of its own
"""
