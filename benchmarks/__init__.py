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

They live in the source checkout, not in the wheel (they need the test extras): the processes they start
(``python -m benchmarks.X``, nodes running ``benchmarks.stages``) find them through PYTHONPATH, set here.
"""
import os

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _CHECKOUT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_CHECKOUT, os.environ.get("PYTHONPATH")) if p)
