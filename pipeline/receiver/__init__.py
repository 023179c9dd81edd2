"""The GitHub webhook receiver: verifying, parsing and answering deliveries, and its HTTP server."""
