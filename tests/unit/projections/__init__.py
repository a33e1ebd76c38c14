"""Unit tests of eventfold.projections."""
