"""The forge's users in the receiver and security tests, by what they may do on the test repository, and the
label that asks for a run."""

from __future__ import annotations

OWNER = "acme"
BOT = "durafix-bot"
MAINTAINER = "maintainer"
TRIAGER = "triager"
READER = "reader"
OUTSIDER = "outsider"
TRIGGER = "durafix"
# The permission each collaborator is given (the owner holds admin, the outsider nothing).
ROLES = {BOT: "push", MAINTAINER: "push", TRIAGER: "triage", READER: "pull"}
