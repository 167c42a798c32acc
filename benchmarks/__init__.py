"""Benchmarks that ship with pidquorum: ``pidctl bench`` (pidquorum vs ZooKeeper and etcd) and their helpers."""
