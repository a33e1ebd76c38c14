"""Names of the tables every projection shares (created by the Alembic migrations)."""

CHECKPOINTS_TABLE = "projection_checkpoints"
VERSIONS_TABLE = "projection_versions"
READER_ROLE = "eventfold_reader"  # created by migration 0005; read models grant it SELECT
