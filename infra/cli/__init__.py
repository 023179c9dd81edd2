"""The local stack's ``durafix`` commands (dev, demo, forge, model, chaos), added by entry points."""
