"""The peers bench/projections.py measures us against (``--peers``): see ``results``."""

from bench.peers.results import Expected, PeerNotBuilt, PeerResultWrong, kafka_streams, quix

__all__ = ["Expected", "PeerNotBuilt", "PeerResultWrong", "kafka_streams", "quix"]
