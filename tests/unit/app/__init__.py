"""Unit tests of eventfold/ itself: the composition root (app, CLI, settings, serving)."""
