"""Orders per customer: a stream-table left join, then a count per customer.

    POST /commands/RegisterCustomer {"customer_id": "c1", "name": "Ada"}
    POST /commands/PlaceOrder       {"order_id": "o1", "customer_id": "c1", "amount": 30}

``customers`` folds customer events into a KTable (name per customer). ``orders_per_customer``
re-keys orders by customer, looks each one up in ``customers`` (a left join: an unknown
customer's orders still count, with no name) and counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field
from sqlalchemy import BigInteger, Float, String

from eventfold.app import Eventfold
from eventfold.projections import Lookup, State, projection
from eventfold.write_model import Aggregate, Command, DomainError, DomainEvent


@dataclass(frozen=True)
class CustomerRegistered(DomainEvent):
    name: str


@dataclass(frozen=True)
class CustomerRenamed(DomainEvent):
    name: str


@dataclass(frozen=True)
class OrderPlaced(DomainEvent):
    customer_id: str
    amount: float


class Customer(Aggregate):
    name: str = ""

    def register(self, name: str) -> None:
        if self.name:
            raise DomainError(f"customer {self.id} is already registered")
        self.record(CustomerRegistered(name=name))

    def rename(self, name: str) -> None:
        self.record(CustomerRenamed(name=name))

    def apply(self, event: DomainEvent) -> None:
        if isinstance(event, CustomerRegistered | CustomerRenamed):
            self.name = event.name


class Order(Aggregate):
    def place(self, customer_id: str, amount: float) -> None:
        if self.version > 0:
            raise DomainError(f"order {self.id} was already placed")
        self.record(OrderPlaced(customer_id=customer_id, amount=amount))

    def apply(self, event: DomainEvent) -> None:
        pass


class RegisterCustomer(Command):
    """Register a customer with a display name."""

    customer_id: str = Field(min_length=1, max_length=100)
    name: str = Field(min_length=1, max_length=200)

    def stream_id(self) -> str:
        return self.customer_id


class RenameCustomer(Command):
    """Change a registered customer's display name."""

    customer_id: str = Field(min_length=1, max_length=100)
    name: str = Field(min_length=1, max_length=200)

    def stream_id(self) -> str:
        return self.customer_id


class PlaceOrder(Command):
    """Place an order for a customer (known or not)."""

    order_id: str = Field(min_length=1, max_length=100)
    customer_id: str = Field(min_length=1, max_length=100)
    amount: float = Field(gt=0)

    def stream_id(self) -> str:
        return self.order_id


@projection("customers", sources=["Customer"], columns={"name": String()},
            event_types=[CustomerRegistered, CustomerRenamed])
def customers(state: State | None, event: CustomerRegistered | CustomerRenamed) -> State | None:
    """The current name of every customer: the table side of the join."""
    return {"name": event.name}


@projection("orders_per_customer", sources=["Order"], key_by="customer_id",
            lookup=Lookup("customers", on="customer_id"), event_types=[OrderPlaced],
            columns={"orders": BigInteger(), "amount": Float(), "customer_name": String()})
def orders_per_customer(state: State | None, order: OrderPlaced) -> State | None:
    """Orders and amount per customer, with the customer's name when the customer is known."""
    current = state or {"orders": 0, "amount": 0.0, "customer_name": None}
    customer = order.recorded.joined
    return {"orders": current["orders"] + 1,
            "amount": round(current["amount"] + order.amount, 2),
            "customer_name": customer["name"] if customer else current["customer_name"]}


app = Eventfold("orders", projections=[customers, orders_per_customer])


@app.commands.handler(RegisterCustomer, Customer)
def register_customer(customer: Customer, command: RegisterCustomer) -> None:
    customer.register(command.name)


@app.commands.handler(RenameCustomer, Customer, requires_existing=True)
def rename_customer(customer: Customer, command: RenameCustomer) -> None:
    customer.rename(command.name)


@app.commands.handler(PlaceOrder, Order)
def place_order(order: Order, command: PlaceOrder) -> None:
    order.place(command.customer_id, command.amount)
