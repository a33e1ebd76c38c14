"""Persistence: the Postgres event store (events and their outbox rows appended in ONE
transaction), group commit, repositories (load and save aggregates) and the write side's
table names.

May import: ``write_model.domain``, psycopg, SQLAlchemy, ``eventfold.contract``; never
``write_model.commands`` or ``write_model.http``.
"""
