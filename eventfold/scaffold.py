"""``eventfold init``: a first application of one's own, in the working directory.

It writes three files and nothing else: the app module (an aggregate, two commands, a
projection and a reaction), ``eventfold.toml`` naming it, and a test of the app in memory
(``eventfold.testing``) and of its projection in the plain-Python fold harness. A file that
exists is never overwritten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

APP_TEMPLATE = '''\
"""{name}: accounts take deposits and withdrawals; a projection keeps each balance, and a
reaction pays a welcome bonus on an account's first deposit (`eventfold reaction run`).

    POST /commands/Deposit  {{"account": "alice", "amount": 100}}
    POST /commands/Withdraw {{"account": "alice", "amount": 30}}
    GET  /read-models/balances/rows/alice   ->  {{"row": {{"key": "alice", "balance": 70, ...}}}}
    GET  /ktables/balances/entries/alice    ->  {{"key": "alice", "value": {{"balance": 70}}}}
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field
from sqlalchemy import BigInteger

from eventfold import (
    Aggregate,
    Command,
    DomainError,
    DomainEvent,
    Eventfold,
    State,
    handles,
    projection,
    reaction,
)


@dataclass(frozen=True)
class Deposited(DomainEvent):
    amount: int


@dataclass(frozen=True)
class Withdrawn(DomainEvent):
    amount: int


class Deposit(Command):
    """Put ``amount`` into ``account`` (opening it on the first deposit)."""

    account: str = Field(min_length=1, max_length=200)
    amount: int = Field(gt=0, le=1_000_000_000)

    def stream_id(self) -> str:
        return self.account


class Withdraw(Command):
    """Take ``amount`` out of an existing ``account``; refused beyond its balance."""

    account: str = Field(min_length=1, max_length=200)
    amount: int = Field(gt=0, le=1_000_000_000)

    def stream_id(self) -> str:
        return self.account


class Account(Aggregate):
    balance: int = 0

    @handles(Deposit)
    def deposit(self, amount: int) -> None:
        self.record(Deposited(amount=amount))

    @handles(Withdraw, requires_existing=True)
    def withdraw(self, amount: int) -> None:
        if amount > self.balance:
            raise DomainError(f"cannot withdraw {{amount}} from {{self.id}}: balance "
                              f"{{self.balance}}")
        self.record(Withdrawn(amount=amount))

    def apply(self, event: DomainEvent) -> None:
        match event:
            case Deposited(amount=amount):
                self.balance += amount
            case Withdrawn(amount=amount):
                self.balance -= amount


@projection("balances", sources=[Account], event_types=[Deposited, Withdrawn],
            columns={{"balance": BigInteger()}}, indexes=["balance"])
def balances(state: State | None, event: Deposited | Withdrawn) -> State | None:
    """Each account's balance: a read model in Postgres and a KTable in Kafka."""
    balance = (state or {{"balance": 0}})["balance"]
    match event:
        case Deposited(amount=amount):
            return {{"balance": balance + amount}}
        case Withdrawn(amount=amount):
            return {{"balance": balance - amount}}


@reaction("welcome_bonus", sources=[Account], event_types=[Deposited])
def welcome_bonus(deposited: Deposited) -> Deposit | None:
    """An account's first deposit earns a bonus of 10: sent once, however often the event
    is delivered (the command's id derives from the event's). ``recorded`` says where the
    event was recorded: its stream id and version."""
    if deposited.recorded.stream_version == 1:
        return Deposit(account=deposited.recorded.stream_id, amount=10)
    return None


app = Eventfold("{name}", aggregates=[Account], projections=[balances],
                reactions=[welcome_bonus])
'''

CONFIG_TEMPLATE = '''\
# Eventfold settings for this directory; EVENTFOLD_* environment variables win over these.
app = "{module}:app"
'''

TEST_TEMPLATE = '''\
"""{module} in memory (``eventfold.testing``): its commands, projection and reaction run
together, as on the stack, with no Postgres, Kafka or Spark; and its projection folded in
plain Python (the code Spark's tasks run)."""

from eventfold import DomainError, EventLog, fold_in_memory
from eventfold.testing import AggregateFixture, InMemoryApp

from {module} import Deposit, Deposited, Withdraw, app, balances


def test_a_first_deposit_earns_one_bonus_and_the_balance_follows() -> None:
    bank = InMemoryApp(app)
    bank.execute(Deposit(account="alice", amount=100))
    bank.execute(Deposit(account="alice", amount=5))
    bank.execute(Withdraw(account="alice", amount=30))
    assert bank.sent("welcome_bonus") == [Deposit(account="alice", amount=10)]
    assert bank.state("balances", "alice") == {{"balance": 85}}


def test_a_withdrawal_beyond_the_balance_is_refused() -> None:
    (AggregateFixture(app, "alice").given(Deposited(amount=20))
     .when(Withdraw(account="alice", amount=30))
     .then_refused(DomainError, "balance 20"))


def test_an_event_delivered_twice_counts_once() -> None:
    log = EventLog("Account")
    deposit = log.append("alice", "Deposited", amount=100)
    again = deposit._replace(offset=deposit.offset + 1)  # the connector sent it again
    assert fold_in_memory(balances, [deposit, again]) == {{"alice": {{"balance": 100}}}}
'''

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Scaffold:
    module: str = "myapp"

    def __post_init__(self) -> None:
        if not _MODULE_NAME.fullmatch(self.module):
            raise ValueError(f"{self.module!r} is not a Python module name (letters, digits "
                             "and _, not starting with a digit)")

    def files(self) -> dict[str, str]:
        return {
            f"{self.module}.py": APP_TEMPLATE.format(name=self.module),
            "eventfold.toml": CONFIG_TEMPLATE.format(module=self.module),
            f"test_{self.module}.py": TEST_TEMPLATE.format(module=self.module),
        }

    def write(self, directory: Path) -> list[Path]:
        """Write the files into ``directory``; refuses (writing nothing) if any exists."""
        files = {directory / name: text for name, text in self.files().items()}
        existing = sorted(str(path) for path in files if path.exists())
        if existing:
            raise FileExistsError(f"{', '.join(existing)} already exist(s); nothing written "
                                  "(choose another --name or another directory)")
        for path, text in files.items():
            path.write_text(text)
        return list(files)
