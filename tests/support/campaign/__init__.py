"""A fault campaign, as Jepsen runs one: a client records a history (the commands it sent,
each until answered: the event store), a nemesis strikes the processes at their fault points
from a schedule drawn from a seed, and checkers judge what was written against every
guarantee (``checkers.CHECKERS``). ``tests/integration/test_campaign.py`` runs a set of seeds
in the suite; ``bench/campaign.py`` runs a soak of as many as asked.

- ``app``: the app the schedules run (a projection, a reaction, a process manager);
- ``schedule``: schedules from seeds;
- ``actors``: the processes of a schedule, as threads of this process;
- ``nemesis``: what strikes them, at their fault points;
- ``checkers``: the invariants;
- ``run``: one schedule, start to end.
"""
