"""Unit tests of eventfold.write_model."""
