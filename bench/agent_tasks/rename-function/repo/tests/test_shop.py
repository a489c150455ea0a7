from shop.cart import Cart
from shop.pricing import calc_total
from shop.receipt import format_receipt


def test_calc_total_with_tax():
    assert calc_total([("pen", 150, 2), ("pad", 200, 1)], 0.1) == 550


def test_cart_total():
    cart = Cart()
    cart.add("pen", 150, 2)
    assert cart.total() == 300


def test_receipt():
    assert format_receipt([("pen", 150, 2)]) == "pen x2: 300\ntotal: 300"
