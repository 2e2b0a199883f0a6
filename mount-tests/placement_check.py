#!/usr/bin/env python3
"""FILE --on ADDR | FILE --copies N: every chunk of FILE has a copy on the server at ADDR, or
exactly N copies (its placement attribute says so). Exits non-zero naming the chunks that do
not.
"""
import json, os, sys
path, how, want = sys.argv[1:4]
p = json.loads(os.getxattr(path, "user.rmemfs.placement"))
if how == "--on":
    bad = [c for c in p if want not in c[1]]
    sys.exit(f"chunks without a copy on {want}: {bad}" if bad else 0)
bad = [c for c in p if len(c[1]) != int(want)]
sys.exit(f"chunks with another count: {bad}" if bad else 0)
