# ruff: noqa: E501
"""The MCP tools' schemas (tool name -> inputSchema, outputSchema), generated from their
argument models and result types by ``python -m orchestrator.mcp.schema``: do not edit.

Made ahead rather than when the server starts: pydantic takes tens of milliseconds of CPU
to make them, on the way to a client's first tools/list. tests/mcp/test_mcp_tool_schemas.py
fails when this file is not what the types make now.
"""
import json
from typing import Any

SCHEMAS: dict[str, dict[str, Any]] = json.loads(r"""
{
 "workspace_status": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {},
   "type": "object",
   "required": []
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "sandboxes": {
     "items": {
      "properties": {
       "id": {
        "type": "string"
       },
       "label": {
        "type": [
         "string",
         "null"
        ]
       },
       "backend": {
        "type": [
         "string",
         "null"
        ]
       },
       "state": {
        "type": [
         "string",
         "null"
        ]
       },
       "base": {
        "type": [
         "string",
         "null"
        ]
       },
       "path": {
        "type": [
         "string",
         "null"
        ]
       },
       "created_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "expires_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "limits": {
        "type": [
         "object",
         "null"
        ]
       },
       "usage": {
        "type": [
         "object",
         "null"
        ]
       },
       "last_exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "stale": {
        "type": [
         "object",
         "null"
        ]
       },
       "parent": {
        "type": [
         "string",
         "null"
        ]
       },
       "generation": {
        "type": "integer"
       },
       "profile": {
        "type": [
         "string",
         "null"
        ]
       },
       "time_left_s": {
        "type": [
         "number",
         "null"
        ]
       },
       "keep_expired": {
        "type": "boolean"
       },
       "promoted": {
        "type": [
         "object",
         "null"
        ]
       },
       "system": {
        "type": [
         "object",
         "null"
        ]
       },
       "services_running": {
        "type": [
         "integer",
         "null"
        ]
       },
       "runs": {
        "anyOf": [
         {
          "items": {
           "properties": {
            "id": {
             "type": "string"
            },
            "run": {
             "type": "integer"
            },
            "exit_code": {
             "type": [
              "integer",
              "null"
             ]
            },
            "duration_s": {
             "type": [
              "number",
              "null"
             ]
            },
            "killed_by": {
             "type": [
              "string",
              "null"
             ]
            },
            "limits_hit": {
             "items": {
              "type": "string"
             },
             "type": "array"
            },
            "stdout_path": {
             "type": [
              "string",
              "null"
             ]
            },
            "stderr_path": {
             "type": [
              "string",
              "null"
             ]
            },
            "peak_memory_bytes": {
             "type": [
              "integer",
              "null"
             ]
            },
            "ended_by": {
             "type": [
              "string",
              "null"
             ]
            },
            "argv": {
             "anyOf": [
              {
               "items": {
                "type": "string"
               },
               "type": "array"
              },
              {
               "type": "null"
              }
             ]
            },
            "started_at": {
             "type": [
              "string",
              "null"
             ]
            },
            "finished_at": {
             "type": [
              "string",
              "null"
             ]
            },
            "pid": {
             "type": [
              "integer",
              "null"
             ]
            },
            "output": {
             "type": [
              "object",
              "null"
             ]
            },
            "cgroup_mode": {
             "type": [
              "string",
              "null"
             ]
            },
            "run_as": {
             "type": [
              "object",
              "null"
             ]
            },
            "cpu_time_s": {
             "type": [
              "number",
              "null"
             ]
            },
            "seccomp": {
             "type": [
              "string",
              "null"
             ]
            },
            "seccomp_turned_off": {
             "anyOf": [
              {
               "items": {
                "type": "string"
               },
               "type": "array"
              },
              {
               "type": "null"
              }
             ]
            },
            "setup_error": {
             "type": [
              "string",
              "null"
             ]
            },
            "setup_hint": {
             "type": [
              "string",
              "null"
             ]
            },
            "exec_error": {
             "type": [
              "string",
              "null"
             ]
            },
            "warnings": {
             "items": {
              "type": "string"
             },
             "type": "array"
            },
            "role": {
             "type": [
              "string",
              "null"
             ]
            },
            "race": {
             "type": [
              "string",
              "null"
             ]
            },
            "ran_in": {
             "type": [
              "string",
              "null"
             ]
            }
           },
           "required": [
            "id",
            "run"
           ],
           "type": "object"
          },
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       },
       "services": {
        "anyOf": [
         {
          "items": {},
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       },
       "ports": {
        "anyOf": [
         {
          "items": {},
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       }
      },
      "required": [
       "id"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "workspace": {
     "type": "string"
    },
    "backend": {
     "type": "string"
    },
    "reason": {
     "type": "string"
    },
    "snapshot": {
     "type": [
      "string",
      "null"
     ]
    },
    "via": {
     "type": "string"
    },
    "client": {
     "type": [
      "string",
      "null"
     ]
    },
    "allow_live": {
     "type": "boolean"
    }
   },
   "required": [
    "schema",
    "workspace",
    "backend",
    "reason",
    "snapshot"
   ]
  }
 },
 "snapshot_create": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "message": {
     "default": "",
     "description": "a note kept with it",
     "type": "string"
    }
   },
   "type": "object",
   "required": []
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "id": {
     "type": "string"
    },
    "message": {
     "type": "string"
    },
    "implicit": {
     "type": "boolean"
    },
    "kind": {
     "type": [
      "string",
      "null"
     ]
    },
    "created_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "backend": {
     "type": [
      "string",
      "null"
     ]
    },
    "parent": {
     "type": [
      "string",
      "null"
     ]
    },
    "bytes_copied": {
     "type": [
      "integer",
      "null"
     ]
    },
    "bytes": {
     "type": [
      "integer",
      "null"
     ]
    },
    "used_by": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "sandbox": {
     "type": [
      "string",
      "null"
     ]
    },
    "origin": {
     "type": [
      "string",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "id"
   ]
  }
 },
 "sandbox_fork": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "ttl": {
     "type": [
      "string",
      "number"
     ],
     "description": "lifetime, e.g. 30m, 2h (seconds if a number)"
    },
    "mem": {
     "type": [
      "string",
      "integer"
     ],
     "description": "memory limit, e.g. 512M"
    },
    "cpus": {
     "type": [
      "string",
      "number"
     ],
     "description": "CPU quota, e.g. 0.5"
    },
    "pids": {
     "minimum": 1,
     "type": "integer",
     "description": "max processes"
    },
    "disk": {
     "type": [
      "string",
      "integer"
     ],
     "description": "disk budget, e.g. 1G"
    },
    "net": {
     "type": [
      "boolean",
      "string"
     ],
     "default": false,
     "description": "true: the host's network; \"allow:HOST[:PORT],...\": only those destinations, through a filtering proxy (HTTP_PROXY/HTTPS_PROXY inside); default off"
    },
    "profile": {
     "type": "string",
     "description": "a [profiles.NAME] of the config: its limits, network, seccomp, env, secrets and policy (the arguments above win over it)"
    },
    "from": {
     "default": "live",
     "description": "live (default), a snapshot (s-…), or a sandbox by id (sb-…), unique prefix or label",
     "type": "string"
    },
    "n": {
     "default": 1,
     "maximum": 100,
     "minimum": 1,
     "type": "integer"
    },
    "label": {
     "type": "string",
     "description": "a name; with n > 1: NAME-1..NAME-N"
    },
    "keep_expired": {
     "default": false,
     "description": "keep the tree after the ttl",
     "type": "boolean"
    },
    "system": {
     "default": false,
     "description": "a writable layer over the host's /usr, /etc, /var, /opt (apt, pip --user, npm -g), never promoted; root only",
     "type": "boolean"
    }
   },
   "type": "object",
   "required": []
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "sandboxes": {
     "items": {
      "properties": {
       "id": {
        "type": "string"
       },
       "label": {
        "type": [
         "string",
         "null"
        ]
       },
       "backend": {
        "type": [
         "string",
         "null"
        ]
       },
       "state": {
        "type": [
         "string",
         "null"
        ]
       },
       "base": {
        "type": [
         "string",
         "null"
        ]
       },
       "path": {
        "type": [
         "string",
         "null"
        ]
       },
       "created_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "expires_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "limits": {
        "type": [
         "object",
         "null"
        ]
       },
       "usage": {
        "type": [
         "object",
         "null"
        ]
       },
       "last_exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "stale": {
        "type": [
         "object",
         "null"
        ]
       },
       "parent": {
        "type": [
         "string",
         "null"
        ]
       },
       "generation": {
        "type": "integer"
       },
       "profile": {
        "type": [
         "string",
         "null"
        ]
       },
       "time_left_s": {
        "type": [
         "number",
         "null"
        ]
       },
       "keep_expired": {
        "type": "boolean"
       },
       "promoted": {
        "type": [
         "object",
         "null"
        ]
       },
       "system": {
        "type": [
         "object",
         "null"
        ]
       },
       "services_running": {
        "type": [
         "integer",
         "null"
        ]
       },
       "runs": {
        "anyOf": [
         {
          "items": {
           "properties": {
            "id": {
             "type": "string"
            },
            "run": {
             "type": "integer"
            },
            "exit_code": {
             "type": [
              "integer",
              "null"
             ]
            },
            "duration_s": {
             "type": [
              "number",
              "null"
             ]
            },
            "killed_by": {
             "type": [
              "string",
              "null"
             ]
            },
            "limits_hit": {
             "items": {
              "type": "string"
             },
             "type": "array"
            },
            "stdout_path": {
             "type": [
              "string",
              "null"
             ]
            },
            "stderr_path": {
             "type": [
              "string",
              "null"
             ]
            },
            "peak_memory_bytes": {
             "type": [
              "integer",
              "null"
             ]
            },
            "ended_by": {
             "type": [
              "string",
              "null"
             ]
            },
            "argv": {
             "anyOf": [
              {
               "items": {
                "type": "string"
               },
               "type": "array"
              },
              {
               "type": "null"
              }
             ]
            },
            "started_at": {
             "type": [
              "string",
              "null"
             ]
            },
            "finished_at": {
             "type": [
              "string",
              "null"
             ]
            },
            "pid": {
             "type": [
              "integer",
              "null"
             ]
            },
            "output": {
             "type": [
              "object",
              "null"
             ]
            },
            "cgroup_mode": {
             "type": [
              "string",
              "null"
             ]
            },
            "run_as": {
             "type": [
              "object",
              "null"
             ]
            },
            "cpu_time_s": {
             "type": [
              "number",
              "null"
             ]
            },
            "seccomp": {
             "type": [
              "string",
              "null"
             ]
            },
            "seccomp_turned_off": {
             "anyOf": [
              {
               "items": {
                "type": "string"
               },
               "type": "array"
              },
              {
               "type": "null"
              }
             ]
            },
            "setup_error": {
             "type": [
              "string",
              "null"
             ]
            },
            "setup_hint": {
             "type": [
              "string",
              "null"
             ]
            },
            "exec_error": {
             "type": [
              "string",
              "null"
             ]
            },
            "warnings": {
             "items": {
              "type": "string"
             },
             "type": "array"
            },
            "role": {
             "type": [
              "string",
              "null"
             ]
            },
            "race": {
             "type": [
              "string",
              "null"
             ]
            },
            "ran_in": {
             "type": [
              "string",
              "null"
             ]
            }
           },
           "required": [
            "id",
            "run"
           ],
           "type": "object"
          },
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       },
       "services": {
        "anyOf": [
         {
          "items": {},
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       },
       "ports": {
        "anyOf": [
         {
          "items": {},
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       }
      },
      "required": [
       "id"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "warnings": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "quotas_enabled": {
     "type": [
      "boolean",
      "null"
     ]
    }
   },
   "required": [
    "schema"
   ]
  }
 },
 "sandbox_list": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "all": {
     "default": false,
     "description": "also destroyed and failed ones",
     "type": "boolean"
    }
   },
   "type": "object",
   "required": []
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "sandboxes": {
     "items": {
      "properties": {
       "id": {
        "type": "string"
       },
       "label": {
        "type": [
         "string",
         "null"
        ]
       },
       "backend": {
        "type": [
         "string",
         "null"
        ]
       },
       "state": {
        "type": [
         "string",
         "null"
        ]
       },
       "base": {
        "type": [
         "string",
         "null"
        ]
       },
       "path": {
        "type": [
         "string",
         "null"
        ]
       },
       "created_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "expires_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "limits": {
        "type": [
         "object",
         "null"
        ]
       },
       "usage": {
        "type": [
         "object",
         "null"
        ]
       },
       "last_exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "stale": {
        "type": [
         "object",
         "null"
        ]
       },
       "parent": {
        "type": [
         "string",
         "null"
        ]
       },
       "generation": {
        "type": "integer"
       },
       "profile": {
        "type": [
         "string",
         "null"
        ]
       },
       "time_left_s": {
        "type": [
         "number",
         "null"
        ]
       },
       "keep_expired": {
        "type": "boolean"
       },
       "promoted": {
        "type": [
         "object",
         "null"
        ]
       },
       "system": {
        "type": [
         "object",
         "null"
        ]
       },
       "services_running": {
        "type": [
         "integer",
         "null"
        ]
       },
       "runs": {
        "anyOf": [
         {
          "items": {
           "properties": {
            "id": {
             "type": "string"
            },
            "run": {
             "type": "integer"
            },
            "exit_code": {
             "type": [
              "integer",
              "null"
             ]
            },
            "duration_s": {
             "type": [
              "number",
              "null"
             ]
            },
            "killed_by": {
             "type": [
              "string",
              "null"
             ]
            },
            "limits_hit": {
             "items": {
              "type": "string"
             },
             "type": "array"
            },
            "stdout_path": {
             "type": [
              "string",
              "null"
             ]
            },
            "stderr_path": {
             "type": [
              "string",
              "null"
             ]
            },
            "peak_memory_bytes": {
             "type": [
              "integer",
              "null"
             ]
            },
            "ended_by": {
             "type": [
              "string",
              "null"
             ]
            },
            "argv": {
             "anyOf": [
              {
               "items": {
                "type": "string"
               },
               "type": "array"
              },
              {
               "type": "null"
              }
             ]
            },
            "started_at": {
             "type": [
              "string",
              "null"
             ]
            },
            "finished_at": {
             "type": [
              "string",
              "null"
             ]
            },
            "pid": {
             "type": [
              "integer",
              "null"
             ]
            },
            "output": {
             "type": [
              "object",
              "null"
             ]
            },
            "cgroup_mode": {
             "type": [
              "string",
              "null"
             ]
            },
            "run_as": {
             "type": [
              "object",
              "null"
             ]
            },
            "cpu_time_s": {
             "type": [
              "number",
              "null"
             ]
            },
            "seccomp": {
             "type": [
              "string",
              "null"
             ]
            },
            "seccomp_turned_off": {
             "anyOf": [
              {
               "items": {
                "type": "string"
               },
               "type": "array"
              },
              {
               "type": "null"
              }
             ]
            },
            "setup_error": {
             "type": [
              "string",
              "null"
             ]
            },
            "setup_hint": {
             "type": [
              "string",
              "null"
             ]
            },
            "exec_error": {
             "type": [
              "string",
              "null"
             ]
            },
            "warnings": {
             "items": {
              "type": "string"
             },
             "type": "array"
            },
            "role": {
             "type": [
              "string",
              "null"
             ]
            },
            "race": {
             "type": [
              "string",
              "null"
             ]
            },
            "ran_in": {
             "type": [
              "string",
              "null"
             ]
            }
           },
           "required": [
            "id",
            "run"
           ],
           "type": "object"
          },
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       },
       "services": {
        "anyOf": [
         {
          "items": {},
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       },
       "ports": {
        "anyOf": [
         {
          "items": {},
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       }
      },
      "required": [
       "id"
      ],
      "type": "object"
     },
     "type": "array"
    }
   },
   "required": [
    "schema"
   ]
  }
 },
 "sandbox_status": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    }
   },
   "required": [
    "sandbox"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "sandboxes": {
     "items": {
      "properties": {
       "id": {
        "type": "string"
       },
       "label": {
        "type": [
         "string",
         "null"
        ]
       },
       "backend": {
        "type": [
         "string",
         "null"
        ]
       },
       "state": {
        "type": [
         "string",
         "null"
        ]
       },
       "base": {
        "type": [
         "string",
         "null"
        ]
       },
       "path": {
        "type": [
         "string",
         "null"
        ]
       },
       "created_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "expires_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "limits": {
        "type": [
         "object",
         "null"
        ]
       },
       "usage": {
        "type": [
         "object",
         "null"
        ]
       },
       "last_exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "stale": {
        "type": [
         "object",
         "null"
        ]
       },
       "parent": {
        "type": [
         "string",
         "null"
        ]
       },
       "generation": {
        "type": "integer"
       },
       "profile": {
        "type": [
         "string",
         "null"
        ]
       },
       "time_left_s": {
        "type": [
         "number",
         "null"
        ]
       },
       "keep_expired": {
        "type": "boolean"
       },
       "promoted": {
        "type": [
         "object",
         "null"
        ]
       },
       "system": {
        "type": [
         "object",
         "null"
        ]
       },
       "services_running": {
        "type": [
         "integer",
         "null"
        ]
       },
       "runs": {
        "anyOf": [
         {
          "items": {
           "properties": {
            "id": {
             "type": "string"
            },
            "run": {
             "type": "integer"
            },
            "exit_code": {
             "type": [
              "integer",
              "null"
             ]
            },
            "duration_s": {
             "type": [
              "number",
              "null"
             ]
            },
            "killed_by": {
             "type": [
              "string",
              "null"
             ]
            },
            "limits_hit": {
             "items": {
              "type": "string"
             },
             "type": "array"
            },
            "stdout_path": {
             "type": [
              "string",
              "null"
             ]
            },
            "stderr_path": {
             "type": [
              "string",
              "null"
             ]
            },
            "peak_memory_bytes": {
             "type": [
              "integer",
              "null"
             ]
            },
            "ended_by": {
             "type": [
              "string",
              "null"
             ]
            },
            "argv": {
             "anyOf": [
              {
               "items": {
                "type": "string"
               },
               "type": "array"
              },
              {
               "type": "null"
              }
             ]
            },
            "started_at": {
             "type": [
              "string",
              "null"
             ]
            },
            "finished_at": {
             "type": [
              "string",
              "null"
             ]
            },
            "pid": {
             "type": [
              "integer",
              "null"
             ]
            },
            "output": {
             "type": [
              "object",
              "null"
             ]
            },
            "cgroup_mode": {
             "type": [
              "string",
              "null"
             ]
            },
            "run_as": {
             "type": [
              "object",
              "null"
             ]
            },
            "cpu_time_s": {
             "type": [
              "number",
              "null"
             ]
            },
            "seccomp": {
             "type": [
              "string",
              "null"
             ]
            },
            "seccomp_turned_off": {
             "anyOf": [
              {
               "items": {
                "type": "string"
               },
               "type": "array"
              },
              {
               "type": "null"
              }
             ]
            },
            "setup_error": {
             "type": [
              "string",
              "null"
             ]
            },
            "setup_hint": {
             "type": [
              "string",
              "null"
             ]
            },
            "exec_error": {
             "type": [
              "string",
              "null"
             ]
            },
            "warnings": {
             "items": {
              "type": "string"
             },
             "type": "array"
            },
            "role": {
             "type": [
              "string",
              "null"
             ]
            },
            "race": {
             "type": [
              "string",
              "null"
             ]
            },
            "ran_in": {
             "type": [
              "string",
              "null"
             ]
            }
           },
           "required": [
            "id",
            "run"
           ],
           "type": "object"
          },
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       },
       "services": {
        "anyOf": [
         {
          "items": {},
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       },
       "ports": {
        "anyOf": [
         {
          "items": {},
          "type": "array"
         },
         {
          "type": "null"
         }
        ]
       }
      },
      "required": [
       "id"
      ],
      "type": "object"
     },
     "type": "array"
    }
   },
   "required": [
    "schema"
   ]
  }
 },
 "sandbox_run": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "command": {
     "type": "string",
     "description": "a shell command line, run with /bin/sh -c (give exactly one of command and argv)"
    },
    "argv": {
     "items": {
      "type": "string"
     },
     "minItems": 1,
     "type": "array",
     "description": "the command as a list, no shell (give exactly one of command and argv)"
    },
    "cwd": {
     "type": "string",
     "description": "directory to start in, relative to the workspace root (default: the root)"
    },
    "timeout_s": {
     "type": [
      "number",
      "string"
     ],
     "default": 120.0,
     "description": "kill it after this long (exit 124): seconds, or a duration such as 90s, 10m"
    },
    "env": {
     "additionalProperties": {
      "type": "string"
     },
     "type": "object",
     "description": "extra environment variables"
    },
    "max_output_bytes": {
     "default": 16384,
     "description": "per stream",
     "maximum": 1048576,
     "minimum": 0,
     "type": "integer"
    }
   },
   "required": [
    "sandbox"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "id": {
     "type": "string"
    },
    "run": {
     "type": "integer"
    },
    "exit_code": {
     "type": [
      "integer",
      "null"
     ]
    },
    "duration_s": {
     "type": [
      "number",
      "null"
     ]
    },
    "killed_by": {
     "type": [
      "string",
      "null"
     ]
    },
    "limits_hit": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "stdout_path": {
     "type": [
      "string",
      "null"
     ]
    },
    "stderr_path": {
     "type": [
      "string",
      "null"
     ]
    },
    "peak_memory_bytes": {
     "type": [
      "integer",
      "null"
     ]
    },
    "ended_by": {
     "type": [
      "string",
      "null"
     ]
    },
    "argv": {
     "anyOf": [
      {
       "items": {
        "type": "string"
       },
       "type": "array"
      },
      {
       "type": "null"
      }
     ]
    },
    "started_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "finished_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "pid": {
     "type": [
      "integer",
      "null"
     ]
    },
    "output": {
     "type": [
      "object",
      "null"
     ]
    },
    "cgroup_mode": {
     "type": [
      "string",
      "null"
     ]
    },
    "run_as": {
     "type": [
      "object",
      "null"
     ]
    },
    "cpu_time_s": {
     "type": [
      "number",
      "null"
     ]
    },
    "seccomp": {
     "type": [
      "string",
      "null"
     ]
    },
    "seccomp_turned_off": {
     "anyOf": [
      {
       "items": {
        "type": "string"
       },
       "type": "array"
      },
      {
       "type": "null"
      }
     ]
    },
    "setup_error": {
     "type": [
      "string",
      "null"
     ]
    },
    "setup_hint": {
     "type": [
      "string",
      "null"
     ]
    },
    "exec_error": {
     "type": [
      "string",
      "null"
     ]
    },
    "warnings": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "role": {
     "type": [
      "string",
      "null"
     ]
    },
    "race": {
     "type": [
      "string",
      "null"
     ]
    },
    "ran_in": {
     "type": [
      "string",
      "null"
     ]
    },
    "stdout_tail": {
     "type": "string"
    },
    "stderr_tail": {
     "type": "string"
    },
    "truncated": {
     "properties": {
      "stdout": {
       "type": "integer"
      },
      "stderr": {
       "type": "integer"
      }
     },
     "required": [
      "stdout",
      "stderr"
     ],
     "type": "object"
    }
   },
   "required": [
    "schema",
    "id",
    "run",
    "stdout_tail",
    "stderr_tail",
    "truncated"
   ]
  }
 },
 "sandbox_run_start": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "command": {
     "type": "string",
     "description": "a shell command line, run with /bin/sh -c (give exactly one of command and argv)"
    },
    "argv": {
     "items": {
      "type": "string"
     },
     "minItems": 1,
     "type": "array",
     "description": "the command as a list, no shell (give exactly one of command and argv)"
    },
    "cwd": {
     "type": "string",
     "description": "directory to start in, relative to the workspace root (default: the root)"
    },
    "timeout_s": {
     "type": [
      "number",
      "string"
     ],
     "default": 120.0,
     "description": "kill it after this long (exit 124): seconds, or a duration such as 90s, 10m"
    },
    "env": {
     "additionalProperties": {
      "type": "string"
     },
     "type": "object",
     "description": "extra environment variables"
    }
   },
   "required": [
    "sandbox"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "type": "integer"
    },
    "sandbox": {
     "type": "string"
    },
    "run": {
     "type": "integer"
    }
   },
   "required": [
    "sandbox",
    "run"
   ]
  }
 },
 "sandbox_run_poll": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "run": {
     "minimum": 1,
     "type": "integer"
    },
    "cursor": {
     "default": 0,
     "description": "bytes of output (both streams) already read: next_cursor of the last poll",
     "minimum": 0,
     "type": "integer"
    },
    "wait_s": {
     "default": 10.0,
     "description": "the longest this poll waits for min_bytes of new output",
     "maximum": 25.0,
     "minimum": 0,
     "type": "number"
    },
    "min_bytes": {
     "default": 16384,
     "description": "return as soon as this much new output is there (1: on the first byte)",
     "maximum": 65536,
     "minimum": 1,
     "type": "integer"
    }
   },
   "required": [
    "sandbox",
    "run"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "type": "integer"
    },
    "sandbox": {
     "type": "string"
    },
    "run": {
     "type": "integer"
    },
    "events": {
     "items": {
      "properties": {
       "cursor": {
        "type": "integer"
       },
       "stream": {
        "type": "string"
       },
       "text": {
        "type": "string"
       }
      },
      "required": [
       "cursor",
       "stream",
       "text"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "next_cursor": {
     "type": "integer"
    },
    "dropped": {
     "type": "integer"
    },
    "done": {
     "type": "boolean"
    },
    "exit_code": {
     "type": [
      "integer",
      "null"
     ]
    },
    "killed_by": {
     "type": [
      "string",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "events",
    "next_cursor",
    "done",
    "exit_code",
    "killed_by"
   ]
  }
 },
 "sandbox_run_kill": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "run": {
     "minimum": 1,
     "type": "integer"
    }
   },
   "required": [
    "sandbox",
    "run"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "type": "integer"
    },
    "killed": {
     "type": "boolean"
    }
   },
   "required": [
    "killed"
   ]
  }
 },
 "sandbox_read_file": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "path": {
     "description": "relative to the workspace root (or absolute under it)",
     "type": "string"
    },
    "base": {
     "default": false,
     "description": "read the snapshot the sandbox was forked from",
     "type": "boolean"
    },
    "start_line": {
     "minimum": 1,
     "type": "integer",
     "description": "first line to return (from 1)"
    },
    "end_line": {
     "minimum": 1,
     "type": "integer",
     "description": "last line to return (inclusive)"
    },
    "max_bytes": {
     "default": 65536,
     "maximum": 1048576,
     "minimum": 0,
     "type": "integer"
    }
   },
   "required": [
    "sandbox",
    "path"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "path": {
     "type": "string"
    },
    "size": {
     "type": "integer"
    },
    "encoding": {
     "type": "string"
    },
    "content": {
     "type": "string"
    },
    "truncated": {
     "type": "boolean"
    },
    "start_line": {
     "type": [
      "integer",
      "null"
     ]
    },
    "end_line": {
     "type": [
      "integer",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "path",
    "size",
    "encoding",
    "content"
   ]
  }
 },
 "sandbox_list_files": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "path": {
     "default": "",
     "description": "directory to list (default: the workspace root)",
     "type": "string"
    },
    "glob": {
     "type": "string",
     "description": "only matching entries: *.py matches names at any depth, src/**/*.c paths below path"
    },
    "recursive": {
     "type": "boolean",
     "description": "the whole tree below path (default: true with glob)"
    },
    "include_ignored": {
     "default": false,
     "type": "boolean"
    },
    "max_entries": {
     "default": 1000,
     "maximum": 10000,
     "minimum": 1,
     "type": "integer"
    }
   },
   "required": [
    "sandbox"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "path": {
     "type": "string"
    },
    "entries": {
     "items": {
      "properties": {
       "path": {
        "type": "string"
       },
       "kind": {
        "type": "string"
       },
       "size": {
        "type": [
         "integer",
         "null"
        ]
       },
       "target": {
        "type": [
         "string",
         "null"
        ]
       }
      },
      "required": [
       "path",
       "kind"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "truncated": {
     "type": "boolean"
    },
    "ignored": {
     "type": "integer"
    }
   },
   "required": [
    "schema",
    "path"
   ]
  }
 },
 "sandbox_grep": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "pattern": {
     "minLength": 1,
     "type": "string"
    },
    "path": {
     "default": "",
     "description": "directory (or file) to search (default: the workspace root)",
     "type": "string"
    },
    "glob": {
     "type": "string",
     "description": "only files whose name (*.py) or path below path matches"
    },
    "ignore_case": {
     "default": false,
     "type": "boolean"
    },
    "include_ignored": {
     "default": false,
     "type": "boolean"
    },
    "max_matches": {
     "default": 200,
     "maximum": 5000,
     "minimum": 1,
     "type": "integer"
    }
   },
   "required": [
    "sandbox",
    "pattern"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "pattern": {
     "type": "string"
    },
    "path": {
     "type": "string"
    },
    "matches": {
     "items": {
      "properties": {
       "path": {
        "type": "string"
       },
       "line": {
        "type": "integer"
       },
       "text": {
        "type": "string"
       }
      },
      "required": [
       "path",
       "line",
       "text"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "files_searched": {
     "type": "integer"
    },
    "binary_skipped": {
     "type": "integer"
    },
    "large_skipped": {
     "type": "integer"
    },
    "ignored": {
     "type": "integer"
    },
    "truncated": {
     "type": "boolean"
    },
    "stopped": {
     "type": [
      "string",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "pattern",
    "path"
   ]
  }
 },
 "sandbox_write_file": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "path": {
     "description": "relative to the workspace root (or absolute under it)",
     "type": "string"
    },
    "content": {
     "type": "string"
    },
    "encoding": {
     "default": "utf-8",
     "enum": [
      "utf-8",
      "base64"
     ],
     "type": "string"
    },
    "mode": {
     "type": [
      "integer",
      "string"
     ],
     "description": "permission bits, e.g. \"755\" (default: kept, or 644 for a new file)"
    }
   },
   "required": [
    "sandbox",
    "path",
    "content"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "path": {
     "type": "string"
    },
    "bytes_written": {
     "type": "integer"
    },
    "replacements": {
     "type": [
      "integer",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "path"
   ]
  }
 },
 "sandbox_edit_file": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "path": {
     "description": "relative to the workspace root (or absolute under it)",
     "type": "string"
    },
    "old": {
     "minLength": 1,
     "type": "string"
    },
    "new": {
     "type": "string"
    },
    "count": {
     "default": 1,
     "minimum": 1,
     "type": "integer"
    },
    "replace_all": {
     "default": false,
     "type": "boolean"
    }
   },
   "required": [
    "sandbox",
    "path",
    "old",
    "new"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "path": {
     "type": "string"
    },
    "bytes_written": {
     "type": "integer"
    },
    "replacements": {
     "type": [
      "integer",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "path"
   ]
  }
 },
 "sandbox_delete_file": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "path": {
     "description": "relative to the workspace root (or absolute under it)",
     "type": "string"
    },
    "recursive": {
     "default": false,
     "description": "remove a directory and everything in it",
     "type": "boolean"
    }
   },
   "required": [
    "sandbox",
    "path"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "path": {
     "type": "string"
    },
    "kind": {
     "type": "string"
    },
    "removed": {
     "type": "integer"
    }
   },
   "required": [
    "schema",
    "path",
    "kind"
   ]
  }
 },
 "sandbox_move_file": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "from": {
     "description": "relative to the workspace root (or absolute under it)",
     "type": "string"
    },
    "to": {
     "description": "relative to the workspace root (or absolute under it)",
     "type": "string"
    },
    "overwrite": {
     "default": false,
     "description": "replace what is at to (default: refuse)",
     "type": "boolean"
    }
   },
   "required": [
    "sandbox",
    "from",
    "to"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "old_path": {
     "type": "string"
    },
    "path": {
     "type": "string"
    },
    "kind": {
     "type": "string"
    },
    "replaced": {
     "type": "boolean"
    }
   },
   "required": [
    "schema",
    "old_path",
    "path",
    "kind"
   ]
  }
 },
 "sandbox_diff": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "paths": {
     "default": [],
     "description": "only these paths",
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "stat_only": {
     "default": false,
     "description": "files and line counts, no patch",
     "type": "boolean"
    },
    "include_ignored": {
     "default": false,
     "description": "also files .gitignore ignores",
     "type": "boolean"
    },
    "max_patch_bytes": {
     "default": 262144,
     "minimum": 0,
     "type": "integer"
    }
   },
   "required": [
    "sandbox"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "base": {
     "type": [
      "string",
      "null"
     ]
    },
    "sandbox": {
     "type": [
      "string",
      "null"
     ]
    },
    "files": {
     "items": {
      "properties": {
       "path": {
        "type": "string"
       },
       "status": {
        "type": "string"
       },
       "old_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "binary": {
        "type": "boolean"
       },
       "lines_added": {
        "type": "integer"
       },
       "lines_removed": {
        "type": "integer"
       },
       "old_mode": {
        "type": [
         "string",
         "null"
        ]
       },
       "new_mode": {
        "type": [
         "string",
         "null"
        ]
       },
       "path_b64": {
        "type": [
         "string",
         "null"
        ]
       },
       "old_path_b64": {
        "type": [
         "string",
         "null"
        ]
       }
      },
      "required": [
       "path",
       "status"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "patch": {
     "type": "string"
    },
    "patch_b64": {
     "type": [
      "string",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "base"
   ]
  }
 },
 "race": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "ttl": {
     "type": [
      "string",
      "number"
     ],
     "description": "lifetime, e.g. 30m, 2h (seconds if a number)"
    },
    "mem": {
     "type": [
      "string",
      "integer"
     ],
     "description": "memory limit, e.g. 512M"
    },
    "cpus": {
     "type": [
      "string",
      "number"
     ],
     "description": "CPU quota, e.g. 0.5"
    },
    "pids": {
     "minimum": 1,
     "type": "integer",
     "description": "max processes"
    },
    "disk": {
     "type": [
      "string",
      "integer"
     ],
     "description": "disk budget, e.g. 1G"
    },
    "net": {
     "type": [
      "boolean",
      "string"
     ],
     "default": false,
     "description": "true: the host's network; \"allow:HOST[:PORT],...\": only those destinations, through a filtering proxy (HTTP_PROXY/HTTPS_PROXY inside); default off"
    },
    "profile": {
     "type": "string",
     "description": "a [profiles.NAME] of the config: its limits, network, seccomp, env, secrets and policy (the arguments above win over it)"
    },
    "check": {
     "description": "shell command that passes (exit 0) for a good candidate",
     "minLength": 1,
     "type": "string"
    },
    "candidates": {
     "items": {
      "additionalProperties": false,
      "description": "One candidate: exactly one of patch, patch_text and cmd.",
      "maxProperties": 1,
      "minProperties": 1,
      "properties": {
       "patch": {
        "type": "string",
        "description": "a patch file (git or -p1 format)"
       },
       "patch_text": {
        "type": "string",
        "description": "the patch itself"
       },
       "cmd": {
        "type": "string",
        "description": "a shell command that makes the change"
       }
      },
      "type": "object"
     },
     "minItems": 1,
     "type": "array"
    },
    "from": {
     "default": "live",
     "description": "live (default) or s-… snapshot",
     "type": "string"
    },
    "jobs": {
     "default": 8,
     "description": "checks run at once",
     "minimum": 1,
     "type": "integer"
    },
    "timeout_s": {
     "type": [
      "number",
      "string"
     ],
     "description": "kill each check after this long: seconds, or 90s, 10m"
    },
    "label": {
     "type": "string",
     "description": "a name for the winner's sandbox, to use instead of its id"
    },
    "keep": {
     "default": false,
     "description": "keep the losers' sandboxes too",
     "type": "boolean"
    },
    "metric": {
     "type": "string",
     "description": "FILE:KEY (append :max if higher is better): rank passing candidates by the number the check writes to FILE"
    },
    "max_regression": {
     "pattern": "^[0-9]+(\\.[0-9]+)?%$",
     "type": "string",
     "description": "with metric: fail a candidate more than this much worse than the base, e.g. 10%"
    },
    "wait_s": {
     "default": 20.0,
     "maximum": 25.0,
     "minimum": 0,
     "type": "number"
    }
   },
   "required": [
    "check",
    "candidates"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "race": {
     "type": [
      "string",
      "null"
     ]
    },
    "base": {
     "type": [
      "string",
      "null"
     ]
    },
    "check": {
     "type": [
      "string",
      "null"
     ]
    },
    "candidates": {
     "items": {
      "properties": {
       "candidate": {
        "type": "string"
       },
       "kind": {
        "type": "string"
       },
       "sandbox": {
        "type": [
         "string",
         "null"
        ]
       },
       "applied": {},
       "exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "duration_s": {
        "type": [
         "number",
         "null"
        ]
       },
       "killed_by": {
        "type": [
         "string",
         "null"
        ]
       },
       "files_changed": {},
       "lines_added": {},
       "lines_removed": {},
       "rank": {},
       "passed": {
        "type": "boolean"
       },
       "changed_nothing": {
        "type": "boolean"
       },
       "apply_exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "apply_error": {
        "type": [
         "string",
         "null"
        ]
       },
       "error": {
        "type": [
         "string",
         "null"
        ]
       },
       "stdout_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "stderr_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "check_sandbox": {
        "type": [
         "string",
         "null"
        ]
       },
       "check_run": {
        "type": [
         "integer",
         "null"
        ]
       },
       "logs_run": {
        "type": [
         "integer",
         "null"
        ]
       },
       "runs": {
        "items": {
         "type": "integer"
        },
        "type": "array"
       },
       "kept": {
        "type": "boolean"
       },
       "metrics": {
        "type": [
         "object",
         "null"
        ]
       },
       "policy_ok": {
        "type": [
         "boolean",
         "null"
        ]
       },
       "policy_violations": {
        "items": {
         "type": "object"
        },
        "type": "array"
       },
       "risk": {
        "type": [
         "string",
         "null"
        ]
       },
       "metric": {
        "type": [
         "number",
         "null"
        ]
       },
       "regression": {
        "type": [
         "number",
         "null"
        ]
       },
       "metric_ok": {
        "type": [
         "boolean",
         "null"
        ]
       },
       "node": {
        "type": [
         "string",
         "null"
        ]
       },
       "node_stdout_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "node_stderr_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "rebuilt": {
        "type": [
         "object",
         "null"
        ]
       },
       "index": {
        "type": [
         "integer",
         "null"
        ]
       },
       "state": {
        "type": [
         "string",
         "null"
        ]
       },
       "last_line": {
        "type": [
         "string",
         "null"
        ]
       },
       "last_stream": {
        "type": [
         "string",
         "null"
        ]
       }
      },
      "required": [
       "candidate",
       "kind"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "winner": {
     "type": [
      "string",
      "null"
     ]
    },
    "winner_candidate": {
     "type": [
      "string",
      "null"
     ]
    },
    "conflicts": {
     "items": {},
     "type": "array"
    },
    "duration_s": {
     "type": [
      "number",
      "null"
     ]
    },
    "jobs": {
     "type": [
      "integer",
      "null"
     ]
    },
    "seccomp": {
     "type": [
      "string",
      "null"
     ]
    },
    "metric_spec": {
     "type": [
      "object",
      "null"
     ]
    },
    "base_metric": {
     "type": [
      "number",
      "null"
     ]
    },
    "base_metric_cached": {
     "type": [
      "boolean",
      "null"
     ]
    },
    "warnings": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "cluster": {
     "type": [
      "object",
      "null"
     ]
    },
    "winner_path": {
     "type": [
      "string",
      "null"
     ]
    },
    "stale": {
     "type": [
      "object",
      "null"
     ]
    },
    "winner_label": {
     "type": [
      "string",
      "null"
     ]
    },
    "promotion": {
     "type": [
      "object",
      "null"
     ]
    },
    "promotion_error": {
     "type": [
      "string",
      "null"
     ]
    },
    "promotion_exit_code": {
     "type": [
      "integer",
      "null"
     ]
    },
    "state": {
     "type": [
      "string",
      "null"
     ]
    },
    "started_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "finished_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "pid": {
     "type": [
      "integer",
      "null"
     ]
    },
    "error": {
     "type": [
      "string",
      "null"
     ]
    },
    "done": {
     "type": "boolean"
    }
   },
   "required": [
    "schema",
    "race",
    "done"
   ]
  }
 },
 "race_status": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "race": {
     "type": "string"
    },
    "wait_s": {
     "default": 20.0,
     "maximum": 25.0,
     "minimum": 0,
     "type": "number"
    }
   },
   "required": [
    "race"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "race": {
     "type": [
      "string",
      "null"
     ]
    },
    "base": {
     "type": [
      "string",
      "null"
     ]
    },
    "check": {
     "type": [
      "string",
      "null"
     ]
    },
    "candidates": {
     "items": {
      "properties": {
       "candidate": {
        "type": "string"
       },
       "kind": {
        "type": "string"
       },
       "sandbox": {
        "type": [
         "string",
         "null"
        ]
       },
       "applied": {},
       "exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "duration_s": {
        "type": [
         "number",
         "null"
        ]
       },
       "killed_by": {
        "type": [
         "string",
         "null"
        ]
       },
       "files_changed": {},
       "lines_added": {},
       "lines_removed": {},
       "rank": {},
       "passed": {
        "type": "boolean"
       },
       "changed_nothing": {
        "type": "boolean"
       },
       "apply_exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "apply_error": {
        "type": [
         "string",
         "null"
        ]
       },
       "error": {
        "type": [
         "string",
         "null"
        ]
       },
       "stdout_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "stderr_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "check_sandbox": {
        "type": [
         "string",
         "null"
        ]
       },
       "check_run": {
        "type": [
         "integer",
         "null"
        ]
       },
       "logs_run": {
        "type": [
         "integer",
         "null"
        ]
       },
       "runs": {
        "items": {
         "type": "integer"
        },
        "type": "array"
       },
       "kept": {
        "type": "boolean"
       },
       "metrics": {
        "type": [
         "object",
         "null"
        ]
       },
       "policy_ok": {
        "type": [
         "boolean",
         "null"
        ]
       },
       "policy_violations": {
        "items": {
         "type": "object"
        },
        "type": "array"
       },
       "risk": {
        "type": [
         "string",
         "null"
        ]
       },
       "metric": {
        "type": [
         "number",
         "null"
        ]
       },
       "regression": {
        "type": [
         "number",
         "null"
        ]
       },
       "metric_ok": {
        "type": [
         "boolean",
         "null"
        ]
       },
       "node": {
        "type": [
         "string",
         "null"
        ]
       },
       "node_stdout_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "node_stderr_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "rebuilt": {
        "type": [
         "object",
         "null"
        ]
       },
       "index": {
        "type": [
         "integer",
         "null"
        ]
       },
       "state": {
        "type": [
         "string",
         "null"
        ]
       },
       "last_line": {
        "type": [
         "string",
         "null"
        ]
       },
       "last_stream": {
        "type": [
         "string",
         "null"
        ]
       }
      },
      "required": [
       "candidate",
       "kind"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "winner": {
     "type": [
      "string",
      "null"
     ]
    },
    "winner_candidate": {
     "type": [
      "string",
      "null"
     ]
    },
    "conflicts": {
     "items": {},
     "type": "array"
    },
    "duration_s": {
     "type": [
      "number",
      "null"
     ]
    },
    "jobs": {
     "type": [
      "integer",
      "null"
     ]
    },
    "seccomp": {
     "type": [
      "string",
      "null"
     ]
    },
    "metric_spec": {
     "type": [
      "object",
      "null"
     ]
    },
    "base_metric": {
     "type": [
      "number",
      "null"
     ]
    },
    "base_metric_cached": {
     "type": [
      "boolean",
      "null"
     ]
    },
    "warnings": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "cluster": {
     "type": [
      "object",
      "null"
     ]
    },
    "winner_path": {
     "type": [
      "string",
      "null"
     ]
    },
    "stale": {
     "type": [
      "object",
      "null"
     ]
    },
    "winner_label": {
     "type": [
      "string",
      "null"
     ]
    },
    "promotion": {
     "type": [
      "object",
      "null"
     ]
    },
    "promotion_error": {
     "type": [
      "string",
      "null"
     ]
    },
    "promotion_exit_code": {
     "type": [
      "integer",
      "null"
     ]
    },
    "state": {
     "type": [
      "string",
      "null"
     ]
    },
    "started_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "finished_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "pid": {
     "type": [
      "integer",
      "null"
     ]
    },
    "error": {
     "type": [
      "string",
      "null"
     ]
    },
    "done": {
     "type": "boolean"
    }
   },
   "required": [
    "schema",
    "race",
    "done"
   ]
  }
 },
 "sandbox_remove": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "ids": {
     "items": {
      "type": "string"
     },
     "minItems": 1,
     "type": "array"
    }
   },
   "required": [
    "ids"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "removed": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "reaped": {
     "type": "object"
    },
    "reclaimed_bytes": {
     "type": [
      "integer",
      "null"
     ]
    },
    "pruned_promotions": {
     "items": {},
     "type": "array"
    },
    "pruned_sandboxes": {
     "items": {},
     "type": "array"
    }
   },
   "required": [
    "schema"
   ]
  }
 },
 "sandbox_service_start": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "command": {
     "minLength": 1,
     "type": "string"
    },
    "argv": {
     "items": {
      "type": "string"
     },
     "minItems": 1,
     "type": "array"
    },
    "name": {
     "type": "string",
     "description": "its name (default: the command's)"
    },
    "restart": {
     "default": "no",
     "enum": [
      "no",
      "on-failure"
     ],
     "type": "string"
    },
    "env": {
     "additionalProperties": {
      "type": "string"
     },
     "type": "object"
    }
   },
   "required": [
    "sandbox"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "type": "integer"
    },
    "sandbox": {
     "type": "string"
    },
    "name": {
     "type": "string"
    },
    "command": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "state": {
     "type": "string"
    },
    "pid": {
     "type": [
      "integer",
      "null"
     ]
    },
    "started_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "exit_code": {
     "type": [
      "integer",
      "null"
     ]
    },
    "restarts": {
     "type": "integer"
    },
    "ports": {
     "items": {
      "type": "integer"
     },
     "type": "array"
    },
    "stopped": {
     "type": "boolean"
    }
   },
   "required": [
    "sandbox",
    "name",
    "state"
   ]
  }
 },
 "sandbox_service_list": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    }
   },
   "type": "object",
   "required": []
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "type": "integer"
    },
    "services": {
     "items": {
      "properties": {
       "sandbox": {
        "type": "string"
       },
       "name": {
        "type": "string"
       },
       "command": {
        "items": {
         "type": "string"
        },
        "type": "array"
       },
       "state": {
        "type": "string"
       },
       "pid": {
        "type": [
         "integer",
         "null"
        ]
       },
       "started_at": {
        "type": [
         "string",
         "null"
        ]
       },
       "exit_code": {
        "type": [
         "integer",
         "null"
        ]
       },
       "restarts": {
        "type": "integer"
       },
       "ports": {
        "items": {
         "type": "integer"
        },
        "type": "array"
       }
      },
      "required": [
       "sandbox",
       "name",
       "command",
       "state",
       "pid",
       "started_at",
       "exit_code",
       "restarts",
       "ports"
      ],
      "type": "object"
     },
     "type": "array"
    }
   },
   "required": [
    "services"
   ]
  }
 },
 "sandbox_service_stop": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "name": {
     "type": "string"
    }
   },
   "required": [
    "sandbox",
    "name"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "type": "integer"
    },
    "sandbox": {
     "type": "string"
    },
    "name": {
     "type": "string"
    },
    "command": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "state": {
     "type": "string"
    },
    "pid": {
     "type": [
      "integer",
      "null"
     ]
    },
    "started_at": {
     "type": [
      "string",
      "null"
     ]
    },
    "exit_code": {
     "type": [
      "integer",
      "null"
     ]
    },
    "restarts": {
     "type": "integer"
    },
    "ports": {
     "items": {
      "type": "integer"
     },
     "type": "array"
    },
    "stopped": {
     "type": "boolean"
    }
   },
   "required": [
    "sandbox",
    "name",
    "state"
   ]
  }
 },
 "sandbox_port": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "port": {
     "maximum": 65535,
     "minimum": 1,
     "type": "integer"
    },
    "host_port": {
     "maximum": 65535,
     "minimum": 1,
     "type": "integer",
     "description": "default: the same number when free"
    }
   },
   "required": [
    "sandbox",
    "port"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "type": "integer"
    },
    "sandbox": {
     "type": "string"
    },
    "port": {
     "type": "integer"
    },
    "host_port": {
     "type": "integer"
    }
   },
   "required": [
    "sandbox",
    "port",
    "host_port"
   ]
  }
 },
 "try": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "ttl": {
     "type": [
      "string",
      "number"
     ],
     "description": "lifetime, e.g. 30m, 2h (seconds if a number)"
    },
    "mem": {
     "type": [
      "string",
      "integer"
     ],
     "description": "memory limit, e.g. 512M"
    },
    "cpus": {
     "type": [
      "string",
      "number"
     ],
     "description": "CPU quota, e.g. 0.5"
    },
    "pids": {
     "minimum": 1,
     "type": "integer",
     "description": "max processes"
    },
    "disk": {
     "type": [
      "string",
      "integer"
     ],
     "description": "disk budget, e.g. 1G"
    },
    "net": {
     "type": [
      "boolean",
      "string"
     ],
     "default": false,
     "description": "true: the host's network; \"allow:HOST[:PORT],...\": only those destinations, through a filtering proxy (HTTP_PROXY/HTTPS_PROXY inside); default off"
    },
    "profile": {
     "type": "string",
     "description": "a [profiles.NAME] of the config: its limits, network, seccomp, env, secrets and policy (the arguments above win over it)"
    },
    "command": {
     "description": "the shell command to try",
     "minLength": 1,
     "type": "string"
    },
    "check": {
     "minLength": 1,
     "type": "string",
     "description": "a shell command that must pass on the result"
    },
    "promote": {
     "default": false,
     "description": "promote when command and check passed (needs --allow-live)",
     "type": "boolean"
    },
    "keep": {
     "default": false,
     "description": "keep the sandbox (its id is in the result)",
     "type": "boolean"
    },
    "label": {
     "type": "string"
    },
    "timeout_s": {
     "type": [
      "number",
      "string"
     ],
     "default": 120.0,
     "description": "kill the command (and the check) after this long"
    },
    "include_ignored": {
     "default": false,
     "description": "also files .gitignore ignores",
     "type": "boolean"
    },
    "system": {
     "default": false,
     "description": "a writable layer over the host's /usr, /etc, /var, /opt: what the command changes there is reported (system), never promoted; root only",
     "type": "boolean"
    },
    "max_patch_bytes": {
     "default": 262144,
     "minimum": 0,
     "type": "integer"
    }
   },
   "required": [
    "command"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "sandbox": {
     "type": [
      "string",
      "null"
     ]
    },
    "base": {
     "type": [
      "string",
      "null"
     ]
    },
    "command": {
     "type": [
      "object",
      "null"
     ]
    },
    "check": {
     "type": [
      "object",
      "null"
     ]
    },
    "files": {
     "items": {},
     "type": "array"
    },
    "patch": {
     "type": "string"
    },
    "outcome": {
     "type": [
      "string",
      "null"
     ]
    },
    "promoted": {
     "type": "boolean"
    },
    "promotion": {
     "type": [
      "object",
      "null"
     ]
    },
    "kept": {
     "type": "boolean"
    },
    "patch_b64": {
     "type": [
      "string",
      "null"
     ]
    },
    "system": {
     "anyOf": [
      {
       "items": {},
       "type": "array"
      },
      {
       "type": "null"
      }
     ]
    },
    "policy": {
     "items": {},
     "type": "array"
    },
    "error": {
     "type": [
      "string",
      "null"
     ]
    },
    "exit_code": {
     "type": "integer"
    }
   },
   "required": [
    "schema",
    "sandbox"
   ]
  }
 },
 "review": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "max_patch_bytes": {
     "default": 262144,
     "minimum": 0,
     "type": "integer"
    }
   },
   "required": [
    "sandbox"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "sandbox": {
     "type": "string"
    },
    "label": {
     "type": [
      "string",
      "null"
     ]
    },
    "state": {
     "type": [
      "string",
      "null"
     ]
    },
    "base": {
     "type": [
      "string",
      "null"
     ]
    },
    "files": {
     "items": {
      "properties": {
       "path": {
        "type": "string"
       },
       "status": {
        "type": "string"
       },
       "old_path": {
        "type": [
         "string",
         "null"
        ]
       },
       "binary": {
        "type": "boolean"
       },
       "lines_added": {
        "type": "integer"
       },
       "lines_removed": {
        "type": "integer"
       },
       "old_mode": {
        "type": [
         "string",
         "null"
        ]
       },
       "new_mode": {
        "type": [
         "string",
         "null"
        ]
       },
       "path_b64": {
        "type": [
         "string",
         "null"
        ]
       },
       "old_path_b64": {
        "type": [
         "string",
         "null"
        ]
       }
      },
      "required": [
       "path",
       "status"
      ],
      "type": "object"
     },
     "type": "array"
    },
    "stat": {
     "type": "string"
    },
    "patch": {
     "type": "string"
    },
    "lines_added": {
     "type": "integer"
    },
    "lines_removed": {
     "type": "integer"
    },
    "checks": {
     "items": {},
     "type": "array"
    },
    "stale": {
     "type": [
      "object",
      "null"
     ]
    },
    "policy": {
     "items": {},
     "type": "array"
    },
    "risk": {
     "type": [
      "string",
      "null"
     ]
    },
    "risk_requires": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "policy_ok": {
     "type": [
      "boolean",
      "null"
     ]
    },
    "lineage": {
     "type": [
      "object",
      "null"
     ]
    },
    "pending_gate": {
     "type": [
      "object",
      "null"
     ]
    },
    "rejected": {
     "type": [
      "object",
      "null"
     ]
    },
    "approve": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "reject": {
     "items": {
      "type": "string"
     },
     "type": "array"
    }
   },
   "required": [
    "schema",
    "sandbox"
   ]
  }
 },
 "reject": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "reason": {
     "description": "why it is rejected",
     "minLength": 1,
     "type": "string"
    },
    "keep": {
     "default": false,
     "description": "keep the sandbox (default: destroy it)",
     "type": "boolean"
    }
   },
   "required": [
    "sandbox",
    "reason"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "sandbox": {
     "type": "string"
    },
    "reason": {
     "type": "string"
    },
    "kept": {
     "type": "boolean"
    },
    "destroyed": {
     "type": "boolean"
    },
    "closed": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "rejected_at": {
     "type": [
      "string",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "sandbox",
    "reason"
   ]
  }
 },
 "promote": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "sandbox": {
     "description": "sandbox id (sb-…), unique prefix, or label",
     "type": "string"
    },
    "paths": {
     "default": [],
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "dry_run": {
     "default": false,
     "type": "boolean"
    },
    "on_conflict": {
     "enum": [
      "fail",
      "markers",
      "theirs",
      "ours"
     ],
     "type": "string",
     "default": "fail"
    },
    "verify": {
     "type": "string",
     "description": "a check run on the result; undone if it fails"
    },
    "include_ignored": {
     "default": false,
     "type": "boolean"
    },
    "override_policy": {
     "minLength": 1,
     "type": "string",
     "description": "promote although the config's [policy] stops it: the reason, recorded in the audit trail (ask the user first)"
    },
    "watch": {
     "minLength": 1,
     "type": "string",
     "description": "after the promotion, run this shell command against live every `every` for `for`; its first failure rolls the promotion back"
    },
    "for": {
     "type": [
      "number",
      "string"
     ],
     "description": "how long watch watches: seconds, or 10m, 1h (needed with watch)"
    },
    "every": {
     "type": [
      "number",
      "string"
     ],
     "description": "how often watch checks (default 30s)"
    },
    "metric": {
     "minLength": 1,
     "type": "string",
     "description": "FILE:KEY (append :max when higher is better): the number verify leaves in the JSON object at FILE (needs verify)"
    },
    "max_regression": {
     "minLength": 1,
     "type": "string",
     "description": "with metric, e.g. \"10%\": verify runs on live as it was before the promotion too (cached per base); a metric worse by more undoes the promotion"
    }
   },
   "required": [
    "sandbox"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "promotion": {
     "type": [
      "string",
      "null"
     ]
    },
    "sandbox": {
     "type": [
      "string",
      "null"
     ]
    },
    "base": {
     "type": [
      "string",
      "null"
     ]
    },
    "applied": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "conflicts": {
     "items": {},
     "type": "array"
    },
    "verified": {
     "type": [
      "boolean",
      "null"
     ]
    },
    "rolled_back": {
     "type": "boolean"
    },
    "plan": {
     "type": [
      "object",
      "null"
     ]
    },
    "applied_b64": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "skipped": {
     "items": {},
     "type": "array"
    },
    "markers": {
     "type": "boolean"
    },
    "already_in_live": {
     "type": [
      "integer",
      "null"
     ]
    },
    "dry_run": {
     "type": "boolean"
    },
    "policy": {
     "items": {},
     "type": "array"
    },
    "risk": {
     "type": [
      "string",
      "null"
     ]
    },
    "risk_requires": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "policy_overridden": {
     "type": [
      "object",
      "null"
     ]
    },
    "metric_base": {
     "type": [
      "string",
      "null"
     ]
    },
    "duration_s": {
     "type": [
      "number",
      "null"
     ]
    },
    "already_promoted": {
     "type": [
      "object",
      "null"
     ]
    },
    "metric_spec": {
     "type": [
      "object",
      "null"
     ]
    },
    "verify": {
     "type": [
      "object",
      "null"
     ]
    },
    "metric": {
     "type": [
      "number",
      "null"
     ]
    },
    "base_metric": {
     "type": [
      "number",
      "null"
     ]
    },
    "base_metric_cached": {
     "type": [
      "boolean",
      "null"
     ]
    },
    "regression": {
     "type": [
      "number",
      "null"
     ]
    },
    "metric_ok": {
     "type": [
      "boolean",
      "null"
     ]
    },
    "warnings": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "rollback_error": {
     "type": [
      "string",
      "null"
     ]
    },
    "watch": {
     "type": [
      "object",
      "null"
     ]
    },
    "unchanged": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "system_not_promoted": {
     "type": [
      "integer",
      "null"
     ]
    }
   },
   "required": [
    "schema",
    "promotion"
   ]
  }
 },
 "rollback": {
  "inputSchema": {
   "additionalProperties": false,
   "properties": {
    "id": {
     "description": "p-… promotion or s-… snapshot",
     "type": "string"
    }
   },
   "required": [
    "id"
   ],
   "type": "object"
  },
  "outputSchema": {
   "type": "object",
   "properties": {
    "schema": {
     "const": 1,
     "type": "integer"
    },
    "restored": {
     "type": "string"
    },
    "kind": {
     "type": "string"
    },
    "changed": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "changed_b64": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "safety_snapshot": {
     "type": [
      "string",
      "null"
     ]
    },
    "left_alone": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "stages_undone": {
     "items": {
      "type": "string"
     },
     "type": "array"
    },
    "stages": {
     "items": {},
     "type": "array"
    },
    "pipeline": {
     "type": [
      "string",
      "null"
     ]
    },
    "dry_run": {
     "type": "boolean"
    },
    "blocked": {
     "items": {
      "type": "string"
     },
     "type": "array"
    }
   },
   "required": [
    "schema",
    "restored",
    "kind"
   ]
  }
 }
}
""")
