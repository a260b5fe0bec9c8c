"""The runtime: durable sessions on a host, and plain ``chat()``."""

from harness.runtime.chat import chat
from harness.runtime.host import HarnessHost
from harness.runtime.session import OpenAsk, Session, TurnResult

__all__ = ["HarnessHost", "OpenAsk", "Session", "TurnResult", "chat"]
