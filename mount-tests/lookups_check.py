#!/usr/bin/env python3
"""BEFORE AFTER ENTRIES: between two `stats --json` reports (around an `ls -lR` of ENTRIES
entries with cold caches), the names came with READDIRPLUS, not a LOOKUP per entry.
"""
import json, sys
b, a = (json.loads(x)["requests"] for x in sys.argv[1:3])
delta = lambda op: a.get(op, {"count": 0})["count"] - b.get(op, {"count": 0})["count"]
entries = int(sys.argv[3])
print(f"ls -lR of {entries} entries: {delta('readdirplus')} readdirplus, {delta('lookup')} lookups",
      file=sys.stderr)
sys.exit(0 if delta("readdirplus") > 0 and delta("lookup") < entries / 2 else 1)
