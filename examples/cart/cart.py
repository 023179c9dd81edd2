"""Cart arithmetic for the sample shop."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    sku: str
    name: str
    unit_price_cents: int
    quantity: int


def line_total(item: Item) -> int:
    return item.unit_price_cents * item.quantity


def compute_total(items: list[Item]) -> int:
    """Total of the cart in cents."""
    return sum(item.unit_price_cents for item in items)


def format_cents(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"
