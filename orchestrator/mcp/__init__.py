"""petri's MCP server (``petri mcp``): the CLI's operations as Model Context Protocol tools.

- ``tools``: the tool table (names, argument and result schemas, annotations, handlers)
  and the server's instructions;
- ``schema``: result schemas derived from the API's records (one schema for the CLI, the
  API and MCP);
- ``jobs``: runs and races that outlive the call that started them;
- ``server``: the SDK wiring, on trio, over ``petri.aio``; ``serve()`` is the entry point.

Nothing here is imported by ``import petri`` or by the other commands: the SDK loads only
when ``petri mcp`` runs (``orchestrator/cli/mcp.py``). Inside this package ``import mcp``
is the SDK (absolute imports), not this package.
"""
