"""Unit tests of eventfold.local_stack."""
