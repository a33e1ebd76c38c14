"""Worked examples: small but complete Eventfold applications, each also an acceptance test."""
