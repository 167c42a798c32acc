"""Inputs and decoder properties shared by the fuzz tests (tests/fuzz) and the campaign (``tests/fuzz/campaign.py``).

Everything is derived from the servers' own tables, so an API, version or
record type added later is fuzzed without touching the generators:

* Kafka requests (``request_inputs``): every (API key, version) in
  ``quorum.client.api.SUPPORTED`` and ``broker.frontend.SUPPORTED``, built from
  kio's request schemas, and ``corrupt_frame``'s structured corruptions.
* Records and msgpack APIs (``record_inputs``): every spec in
  ``records.schema.RECORDS + PAYLOADS``, DescribeState maps and every record RPC
  request class in ``quorum.client.api.RPC_RESPONSES``.
* Files (``file_inputs``): every file kind the project writes.

Values are drawn from a *source* (``sources``): ``RandomSource`` (a seeded
``random.Random``, for the campaign and the seeded mutation tests) or
``HypothesisSource`` (a hypothesis ``data`` object, so hypothesis shrinks
failures).  The ``check_*`` functions are the decoder properties: they return an
outcome name, and any exception they let through is a finding.  This module
re-exports all of them, so callers need one import.
"""
from __future__ import annotations

import msgpack

from tests.fuzz.file_inputs import (
    FILE_KINDS, _prefix_of, _read_file, _replicated_records, _run_of, _same, check_file_decoder, file_input,
    mutate_bytes, sealed_garbage, valid_file,
)
from tests.fuzz.record_inputs import (
    RPC_REQUESTS, _packable, check_record_decoder, check_record_obj, check_record_values, msgpack_request,
    random_value, record_obj, valid_field_value, valid_record, wrong_value,
)
from tests.fuzz.request_inputs import (
    Api, CORRUPTIONS, HUGE_FIXED, HUGE_VARINTS, MAX_ARRAY, _INTS, _broker_error_body, _check_answer, _fields,
    _records, _scalar, _uvarint, broker_tables, build_entity, check_request_decoder, corrupt_frame,
    encode_frame, fuzz_frame, header_size, kafka_apis, server_api, valid_request,
)
from tests.fuzz.sources import (
    FuzzFinding, HEADROOM, HypothesisSource, PROFILE_ENV, RandomSource, SCALE_ENV, examples,
    load_hypothesis_profile, vm_size,
)

__all__ = [
    "msgpack", "FuzzFinding", "HEADROOM", "HypothesisSource", "PROFILE_ENV", "RandomSource", "SCALE_ENV",
    "examples", "load_hypothesis_profile", "vm_size", "RPC_REQUESTS", "_packable", "check_record_decoder",
    "check_record_obj", "check_record_values", "msgpack_request", "random_value", "record_obj",
    "valid_field_value", "valid_record", "wrong_value", "Api", "CORRUPTIONS", "HUGE_FIXED", "HUGE_VARINTS",
    "MAX_ARRAY", "_INTS", "_broker_error_body", "_check_answer", "_fields", "_records", "_scalar", "_uvarint",
    "broker_tables", "build_entity", "check_request_decoder", "corrupt_frame", "encode_frame", "fuzz_frame",
    "header_size", "kafka_apis", "server_api", "valid_request", "FILE_KINDS", "_prefix_of", "_read_file",
    "_replicated_records", "_run_of", "_same", "check_file_decoder", "file_input", "mutate_bytes",
    "sealed_garbage", "valid_file",
]
