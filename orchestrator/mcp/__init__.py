"""petri's MCP server (``petri mcp``): the CLI's operations as Model Context Protocol tools.

- ``tools``: the tool table (names, descriptions, handlers, annotations);
- ``params``: each tool's arguments, one pydantic model per tool (its ``inputSchema``);
- ``documents``: TypedDicts of the results that are no API record (and of what a tool
  adds to a record);
- ``schema``: the JSON Schemas, made by pydantic from the models, the API's records and
  those TypedDicts (one set of types for the CLI, the API and MCP);
- ``instructions``: what the server tells a client at ``initialize``;
- ``args``: what the arguments become (``Limits``, seconds, a command);
- ``jobs``: runs and races that outlive the call that started them;
- ``state``: the server's ``State`` (the workspace, the jobs, the call in progress) that
  the handlers take, and the error document;
- ``server``: the SDK wiring, on trio, over ``petri.aio``; ``serve()`` is the entry point.

Imports point one way: ``server`` -> ``tools`` -> ``params``, ``documents``, ``state`` ->
``args``, ``jobs``. ``server`` loads ``tools`` (and pydantic with it) only after answering
``initialize``.

Nothing here is imported by ``import petri`` or by the other commands: the SDK loads only
when ``petri mcp`` runs (``orchestrator/cli/mcp.py``). Inside this package ``import mcp``
is the SDK (absolute imports), not this package.
"""
