"""KTable state stores: a KTable topic's last value per key, kept where the read API serves it.

Owns: the stores (``stores``: their contract; ``rocksdb_store``: RocksDB on local disk, one
database per topic partition with the changelog offset it has applied written in the same batch
as the data), and the view that restores a store from its topic and follows it (``view``, as
its store's writer in ``store_writer``). A
restart of a RocksDB store restores only the records after its checkpoint; a store whose
checkpoint is not valid for the topic (recreated, offsets beyond its end) is wiped and
restored, saying why.

May import: ``outbox.kafka`` and ``outbox.topics`` (topic readers, offsets, topic ids),
``eventfold.contract``, confluent-kafka, rocksdict. The HTTP routes call it;
it imports nothing of them.
"""

from eventfold.read_api.state.entry import KTableEntry
from eventfold.read_api.state.restore import RestoreProgress
from eventfold.read_api.state.rocksdb_store import RocksDBStore
from eventfold.read_api.state.stores import StateStore, StoreConfig
from eventfold.read_api.state.view import KTableView

__all__ = ["KTableEntry", "KTableView", "RestoreProgress", "RocksDBStore",
           "StateStore", "StoreConfig"]
