"""petri's MCP server (``petri mcp``): the CLI's operations as Model Context Protocol tools.

- ``tools``: the tool table (names, argument and result schemas, annotations, handlers)
  and the server's instructions;
- ``schema``: result schemas derived from the API's records (one schema for the CLI, the
  API and MCP);
- ``args``: what the tools' arguments become (``Limits``, seconds, a command);
- ``jobs``: runs and races that outlive the call that started them;
- ``state``: the server's ``State`` (the workspace, the jobs, the call in progress) that
  the handlers take, and the error document;
- ``server``: the SDK wiring, on trio, over ``petri.aio``; ``serve()`` is the entry point.

Imports point one way: ``server`` -> ``tools`` -> ``state`` -> ``args``, ``jobs``.

Nothing here is imported by ``import petri`` or by the other commands: the SDK loads only
when ``petri mcp`` runs (``orchestrator/cli/mcp.py``). Inside this package ``import mcp``
is the SDK (absolute imports), not this package.
"""
