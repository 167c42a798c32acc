"""Chaos testing for pidquorum, split by role as in Jepsen and etcd's robustness tests.

``history`` records every operation (invoke / ok / fail / info) as JSON lines,
``checker`` decides whether a history and the cluster's final state are
consistent with a correct allocator (and measures availability), ``report``
renders the verdict (terminal summary with rich, PNG timeline with
matplotlib).  The nemesis, workload and runner drive a live cluster and write
what these modules read; a saved run can be checked again offline
(``pidctl chaos check DIR``).
"""
