#!/usr/bin/env python3
"""EXPR: prints EXPR, a Python expression over `s` (the JSON read from stdin): how the tests
read a figure of `rmemfs stats --json` (lib.sh's stats_field and server_field).
"""
import json, sys
s = json.load(sys.stdin)
print(eval(sys.argv[1], {"s": s}))
