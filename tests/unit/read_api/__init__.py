"""Unit tests of eventfold.read_api."""
