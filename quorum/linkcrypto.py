"""Sealing the Raft port's messages: AES-256-GCM per connection instead of pysyncobj's Fernet per message.

pysyncobj seals every Raft message with Fernet (AES-128-CBC, HMAC-SHA256, base64, a timestamp).  On this
machine kind that costs about 12 us to seal and 24 us to open (pysyncobj opens a token twice: once to read
its timestamp, once to decrypt), and a committed entry takes four seals and four opens across the three
nodes, half of them on its critical path.  AES-GCM from the same library takes about 1 us either way.

**Keys.**  ``master_key`` derives one 256-bit key from the cluster secret (PBKDF2-HMAC-SHA256, 100,000
iterations, a salt of its own, so it is independent of pysyncobj's Fernet key).  When a connection opens,
pysyncobj's handshake (under Fernet) has each side pick 32 random bytes; each direction of the connection
gets its own key from the master key and both sides' bytes (HKDF-SHA256, ``direction_key``).  A key is
never used on another connection or in the other direction, so each direction numbers its messages from
0 and uses the number as the GCM nonce: no nonce is ever used twice with a key.

**Replay.**  The receiver expects exactly the next number.  A message replayed, dropped, reordered or
moved from another connection fails to open, and pysyncobj closes the connection (then reconnects with new
keys).  Fernet's own check was weaker: a timestamp of whole seconds that must not go back.

**Switching, and mixed versions.**  A connection starts under Fernet, as in every earlier version.  Each
node's identity hello lists the encodings it reads (``OFFERED``).  A node that reads the peer's hello
listing ``AEAD1`` sends ``{"type": "pq_codec", "codec": AEAD1}`` (still under Fernet) and seals what
follows it with AES-GCM; the peer opens what follows that message with AES-GCM.  TCP keeps the order, so
both sides switch at the same message, and each direction switches on its own.  A node of an earlier
version lists nothing and is never switched to: a cluster can be upgraded one node at a time.

The switch message is sealed with the cluster secret like anything else, so nobody without the secret can
switch a link, and switching changes only the encoding: every message either way is authenticated with
the secret.

**Compression.**  pysyncobj deflates every message (zlib level 3) before sealing it.  For a message of a
few hundred bytes (an AppendEntries of one entry, an acknowledgement) that costs about 18 us here, nearly
all of it the compressor's set-up, to save some 80 bytes on the wire.  ``MessageZlib`` is what the Raft
port's connections (``quorum.raftlink.Link``) compress with: a message under ``COMPRESS_FROM`` bytes
is framed as a zlib stream of one stored block (no compression; about 0.3 us), a larger one (a batch of
entries, a snapshot chunk) is deflated as before.  Either is an ordinary zlib stream: a peer of any
version reads it with ``zlib.decompress``, as it always did.

**Pickling.**  pysyncobj pickles every message with protocol 2, which has no opcode for ``bytes``: each
entry's command is pickled as a call of ``_codecs.encode`` on a latin-1 string, which the receiver looks up
and runs to get the bytes back (an AppendEntries of one entry: 310 bytes, about 2 us to pickle and 2 us to
unpickle in a tight loop here).  ``MessagePickle`` is what those connections
pickle with: protocol 4 (bytes as bytes: 170 bytes, 0.5 and 0.9 us) and the C unpickler
only (pysyncobj retried a message that failed to unpickle with the pure-Python unpickler, for Python 2
peers).  Every Python 3 unpickler reads every protocol up to 4, so a peer of any version reads these
messages, and its own protocol-2 messages are read as before.  Protocol 4, not the newest: a node on a
later Python must not send a protocol an earlier one cannot read.  Unpickling trusts the peer as before:
a message is unpickled only after its seal was checked with the cluster secret.
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
