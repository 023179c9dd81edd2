"""A tiny shop whose cart page shows a wrong total (the sample bug durafix repairs).

Run: ``python3 app.py --port 8000``. Pages: ``/`` (the cart), ``/api/cart`` (JSON), ``/healthz``.
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cart import Item, compute_total, format_cents, line_total

CART = [
    Item("tea", "Green tea", 450, 3),
    Item("mug", "Stoneware mug", 1200, 1),
    Item("honey", "Wildflower honey", 725, 2),
]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Cart</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 12px;text-align:left}}
#total{{font-weight:bold}}</style></head>
<body><h1>Your cart</h1>
<table id="cart"><tr><th>Item</th><th>Qty</th><th>Unit</th><th>Line</th></tr>{rows}</table>
<p>Total: <span id="total" data-cents="{total_cents}">{total}</span></p>
<button id="checkout" onclick="document.getElementById('status').textContent='Order placed'">Checkout</button>
<p id="status"></p>
</body></html>"""


def render_page() -> str:
    rows = "".join(
        f'<tr class="line" data-sku="{i.sku}"><td>{i.name}</td><td>{i.quantity}</td>'
        f"<td>{format_cents(i.unit_price_cents)}</td><td>{format_cents(line_total(i))}</td></tr>"
        for i in CART
    )
    total = compute_total(CART)
    return PAGE.format(rows=rows, total=format_cents(total), total_cents=total)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, "text/plain", b"ok")
        elif self.path == "/api/cart":
            body = {
                "items": [i.__dict__ for i in CART],
                "total_cents": compute_total(CART),
            }
            self._send(200, "application/json", json.dumps(body).encode())
        elif self.path == "/":
            self._send(200, "text/html; charset=utf-8", render_page().encode())
        else:
            self._send(404, "text/plain", b"not found")

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        print(f"{self.address_string()} {format % args}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"cart app listening on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
