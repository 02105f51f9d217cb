"""Names for the JSON-shaped values the gateway passes along without a schema of its own.

Design: request bodies are msgspec Structs (protocol.py and the two agent protocols), typed down
to the fields the server reads. What stays JSON is JSON by nature: a tool's parameters schema,
a tool call's arguments, a field accepted only to be refused with a 400 naming it, and the chat
messages and tools handed to the jinja chat template (which reads them as plain dicts). Those
are typed with these aliases, so `Any` appears in the gateway only here and where a value is
genuinely of any type.
"""

from __future__ import annotations

from typing import Any, TypeAlias

JSON: TypeAlias = Any  # a JSON value (object, array, string, number, bool, null), as decoded
JSONObject: TypeAlias = dict[str, JSON]  # a JSON object
TemplateMessage: TypeAlias = JSONObject  # one chat message as the chat template reads it
TemplateTool: TypeAlias = JSONObject  # one tool as the chat template reads it ({"type", "function"})
