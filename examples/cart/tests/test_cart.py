import unittest

from cart import Item, compute_total, format_cents


class CartTest(unittest.TestCase):
    def test_empty_cart_costs_nothing(self) -> None:
        self.assertEqual(compute_total([]), 0)

    def test_single_item_total(self) -> None:
        self.assertEqual(compute_total([Item("a", "A", 250, 1)]), 250)

    def test_format_cents(self) -> None:
        self.assertEqual(format_cents(1234), "$12.34")
        self.assertEqual(format_cents(5), "$0.05")


if __name__ == "__main__":
    unittest.main()
