"""A node as versions before per-connection AES-GCM on the Raft port ran (test code): its hello lists no
link codec, so its links stay under pysyncobj's Fernet both ways, and it pickles its messages with
pysyncobj's own pickle module (protocol 2), as those versions did.  ``python -m tests.support.fernet_node
--config FILE`` takes the options of ``python -m quorum``."""
import sys

from quorum import linkcrypto

linkcrypto.OFFERED = ()

import pysyncobj.pickle  # noqa: E402

from quorum import raftlink  # noqa: E402
from quorum.__main__ import main  # noqa: E402 - after the codec is withdrawn

raftlink.MessagePickle = pysyncobj.pickle  # protocol 2, as those versions pickled

if __name__ == "__main__":
    sys.exit(main())
