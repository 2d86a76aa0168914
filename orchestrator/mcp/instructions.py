"""What the MCP server tells a client about itself at ``initialize`` (its ``instructions``):
the workflow in a few lines. Apart from the tool table so the early ``initialize`` answer
(``handshake``) can send it before the tools, their models and pydantic are loaded."""
from __future__ import annotations

INSTRUCTIONS = """\
petri gives you instant, isolated copies (sandboxes) of this project, so you can change files and run \
builds and tests without touching the user's live tree.

Workflow:
1. sandbox_fork: make a sandbox (n > 1 for several attempts). It is a full copy of the workspace; \
commands run inside see it at the workspace's own path, the rest of the machine read-only, network off \
unless net: true (or net: "allow:HOST[:PORT],..." for only those destinations).
2. Look with sandbox_list_files / sandbox_grep / sandbox_read_file and change files with sandbox_write_file / \
sandbox_edit_file / sandbox_move_file / sandbox_delete_file (paths relative to the workspace root): cheaper \
than a command, with structured results. Or run commands.
3. sandbox_run for commands under about two minutes (timeout_s, default 120). A non-zero exit is a \
normal result: read exit_code and the output tails. For longer suites or servers use sandbox_run_start, \
then sandbox_run_poll with the returned next_cursor until done, and sandbox_run_kill to stop.
4. sandbox_diff shows what changed as a git patch.
5. To compare candidate fixes, race runs a check in one sandbox per candidate and ranks them (label names \
the winner's sandbox); follow it with race_status.
6. sandbox_remove when done with a sandbox; review gives a report to hand to the user, reject records why \
a sandbox is dropped.

Only when the server was started with --allow-live: promote applies a sandbox's changes to the live \
workspace (rollback undoes it). Otherwise tell the user the sandbox id and the diff, and let them promote \
(`petri promote SB`).

Errors are tool errors whose text is petri's one-line message (what failed and what to do next).
"""

assert len(INSTRUCTIONS) < 2000, len(INSTRUCTIONS)
