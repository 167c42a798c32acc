"""Benchmarks that ship with pidquorum, each run by ``pidctl bench``:

* ``pidctl bench`` (``run``, ``systems``, ``worker``): pidquorum against ZooKeeper and etcd, side by side;
* ``pidctl bench NAME`` (or ``python -m benchmarks.MODULE``): ``quorum`` (``quorum_phases``), ``pid-manager``
  (``pid_manager``), ``broker``, ``metrics``, ``quota``, ``producers``,
  ``transactions``, ``security``, ``audit``.

Their helpers: ``common`` (results, tables, throw-away clusters, leader kills), ``processes`` (child
processes we own, and ``BrokerProcess``, the broker harness the tests use too), ``zookeeper`` (one
ZooKeeper start-up, for the comparison and the migration tests), ``pki`` (a throw-away CA).
"""
