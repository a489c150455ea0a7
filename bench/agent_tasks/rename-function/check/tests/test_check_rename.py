from pathlib import Path

import shop.pricing
from shop.cart import Cart
from shop.receipt import format_receipt

ROOT = Path(__file__).resolve().parents[1]


def test_new_name_works():
    assert shop.pricing.order_total([("pen", 150, 2), ("pad", 200, 1)], 0.1) == 550
    cart = Cart(0.5)
    cart.add("pad", 200)
    assert cart.total() == 300
    assert format_receipt([("pad", 200, 1)], 0.5) == "pad x1: 200\ntotal: 300"


def test_old_name_is_gone():
    assert not hasattr(shop.pricing, "calc_total")
    left = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
            if p.name != "test_check_rename.py" and "calc_total" in p.read_text()]
    assert left == []
