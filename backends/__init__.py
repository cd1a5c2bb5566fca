"""Statehouse's state engine: Flink's keyed and operator state model, no HTTP inside.

Import what you use from the module that defines it (``statehouse.backends.catalog.JobCatalog``,
``statehouse.backends.heap.HeapStore``, ``statehouse.backends.rocksdb.RocksDBStore``): the
package imports nothing, so a light module (``statehouse.backends.ttl``) loads alone. Key-group
math lives in ``statehouse.protocol.keygroups``, which the client distribution ships too.
"""
