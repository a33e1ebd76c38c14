"""Names of the tables every projection shares (created by the Alembic migrations)."""

CHECKPOINTS_TABLE = "projection_checkpoints"
VERSIONS_TABLE = "projection_versions"
READER_ROLE = "eventfold_reader"  # created by migration 0005; read models grant it SELECT
KTABLE_READERS_TABLE = "ktable_readers"  # migration 0008: which instance has which topic open
RETIRED_TOPICS_TABLE = "retired_ktable_topics"  # replaced versions' topics awaiting deletion
READER_TTL_S = 15.0
"""A reader whose heartbeat is older than this is gone (crashed or stopped)."""
READER_HEARTBEAT_S = 3.0
"""How often a read API instance renews its rows: well inside ``READER_TTL_S``."""
