"""Sealing the Raft port's messages: AES-256-GCM per connection and direction (keys from the cluster
secret and both ends' handshake bytes, messages numbered), switched per link once both ends offer it,
instead of pysyncobj's Fernet per message; and the cheaper compression (``MessageZlib``) and pickling
(``MessagePickle``) the port's connections use.  Every peer version still reads what is sent.  The design,
its costs and the mixed-version rules: ``docs/durability.md`` ("The Raft port's links").
"""
from __future__ import annotations

import functools
import pickle
import struct
import zlib
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

AEAD1 = "aes256gcm-1"
OFFERED = (AEAD1,)
FERNET = "fernet"
_LABEL = b"pidquorum raft link " + AEAD1.encode()
_PBKDF2_ITERATIONS = 100_000


COMPRESS_FROM = 4096  # bytes: smaller messages are sent stored (see the module's text)
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, no dictionary, "fastest" (header checksum valid)
_STORED_BLOCK = struct.Struct("<BHH")  # BFINAL=1 BTYPE=00, LEN, NLEN
_ADLER = struct.Struct(">I")


class MessageZlib:
    """What pysyncobj's TCP connection module calls ``zlib``: small messages as stored zlib streams."""

    decompress = staticmethod(zlib.decompress)

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        n = len(data)
        if n >= COMPRESS_FROM:
            return zlib.compress(data, level)
        return b"".join((_ZLIB_HEADER, _STORED_BLOCK.pack(1, n, n ^ 0xFFFF), data, _ADLER.pack(zlib.adler32(data))))


class MessagePickle:
    """What pysyncobj's TCP connection module calls ``pickle``: protocol 4, the C unpickler only."""

    PROTOCOL = 4
    dumps = staticmethod(functools.partial(pickle.dumps, protocol=PROTOCOL))
    loads = staticmethod(pickle.loads)


def master_key(secret: str | bytes) -> bytes:
    """The 256-bit key every link key is derived from (once per process: PBKDF2 takes ~50 ms)."""
    data = secret.encode() if isinstance(secret, str) else bytes(secret)
    return PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=_LABEL,
                      iterations=_PBKDF2_ITERATIONS).derive(data)


def direction_key(master: bytes, receiver_nonce: bytes, sender_nonce: bytes) -> bytes:
    """The key of one direction of one connection: both sides' handshake bytes, in the direction's order."""
    if not (isinstance(receiver_nonce, bytes) and isinstance(sender_nonce, bytes)):
        raise ValueError("a link key needs both sides' handshake bytes")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=_LABEL + len(receiver_nonce).to_bytes(2, "big") + receiver_nonce + sender_nonce).derive(master)


def _nonce(n: int) -> bytes:
    return n.to_bytes(12, "big")


class LinkCodec:
    """What a Raft connection (``quorum.raftlink.Link``, as pysyncobj's ``TcpConnection``) calls as its
    ``encryptor`` (``encrypt_at_time``, ``extract_timestamp``, ``decrypt``), for one connection: Fernet until a
    direction switches to AES-GCM.

    It belongs to the connection's current handshake.  pysyncobj reuses an outgoing connection object when
    it reconnects; a new handshake replaces the handshake bytes, and from then on this object is plain
    Fernet again (until the transport installs a new one for the new handshake).
    """

    def __init__(self, fernet: Any, master: bytes, conn: Any):
        self._fernet = fernet
        self._master = master
        self._conn = conn
        self._handshake = (conn.sendRandKey, conn.recvRandKey)  # (the peer's bytes, this side's bytes)
        self._seal: AESGCM | None = None
        self._open: AESGCM | None = None
        self._sealed = 0
        self._opened = 0
        self._just_opened: tuple[bytes, bytes] | None = None  # (token, plaintext) between the two calls

    def _current(self) -> bool:
        conn = self._conn
        return conn.sendRandKey is self._handshake[0] and conn.recvRandKey is self._handshake[1]

    # ---------------------------------------------------------------- switching
    def seal_from_now(self) -> None:
        """Seal every later message with AES-GCM (the peer was just told so, under Fernet)."""
        peer, own = self._handshake
        self._seal = AESGCM(direction_key(self._master, receiver_nonce=peer, sender_nonce=own))

    def open_from_now(self) -> None:
        """Open every later message with AES-GCM (the peer said so in the message just opened)."""
        peer, own = self._handshake
        self._open = AESGCM(direction_key(self._master, receiver_nonce=own, sender_nonce=peer))

    def describe(self) -> dict[str, str]:
        live = self._current()
        return {"out": AEAD1 if live and self._seal is not None else FERNET,
                "in": AEAD1 if live and self._open is not None else FERNET}

    @property
    def sealing(self) -> bool:
        return self._seal is not None and self._current()

    # ------------------------------------------------------- pysyncobj's calls
    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        if self._seal is None or not self._current():
            return self._fernet.encrypt_at_time(data, current_time)
        n = self._sealed
        self._sealed = n + 1
        return self._seal.encrypt(_nonce(n), data, None)

    def extract_timestamp(self, token: bytes) -> int:
        if self._open is None or not self._current():
            return self._fernet.extract_timestamp(token)
        try:
            plain = self._open.decrypt(_nonce(self._opened), token, None)
        except InvalidTag:
            # Forged, altered, replayed, reordered or from another link: pysyncobj drops the connection.
            raise InvalidToken from None
        self._opened += 1
        self._just_opened = (token, plain)
        # pysyncobj only checks that this does not go back; the message number did the real check.
        return self._conn.recvLastTimestamp

    def decrypt(self, token: bytes, ttl: int | None = None) -> bytes:
        opened, self._just_opened = self._just_opened, None
        if opened is not None and opened[0] is token:
            return opened[1]
        if self._open is not None and self._current():
            raise InvalidToken  # pysyncobj always reads the timestamp first; anything else is not a message of ours
        return self._fernet.decrypt(token, ttl)
