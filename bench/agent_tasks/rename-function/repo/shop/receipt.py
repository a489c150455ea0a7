"""Receipts as text."""

from shop.pricing import calc_total


def format_receipt(items: list[tuple[str, int, int]], tax_rate: float = 0.0) -> str:
    lines = [f"{name} x{quantity}: {price * quantity}" for name, price, quantity in items]
    lines.append(f"total: {calc_total(items, tax_rate)}")
    return "\n".join(lines)
