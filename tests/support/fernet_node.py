"""A node as versions before per-connection AES-GCM on the Raft port ran (test code): its hello lists no
link codec, so its links stay under pysyncobj's Fernet both ways, and it pickles its messages with
pysyncobj's own pickle module (protocol 2), as those versions did.  ``python -m tests.support.fernet_node
--config FILE`` takes the options of ``python -m quorum``."""
import sys

from quorum import linkcrypto

linkcrypto.OFFERED = ()

import pysyncobj.pickle  # noqa: E402
import pysyncobj.tcp_connection  # noqa: E402

import quorum.raft  # noqa: E402,F401 - installs MessagePickle, replaced below
from quorum.__main__ import main  # noqa: E402 - after the codec is withdrawn

pysyncobj.tcp_connection.pickle = pysyncobj.pickle

if __name__ == "__main__":
    sys.exit(main())
