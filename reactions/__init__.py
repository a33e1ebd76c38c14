"""Reactions: events that drive commands.

A reaction is a function of one event that returns the commands to send (zero or more):
``@reaction("reserve_stock", sources=["Purchase"])``. A process manager is a reaction with
state per correlation key and timers: ``@process("payment_deadline", sources=[Purchase])``
on a function of a ``ProcessContext`` and an event. A side effect outside Eventfold is an
``@effect`` on a function of an event and its idempotency key, called at least once with
retries. A ``ReactionRunner`` reads the sources' event topics from the reaction's own
positions, sends each command through the command bus with an id derived from the reaction,
the event and the command's index (so a batch run again after a crash sends nothing twice:
the command log answers the repeat with the first result), records what the domain refused,
and saves its positions only after every command of the batch was answered. A process
manager saves its steps (states, timers, and the commands they decided) first and sends the
commands after (``outbox``), so a step that lost to another runner sends nothing.

- ``definition``: what a reaction is (plain Python): ``Reaction``, ``reaction``, ``Effect``,
  ``effect``, ``ReactionRegistry``, ``command_id_for``; its sources (aggregate types, and
  ``DerivedEvents``: a projection's derived-event topic) and its event types (by name, or as
  the domain's classes, which the function then receives);
- ``process``: process managers: ``Process``, ``process``, ``ProcessContext``, and their
  states and timers in Postgres;
- ``process_view``: what operators see of them: each change of a key's process appended as an
  event of its own stream, folded by the projection ``<name>_processes`` (a read model and a
  KTable, added to the app with the process);
- ``positions``: where a reaction is, and what the domain refused it, in Postgres;
- ``parking``: keys parked behind an event the function raised on, their held events, and
  the retries operators ask for;
- ``batch``: one batch as a runner reads and acts on it, and what a runner counts;
- ``sending``: commands sent through the bus in order per group, refusals recorded;
- ``effects``: an effect's calls, at least once per event, given up on loudly;
- ``outbox``: a process manager's saved commands, sent after its steps commit;
- ``process_steps``: a process manager's events and due timers stepped, saved, then sent;
- ``runner``: the loop that reads, reacts (or steps), sends and saves;
- ``operations``: status and reset, for operators.

May import: ``eventfold.contract``, ``eventfold.write_model`` (the commands it sends, and
the append its process managers' changes go through), ``eventfold.outbox`` (the event
topics it reads) and ``eventfold.projections`` (the ``Event`` a reaction receives, the one a
projection's fold receives, the projection a process manager's view is, and the fault
points tests use); psycopg, confluent-kafka, SQLAlchemy's column types. Nothing but the
composition root imports it: events flow from the outbox into reactions and back to the write
side as commands.
"""

from eventfold.reactions.definition import (
    DerivedEvents,
    Effect,
    Reaction,
    ReactionRegistry,
    command_id_for,
    effect,
    reaction,
)
from eventfold.reactions.process import Process, ProcessContext, process

__all__ = ["DerivedEvents", "Effect", "Process", "ProcessContext", "Reaction", "ReactionRegistry",
           "command_id_for", "effect", "process", "reaction"]
