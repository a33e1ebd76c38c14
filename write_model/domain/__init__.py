"""The domain: aggregates, domain events and their registry, value checks, ids.

Plain Python a user's business rules are written in; it knows nothing of storage or
transport. May import: the standard library and ``eventfold.contract``, never
``write_model.persistence``, ``write_model.commands`` or ``write_model.http``.
"""
