"""Benchmarks that ship with pidquorum, each run by ``pidctl bench``:

* ``pidctl bench`` (``run``, ``run_report``, ``systems``, ``worker``, ``floor``): pidquorum against
  ZooKeeper and etcd, side by side;
* ``pidctl bench NAME`` (or ``python -m benchmarks.MODULE``): ``quorum`` (``quorum_phases``), ``pid-manager``
  (``pid_manager``), ``broker``, ``metrics``, ``quota``, ``producers``, ``transactions``, ``security``,
  ``audit``, ``stages``, ``ab``.

What they share: ``harness`` (options, results, phases run in turn, the JSON, the exit status), ``report``
(tables, numbers, latency summaries, the closing lines), ``common`` (percentiles, throw-away clusters,
leader kills), ``processes`` (child processes we own, and ``BrokerProcess``, the broker harness the tests
use too), ``zookeeper`` (one ZooKeeper start-up, for the comparison and the migration tests), ``pki`` (a
throw-away CA), ``provision`` (apt-get for the peers).
"""
