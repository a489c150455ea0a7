"""Prices of orders, in cents."""


def calc_total(items: list[tuple[str, int, int]], tax_rate: float = 0.0) -> int:
    """The total of (name, unit price, quantity) items with tax, rounded to a cent."""
    subtotal = sum(price * quantity for _, price, quantity in items)
    return round(subtotal * (1 + tax_rate))
