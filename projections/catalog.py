"""Names of the tables every projection shares (created by the Alembic migrations)."""

CHECKPOINTS_TABLE = "projection_checkpoints"
VERSIONS_TABLE = "projection_versions"
