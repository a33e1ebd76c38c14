"""Unit tests of eventfold.contract."""
