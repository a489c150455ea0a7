"""A shopping cart."""

from shop.pricing import calc_total


class Cart:
    def __init__(self, tax_rate: float = 0.0) -> None:
        self.tax_rate = tax_rate
        self.items: list[tuple[str, int, int]] = []

    def add(self, name: str, price: int, quantity: int = 1) -> None:
        self.items.append((name, price, quantity))

    def total(self) -> int:
        return calc_total(self.items, self.tax_rate)
