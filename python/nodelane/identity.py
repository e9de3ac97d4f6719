"""A node's identity: its Ed25519 key and, once registered, its node id, worker id and token.

Identity.load_or_create keeps it in a JSON file only its owner can read
(mode 0600, in a 0700 directory when it creates one), in the same format as
the Go client's identity file (workerapi/client), so one node's identity can
move between the two. Every write is atomic: a temporary file beside it,
synced, then renamed.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import stat
import tempfile
import threading
import time
from typing import Optional

from .errors import ConfigError
from .signing import Signer, b64url_nopad, b64url_nopad_decode
from .times import parse_api_time

#: The version of the identity file format.
IDENTITY_VERSION = 1


def _parse_time(s: Optional[str]) -> Optional[_dt.datetime]:
    """An RFC 3339 UTC time (as the server and the Go client write it), or None."""
    if not s:
        return None
    try:
        return parse_api_time(s)
    except ValueError:
        return None


class Identity:
    """The node's key (which never leaves the node) and its registration. Safe for use from threads.

    An Identity made directly lives in memory only; one from load_or_create
    saves every new registration or token to its file.
    """

    def __init__(self, signer: Optional[Signer] = None, path: Optional[str] = None):
        self.signer = signer or Signer()
        self.path = path
        self._mu = threading.Lock()
        self.node_id: Optional[str] = None
        self.worker_id: Optional[str] = None
        self.token: Optional[str] = None
        self.token_expires_at: Optional[_dt.datetime] = None
        #: When this process got the current token (Unix seconds), to renew at a third of its life.
        self.token_received_at: Optional[float] = None

    def __repr__(self) -> str:
        # Never the token or the key.
        return "Identity(node_id=%r, worker_id=%r, keyid=%s)" % (self.node_id, self.worker_id, self.signer.keyid)

    @classmethod
    def load_or_create(cls, path: str) -> "Identity":
        """Load the identity file at path or, if there is none, create one with a new key.

        A file that its group or others may read or write, or that is not a
        regular file, is refused (ConfigError): it holds the node's key and token.
        """
        try:
            return cls._load(path)
        except FileNotFoundError:
            pass
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, mode=0o700, exist_ok=True)
        ident = cls(Signer(), path)
        tmp = ident._write_temp()
        try:
            os.link(tmp, path)  # fails if the file appeared meanwhile: then the other key wins
        except FileExistsError:
            return cls._load(path)
        finally:
            os.unlink(tmp)
        return ident

    @classmethod
    def _load(cls, path: str) -> "Identity":
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ConfigError("identity file %s is a symbolic link, not a regular file" % path)
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ConfigError("identity file %s is not a regular file" % path)
        with os.fdopen(fd, "rb") as f:
            if st.st_mode & 0o077:
                raise ConfigError("identity file %s has mode %04o: it holds the node's key and must be 0600 "
                                  "(chmod 600 %s)" % (path, st.st_mode & 0o777, path))
            try:
                v = json.loads(f.read(1 << 20).decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise ConfigError("identity file %s: %s" % (path, e))
        if not isinstance(v, dict) or v.get("version") != IDENTITY_VERSION:
            raise ConfigError("identity file %s is not version %d" % (path, IDENTITY_VERSION))
        try:
            seed = b64url_nopad_decode(v.get("private_key", ""))
            if len(seed) != 32:
                raise ValueError("length")
        except ValueError:
            raise ConfigError("identity file %s: private_key is not a 32-byte Ed25519 seed in unpadded "
                              "base64url" % path)
        ident = cls(Signer.from_seed(seed), path)
        if v.get("public_key") and v["public_key"] != ident.signer.public_key:
            raise ConfigError("identity file %s: public_key does not match private_key" % path)
        ident.node_id = v.get("node_id") or None
        ident.worker_id = v.get("worker_id") or None
        ident.token = v.get("worker_token") or None
        ident.token_expires_at = _parse_time(v.get("token_expires_at"))
        return ident

    def set_registration(self, node_id: Optional[str], worker_id: Optional[str], token: str,
                         expires_at: "str | _dt.datetime | None" = None) -> None:
        """Keep a new registration or token, and save it to the file if there is one."""
        if isinstance(expires_at, str):
            expires_at = _parse_time(expires_at)
        with self._mu:
            self.node_id, self.worker_id, self.token = node_id, worker_id, token
            self.token_expires_at = expires_at
            self.token_received_at = time.time()
            if self.path:
                tmp = self._write_temp_locked()
                os.replace(tmp, self.path)

    def _document(self) -> bytes:
        v = {"version": IDENTITY_VERSION, "private_key": b64url_nopad(self.signer.seed()),
             "public_key": self.signer.public_key, "key_id": self.signer.keyid}
        if self.node_id:
            v["node_id"] = self.node_id
        if self.worker_id:
            v["worker_id"] = self.worker_id
        if self.token:
            v["worker_token"] = self.token
        if self.token_expires_at:
            v["token_expires_at"] = self.token_expires_at.astimezone(_dt.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%S.%fZ")
        return (json.dumps(v, indent=2) + "\n").encode("utf-8")

    def _write_temp(self) -> str:
        with self._mu:
            return self._write_temp_locked()

    def _write_temp_locked(self) -> str:
        assert self.path
        fd, tmp = tempfile.mkstemp(prefix=".identity-", dir=os.path.dirname(os.path.abspath(self.path)))
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, self._document())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp
