"""A scripted OpenAI-compatible model server (deterministic answers, fault injection, request log)."""

from infra.modelserver.script import Script, load_script
from infra.modelserver.server import ScriptedModelServer

__all__ = ["Script", "ScriptedModelServer", "load_script"]
