"""The credentials file: users and their SCRAM-SHA-256 stored keys (RFC 5802 / 7677).

No password is stored: per user a random salt, an iteration count, and
``StoredKey = H(HMAC(SaltedPassword, "Client Key"))`` and
``ServerKey = HMAC(SaltedPassword, "Server Key")`` with
``SaltedPassword = PBKDF2-HMAC-SHA256(password, salt, iterations)``.  These serve
SCRAM-SHA-256 directly and PLAIN by recomputing StoredKey from the offered
password (constant-time comparison).

The file is JSON, written atomically (temporary file, fsync, rename) with mode
0600::

    {"format": "pidquorum-credentials", "version": 1,
     "users": {"alice": {"mechanism": "SCRAM-SHA-256", "iterations": 4096,
                         "salt": "<base64>", "stored_key": "<base64>", "server_key": "<base64>"}}}

A file that cannot be read or does not have this shape raises
``CredentialsError`` naming the file.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
from dataclasses import dataclass

FORMAT = "pidquorum-credentials"
VERSION = 1
MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096          # RFC 7677's minimum; Kafka's default for SCRAM-SHA-256 too
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 1_000_000
MAX_USER_CHARS = 255
RESERVED_PREFIX = "__"             # internal principals (the quorum nodes' own); never in the file


class CredentialsError(Exception):
    """The credentials file is unreadable or malformed, or a user name / password is not acceptable."""


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return {"mechanism": MECHANISM, "iterations": self.iterations, "salt": b64(self.salt),
                "stored_key": b64(self.stored_key), "server_key": b64(self.server_key)}


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)


def client_key(salted: bytes) -> bytes:
    return hmac.new(salted, b"Client Key", hashlib.sha256).digest()


def make_credential(password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = salted_password(password, salt, iterations)
    return ScramCredential(salt=salt, iterations=iterations,
                           stored_key=hashlib.sha256(client_key(salted)).digest(),
                           server_key=hmac.new(salted, b"Server Key", hashlib.sha256).digest())


def check_password(cred: ScramCredential, password: str) -> bool:
    """PLAIN: does ``password`` produce the stored key?  (Constant-time comparison.)"""
    offered = hashlib.sha256(client_key(salted_password(password, cred.salt, cred.iterations))).digest()
    return hmac.compare_digest(offered, cred.stored_key)


def check_user_name(user: str) -> None:
    if not isinstance(user, str) or not user or len(user) > MAX_USER_CHARS:
        raise CredentialsError(f"user name must be 1..{MAX_USER_CHARS} characters")
    if user.startswith(RESERVED_PREFIX):
        raise CredentialsError(f"user name {user!r}: names starting with {RESERVED_PREFIX!r} are reserved")
    bad = [c for c in user if c in ",=\0:" or not c.isprintable() or c.isspace()]
    if bad:
        raise CredentialsError(f"user name {user!r}: character {bad[0]!r} is not allowed "
                               "(no ',', '=', ':', NUL, whitespace or control characters)")


class Credentials:
    """The users of one credentials file, as loaded."""

    def __init__(self, path: str, users: dict[str, ScramCredential]):
        self.path = path
        self.users = users
        self._mock_key: bytes | None = None
        self._mock_iterations = DEFAULT_ITERATIONS

    def with_internal(self, internal: dict[str, ScramCredential]) -> "Credentials":
        """These users plus internal ones (reserved names, never in the file)."""
        return self if not internal else Credentials(self.path, {**self.users, **internal})

    def get(self, user: str) -> ScramCredential | None:
        return self.users.get(user)

    def mock(self, user: str) -> ScramCredential:
        """What SCRAM answers for an unknown ``user`` (RFC 5802 section 5.1): a salt and iteration count that
        look like a real user's and stay the same for every attempt, so the server-first message does not
        tell an unknown name from a known one (Kafka's does: it fails the exchange at once).  Derived from
        the users' stored keys, which nobody outside knows, so no proof ever matches its stored key."""
        if self._mock_key is None:
            material = b"".join(sorted(c.stored_key + c.server_key for c in self.users.values()))
            self._mock_key = hashlib.sha256(b"pidquorum scram mock v1" + material + self.path.encode()).digest()
            counts: dict[int, int] = {}
            for c in self.users.values():
                counts[c.iterations] = counts.get(c.iterations, 0) + 1
            self._mock_iterations = max(counts, key=counts.get) if counts else DEFAULT_ITERATIONS
        key, name = self._mock_key, user.encode()
        derive = lambda label: hmac.new(key, label + b"\0" + name, hashlib.sha256).digest()  # noqa: E731
        return ScramCredential(salt=derive(b"salt")[:16], iterations=self._mock_iterations,
                               stored_key=derive(b"stored"), server_key=derive(b"server"))

    def verify_plain(self, user: str, password: str) -> bool:
        cred = self.users.get(user)
        if cred is None:
            # Spend the same work as for a known user: the answer time does not tell who exists.
            check_password(_DUMMY, password)
            return False
        return check_password(cred, password)


_DUMMY = make_credential("", salt=b"\0" * 16)

# The quorum nodes authenticate to each other (a follower forwarding to the leader) as this
# user, with a password derived from the cluster secret; it is a super user on the quorum.
NODE_USER = RESERVED_PREFIX + "pidquorum_node__"


def node_password(cluster_secret: str) -> str:
    return hmac.new(cluster_secret.encode(), b"pidquorum node-to-node SASL v1", hashlib.sha256).hexdigest()


def node_credential(cluster_secret: str) -> ScramCredential:
    salt = hmac.new(cluster_secret.encode(), b"pidquorum node-to-node salt v1", hashlib.sha256).digest()[:16]
    return make_credential(node_password(cluster_secret), salt=salt)


def _b64(path: str, user: str, entry: dict, key: str) -> bytes:
    value = entry.get(key)
    if not isinstance(value, str):
        raise CredentialsError(f"{path}: user {user!r}: {key} is missing")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CredentialsError(f"{path}: user {user!r}: {key} is not base64") from None


def _parse(path: str, raw: bytes) -> Credentials:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CredentialsError(f"{path}: not a credentials file (invalid JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CredentialsError(f"{path}: not a credentials file (no \"format\": \"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise CredentialsError(f"{path}: unsupported credentials file version {doc.get('version')!r} "
                               f"(this build reads version {VERSION})")
    users_raw = doc.get("users")
    if not isinstance(users_raw, dict):
        raise CredentialsError(f"{path}: \"users\" must be an object")
    users: dict[str, ScramCredential] = {}
    for user, entry in users_raw.items():
        if not isinstance(entry, dict):
            raise CredentialsError(f"{path}: user {user!r}: entry must be an object")
        if entry.get("mechanism") != MECHANISM:
            raise CredentialsError(f"{path}: user {user!r}: unsupported mechanism {entry.get('mechanism')!r}")
        iterations = entry.get("iterations")
        if isinstance(iterations, bool) or not isinstance(iterations, int) \
                or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise CredentialsError(f"{path}: user {user!r}: iterations {iterations!r} is not in "
                                   f"{MIN_ITERATIONS}..{MAX_ITERATIONS}")
        salt, stored, server = (_b64(path, user, entry, k) for k in ("salt", "stored_key", "server_key"))
        if len(salt) < 8 or len(stored) != 32 or len(server) != 32:
            raise CredentialsError(f"{path}: user {user!r}: salt, stored_key or server_key has the wrong length")
        users[user] = ScramCredential(salt, iterations, stored, server)
    return Credentials(path, users)


def load(path: str) -> Credentials:
    """The users in ``path``; a missing file is an error (an empty one is written by ``add_user``)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CredentialsError(f"{path}: cannot read the credentials file: {e.strerror}") from None
    return _parse(path, raw)


def _load_or_empty(path: str) -> Credentials:
    if not os.path.exists(path):
        return Credentials(path, {})
    return load(path)


def _write(path: str, creds: Credentials) -> None:
    doc = {"format": FORMAT, "version": VERSION,
           "users": {u: c.to_json() for u, c in sorted(creds.users.items())}}
    data = (json.dumps(doc, indent=2) + "\n").encode()
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".credentials-", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def add_user(path: str, user: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> bool:
    """Create or update ``user`` (a new salt every time).  Returns True if the user is new."""
    check_user_name(user)
    if not isinstance(password, str) or not password:
        raise CredentialsError("the password must not be empty")
    if "\0" in password:
        raise CredentialsError("the password must not contain NUL (SASL/PLAIN cannot carry it)")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialsError(f"iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    creds = _load_or_empty(path)
    new = user not in creds.users
    creds.users[user] = make_credential(password, iterations)
    _write(path, creds)
    return new


def remove_user(path: str, user: str) -> bool:
    """Remove ``user``.  Returns False if there was no such user (nothing written)."""
    creds = load(path)
    if creds.users.pop(user, None) is None:
        return False
    _write(path, creds)
    return True


def list_users(path: str) -> list[dict]:
    creds = load(path)
    return [{"user": u, "mechanism": MECHANISM, "iterations": c.iterations} for u, c in sorted(creds.users.items())]


class CredentialsStore:
    """A credentials file that servers read again when it changes (mtime and size)."""

    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._creds = load(path)  # fail at start-up, naming the file
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
            return st.st_mtime_ns, st.st_size
        except OSError:
            return None

    def current(self) -> Credentials:
        stamp = self._stat()
        if stamp is not None and stamp != self._stamp:
            try:
                self._creds = load(self.path)
                self._stamp = stamp
            except CredentialsError:
                # Keep serving with the users last read; the broken file is reported on every change.
                logging.getLogger(__name__).exception("credentials file changed but cannot be used; "
                                                      "keeping the users read before")
                self._stamp = stamp
        return self._creds
