"""Unit tests of eventfold.outbox."""
