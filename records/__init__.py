"""Record and RPC schemas, defined once (``schema``), and their msgpack codec (``codec``)."""
from .codec import (  # noqa: F401
    CLASSES,
    AllocateProducerIdsRecord,
    AuditEntry,
    AuditGap,
    BrokerEpochCursorRecord,
    FenceBrokerRecord,
    ProducerIdCursorRecord,
    Record,
    RecordError,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    decode,
    decode_batch,
    encode,
    encode_batch,
    from_json_dict,
)
from .schema import LONG_MAX  # noqa: F401
